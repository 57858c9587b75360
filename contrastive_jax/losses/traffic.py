"""Bytes a device receives per step under each sharding strategy: the formula and the HLO.

Per device, with ``n = N / D`` rows of ``d`` float32 values (a chunk is ``n`` rows for
CLIP, ``2n`` rows, both views, for NT-Xent). The exact CLIP strategies send only ``y`` chunks
(one pass gives both directions; see ``clip_one_pass`` in
:mod:`contrastive_jax.losses.collective_vjp`):
``all_gather`` ``2 (D - 1)`` chunks, ``ring`` ``3D - 2`` chunks, plus O(n) statistics per hop.
Otherwise (NT-Xent; CLIP without gradient through the gather, per direction):

- ``all_gather``: the gather, ``(D - 1)`` chunks in, and the reduce-scatter of the gathered
  gradient, ``(D - 1)`` chunks: ``2 (D - 1)`` chunks.
- ``all_gather_no_grad``: the gather only, ``(D - 1)`` chunks.
- ``ring``: ``D - 1`` hops of the chunk forward, ``D - 1`` hops of the chunk and its gradient
  accumulator backward, and one last hop that brings the accumulator home: ``3D - 2`` chunks.
  The ring trades ~1.5x the traffic of the gather for O(n d) instead of O(N d) memory.

:func:`collective_bytes` counts the same from a compiled program's HLO text (every all-gather,
reduce-scatter and collective-permute, times the trip counts of the loops around it), so the
formula is checked against what XLA will actually send (``tests/test_sharding.py``,
``benchmarks/sharded_bench.py``).
"""

from __future__ import annotations

import re

from contrastive_jax.errors import InputError


def expected_bytes(loss: str, strategy: str, n_total: int, devices: int, d: int) -> float:
    """Bytes received per device per step; ``n_total`` rows of each input (CLIP ``x``, or one
    NT-Xent view), float32, CLIP with both directions. All-reduces (of O(N) statistics and of
    scalars) are not counted, here or in :func:`collective_bytes`."""
    n = n_total // devices
    hops = devices - 1
    if loss == "clip" and strategy != "all_gather_no_grad":  # one pass for both directions
        if strategy == "all_gather":  # y rows in, their gradient home, the positives' cosines
            floats = hops * n * d + hops * n * d + hops * n
        else:  # ring: chunk + column statistics (2 per column) round and home; backward: chunk,
            # gradient, column weights (2) and positive cosine round, the gradient home
            floats = hops * (n * d + 2 * n) + 2 * n + hops * (2 * n * d + 3 * n) + n * d
        return 4 * floats
    rows = n if loss == "clip" else 2 * n
    directions = 2 if loss == "clip" else 1
    chunk = rows * d * 4
    per_direction = {"all_gather": 2 * hops * chunk,
                     "all_gather_no_grad": hops * chunk,
                     "ring": (2 * hops + hops + 1) * chunk}[strategy]
    return directions * per_direction


_SHAPE = re.compile(r"(f32|bf16|f64)\[([\d,]*)\]")
_BYTES = {"f32": 4, "bf16": 2, "f64": 8}


def _shape_bytes(text: str) -> int:
    m = _SHAPE.search(text)
    if not m:
        return 0
    dims = [int(x) for x in m.group(2).split(",") if x]
    size = 1
    for x in dims:
        size *= x
    return size * _BYTES[m.group(1)]


def collective_bytes(hlo: str, devices: int) -> float:
    """Bytes a device receives per step, counted from the compiled (per-device) HLO text.

    All-gather: ``(D - 1) / D`` of its result; reduce-scatter: ``D - 1`` times its result
    (one shard from each other device); collective-permute: its result. Each is multiplied by
    the ``known_trip_count`` of every while loop around it (a loop without one is an error).
    """
    computations: dict[str, list[str]] = {}
    current = None
    for line in hlo.splitlines():
        head = re.match(r"^(ENTRY )?%?([\w.\-]+) .*\{$", line)
        if head:
            current = "ENTRY" if head.group(1) else head.group(2)
            computations[current] = []
        elif current is not None:
            computations[current].append(line)
    callers: dict[str, list[tuple[str, int]]] = {}
    for name, lines in computations.items():
        for line in lines:
            if " while(" in line:
                body = re.search(r"body=%?([\w.\-]+)", line).group(1)
                trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
                if trips is None:
                    raise InputError(f"no known trip count for while loop {body}")
                callers.setdefault(body, []).append((name, int(trips.group(1))))
            for called in re.findall(r"(?:to_apply|calls)=%?([\w.\-]+)", line):
                callers.setdefault(called, []).append((name, 1))

    def multiplicity(name: str, depth: int = 0) -> int:
        if name == "ENTRY" or depth > 50:
            return 1
        return sum(t * multiplicity(c, depth + 1) for c, t in callers.get(name, []))

    total = 0.0
    for name, lines in computations.items():
        for line in lines:
            op = re.search(r"= [^=]*? (all-gather|reduce-scatter|collective-permute)"
                           r"(-start)?\(", line)
            if not op:
                continue
            kind = op.group(1)
            if kind == "all-gather":  # the result is the gathered array
                size = _shape_bytes(line.split("=", 1)[1]) * (devices - 1) / devices
            elif kind == "reduce-scatter":  # the result is one of D shards of the operand
                size = _shape_bytes(line.split("=", 1)[1]) * (devices - 1)
            else:
                size = _shape_bytes(line.split("=", 1)[1])
            total += size * multiplicity(name)
    return total


# Per-device scratch of the ring, in copies of the chunk in flight (``n`` rows for a CLIP
# direction, ``2n`` for NT-Xent): the chunk and its gradient accumulator travelling backward,
# each double-buffered by the collective-permute (4), the anchors' gradient (1), and for
# NT-Xent the stacked views [z1; z2] (1). Plus the (b, b) tiles of the tiled pass.
RING_CHUNKS = {"clip": 6, "nt_xent": 6}
RING_TILES = 8


def ring_memory_bound(loss: str, n_total: int, devices: int, d: int, block: int) -> int:
    """Bytes of per-device scratch the ring strategy needs at most: O((N / D) d + b^2)."""
    n = n_total // devices
    chunk = (n if loss == "clip" else 2 * n) * d
    b = min(block, n if loss == "clip" else 2 * n)
    return 4 * (RING_CHUNKS[loss] * chunk + RING_TILES * b * b)
