"""Bytes a device receives per step under each sharding strategy: the formula and the HLO.

Per device, with ``n = N / D`` rows of ``d`` float32 values. What travels
(:mod:`contrastive_jax.losses.tiling.row_exchange`): a *chunk* is a device's rows of one input with
their norms and ids (``n d + 2 n`` numbers; NT-Xent sends both views, two chunks); the backward pass
sends each chunk again with its anchors' *weights*; the accumulators that come home
are column *statistics* (``4 n``, forward) and *gradients* (``n d``, backward). Weights are
``3 n`` (a remote chunk holds no positive of this device's rows) unless the positives are given
by ids. With
``hops = D - 1``:

- ``all_gather``: the chunks gathered once (XLA reuses the forward's gather in the backward)
  with their anchors' weights, and the gradients reduce-scattered home; the column statistics
  come home by an all-reduce (O(N), not counted);
- ``ring``: ``hops`` hops of the chunk with its accumulator, then the accumulator's last hop
  home, forward and backward;
- ``all_gather_no_grad``: each direction's candidates gathered once; nothing comes home;
- NT-Xent's exact strategies meet each pair of devices once: on the ring, ``D // 2`` hops with
  the chunks, the accumulators alone the rest of the way home;
- SigLIP computes its value and gradient in one sweep: the chunks travel once, with the
  gradient accumulators.

:func:`collective_bytes` counts the same from a compiled program's HLO text (every all-gather,
reduce-scatter and collective-permute, times the trip counts of the loops around it), so the
formula is checked against what XLA will actually send (``tests/test_sharding.py``,
``benchmarks/sharded_bench.py``). A measurement tool, not part of the library: it lives with the
benchmarks (the tests put ``benchmarks/`` on the import path).
"""

from __future__ import annotations

import re

from contrastive_jax.errors import InputError


def expected_bytes(loss: str, strategy: str, n_total: int, devices: int, d: int,
                   direction: str = "both", by_id: bool = False) -> float:
    """Bytes received per device per ``value_and_grad`` step; ``n_total`` rows of each input
    (CLIP ``x``, one NT-Xent view, SigLIP ``x``), float32. All-reduces (of O(N) statistics and
    of scalars) are not counted, here or in :func:`collective_bytes`. ``by_id``: positives
    given by ids, which can be anywhere, so the weights of the positives travel too."""
    n, hops = n_total // devices, devices - 1
    weights = 5 * n if by_id else 3 * n  # the negatives' shift and weight, the reference
    rows, ids, stats, grad = n * d + n, n, 4 * n, n * d  # rows: with their norms
    views = 2 if loss == "nt_xent" else 1
    columns = loss == "nt_xent" or (loss == "clip" and direction != "x_to_y")
    if loss == "siglip":  # value and gradient in one sweep: the chunks once, gradients home
        if strategy == "all_gather":
            return 4.0 * hops * (rows + ids + grad)
        return 4.0 * (hops * (rows + ids + grad) + grad)
    if strategy == "all_gather_no_grad":  # each direction's candidates, gathered once
        inputs = 2 if loss == "nt_xent" or direction == "both" else 1
        return 4.0 * hops * (inputs * rows + ids)
    if strategy == "all_gather":  # gathered once (the backward reuses them), gradients home
        return 4.0 * hops * (views * rows + ids + columns * views * weights + views * grad)
    # ring: the chunk (rows and ids) and its accumulator hop by hop, then the accumulator home
    chunk = rows + ids
    if loss == "nt_xent":  # each pair of devices once: half the hops carry the chunks
        half = devices // 2
        return 8.0 * (half * (chunk + stats) + (devices - half) * stats
                      + half * (chunk + weights + grad) + (devices - half) * grad)
    forward = hops * (chunk + stats) + stats if columns else hops * chunk
    return 4.0 * (forward + hops * (chunk + columns * weights + grad) + grad)


_SHAPE = re.compile(r"\b(f32|bf16|f64|s32|u32|s64|pred)\[([\d,]*)\]")
_BYTES = {"f32": 4, "bf16": 2, "f64": 8, "s32": 4, "u32": 4, "s64": 8, "pred": 1}


def _shape_bytes(text: str) -> int:
    """Bytes of every array in an HLO result type (a tuple's elements summed)."""
    total = 0
    for kind, dims in _SHAPE.findall(text):
        size = 1
        for x in dims.split(","):
            size *= int(x) if x else 1
        total += size * _BYTES[kind]
    return total


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
            result = line.split("=", 1)[1][:op.start(1) - len(line.split("=", 1)[0]) - 1]
            if kind == "all-gather":  # the result is the gathered array
                size = _shape_bytes(result) * (devices - 1) / devices
            elif kind == "reduce-scatter":  # the result is one of D shards of the operand
                size = _shape_bytes(result) * (devices - 1)
            else:
                size = _shape_bytes(result)
            total += size * multiplicity(name)
    return total


# Per-device scratch of the ring, in copies of one input's rows on a device (``n d`` floats):
# the chunk in flight and its gradient accumulator backward, each double-buffered by the
# collective-permute, and the anchors' gradient; NT-Xent carries both views. Plus the tiles.
RING_CHUNKS = {"clip": 6, "siglip": 6, "nt_xent": 12}
RING_TILES = 8


def ring_memory_bound(loss: str, n_total: int, devices: int, d: int, block: int) -> int:
    """Bytes of per-device scratch the ring strategy needs at most: O((N / D) d + b^2)."""
    n = n_total // devices
    b = min(block, n)
    return 4 * (RING_CHUNKS[loss] * n * d + RING_TILES * b * b)
