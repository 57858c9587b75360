"""Scanned layers: a tower's Transformer blocks as one module whose parameters carry a leading
layer axis, run by one ``lax.scan`` (``model.<tower>.scan = True``, the default of the ViT and
the text tower).

Python-unrolled blocks put every block's program into the compiled step, so compile time and
HLO size grow with depth (about 2,000 optimised HLO lines a block); under ``lax.scan`` the
step holds one block's program whatever the depth ([MaxText]'s ``scan_layers``, big_vision's
ViT ``scan`` option; benchmarks/compile_bench.py measures both).

The two layouts of the same parameters (paths as :func:`~contrastive_jax.training.
parameter_paths.path_name` writes them)::

    unrolled   <tower>/blocks/<i>/<name>     one leaf of shape S per block i = 0 .. depth - 1
    scanned    <tower>/blocks/<name>         one leaf of shape (depth, *S); row i is block i

A scanned tower is built from the same blocks an unrolled one builds, drawn from the same
random stream in the same order, then stacked (:func:`stacked`): one seed gives the same
parameters in either layout. Block ``i`` folds ``i`` into the dropout keys in both (the scan
carries the index), and each block is rematerialised on its own inside the scan (remat.py).
So the two layouts compute the same function with the same randomness, and
:func:`to_layout` moves parameters, optimiser state, checkpoints and converted weights from
one to the other (tests/test_scanned_layers.py: loss, gradients and AdamW update equal in
float64). FSDP never splits the layer axis of a stacked leaf (:func:`is_stacked`; the
scan reads one row per block).

References:
  [MaxText] and [BigVision] in docs/references.md.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models.remat import check_policy

# a leaf of one block in the unrolled layout: ".../blocks/<i>/<name>"
_PER_BLOCK = re.compile(r"^(?P<stack>(?:.+/)?blocks)/(?P<index>\d+)/(?P<name>.+)$")
# a leaf of a stack in the scanned layout: ".../blocks/<name>", <name> not starting with an index
_STACKED = re.compile(r"^(?P<stack>(?:.+/)?blocks)/(?P<name>(?!\d+(?:/|$)).+)$")

# encoders whose Transformer blocks can run as a scan (the rest refuse model.<tower>.scan)
SCANNABLE = ("vit", "text_transformer")


def check_scan(value: Any, encoder: str) -> bool:
    """``value`` if it is a bool, else a :class:`ConfigError` saying what to write."""
    if not isinstance(value, bool):
        raise ConfigError(f"encoder {encoder!r}: scan must be True (one lax.scan over the "
                          f"stacked blocks) or False (unrolled blocks); got {value!r}")
    return value


def stacked(blocks: list[nnx.Module]) -> nnx.Module:
    """One module of the blocks' common type whose every variable is the blocks' variables
    stacked on a new leading axis (``blocks`` must share one graph definition: the same
    sub-modules and shapes)."""
    graphdef = nnx.graphdef(blocks[0])
    states = [nnx.state(block) for block in blocks]
    return nnx.merge(graphdef, jax.tree.map(lambda *xs: jnp.stack(xs), *states))


def depth_of(stack: nnx.Module) -> int:
    """The number of blocks in a :func:`stacked` module (its leading axis)."""
    return int(jax.tree.leaves(nnx.state(stack))[0].shape[0])


def scan_blocks(stack: nnx.Module, apply: Callable[..., jax.Array], h: jax.Array, *,
                policy: str | None) -> jax.Array:
    """``h`` through every block of a :func:`stacked` module with one ``lax.scan``: step
    ``i`` merges row ``i`` of the stacked variables into a block and computes
    ``apply(block, h, i)`` (``i`` an int32 scalar; the block's dropout folds it in).

    ``policy``: each step rematerialised under ``jax.checkpoint_policies.<policy>``
    (:mod:`.remat`), ``None``: not. The blocks' state must not change in the call (no
    BatchNorm in a Transformer block)."""
    graphdef, state = nnx.split(stack)
    carry = _CARRY.get()
    if carry is not None and h.shape[0] % carry.mesh.shape[carry.spec[0]]:
        carry = None  # a batch that does not split over the axis: nothing to keep

    def step(h, layer):
        row, index = layer
        if carry is not None:
            h = jax.lax.with_sharding_constraint(h, carry)
        h = apply(nnx.merge(graphdef, row), h, index)
        return (h if carry is None else jax.lax.with_sharding_constraint(h, carry)), None

    if policy is not None:
        # prevent_cse=False: the scan already keeps the recomputation apart (JAX's
        # jax.checkpoint docs: the recommended setting inside scan)
        step = jax.checkpoint(step, policy=getattr(jax.checkpoint_policies,
                                                   check_policy(policy)), prevent_cse=False)
    h, _ = jax.lax.scan(step, h, (state, jnp.arange(depth_of(stack), dtype=jnp.int32)))
    return h


_CARRY: contextvars.ContextVar = contextvars.ContextVar("scanned_layers_carry", default=None)


@contextlib.contextmanager
def batch_sharded(mesh: jax.sharding.Mesh, axis: str) -> Iterator[None]:
    """While tracing inside it, every scan over blocks keeps its activations ``(B, ...)``
    split over ``axis`` of ``mesh`` on their batch dimension (a sharding constraint on the
    scan's carry), as the unrolled blocks' are.

    Without it XLA's partitioner may take the sharding of the stacked parameters (under FSDP:
    split on a feature dimension over the data axis) into the loop body and replicate the
    batch there: every device then holds the whole global batch's activations (measured on
    the pod template: 292 GiB per chip on 128 chips instead of 8). The step and the
    evaluation programs trace the model inside it; the model itself knows no mesh."""
    token = _CARRY.set(NamedSharding(mesh, PartitionSpec(axis)))
    try:
        yield
    finally:
        _CARRY.reset(token)


# ------------------------------------------------------------------------------- layouts
def is_stacked(name: str) -> bool:
    """Whether the leaf at path ``name`` is a stack of blocks in the scanned layout (its first
    axis is the layer axis): ``.../blocks/<name>`` with no block index after ``blocks``."""
    return _STACKED.match(name) is not None


def layout_of(names: Iterable[str]) -> dict[str, str]:
    """``{".../blocks": "scanned" | "unrolled"}`` for every stack of blocks among the leaf
    paths ``names`` (a ResNet's blocks count as unrolled)."""
    out = {}
    for name in names:
        if (m := _STACKED.match(name)) is not None:
            out[m["stack"]] = "scanned"
        elif (m := _PER_BLOCK.match(name)) is not None:
            out.setdefault(m["stack"], "unrolled")
    return out


def depths(leaves: Mapping[str, Any]) -> dict[str, int]:
    """``{".../blocks": number of blocks}`` of the leaves ``{path: array or shape struct}``
    in either layout."""
    out: dict[str, int] = {}
    for name, leaf in leaves.items():
        if (m := _STACKED.match(name)) is not None:
            out[m["stack"]] = int(leaf.shape[0])
        elif (m := _PER_BLOCK.match(name)) is not None:
            out[m["stack"]] = max(out.get(m["stack"], 0), int(m["index"]) + 1)
    return out


def to_layout(leaves: Mapping[str, Any], like: Iterable[str], *,
              stack: Callable[[list], Any] = np.stack,
              row: Callable[[Any, int], Any] = lambda x, i: x[i]) -> dict[str, Any]:
    """``leaves`` (``{path: value}``) with every stack of blocks in the layout it has among the
    paths ``like``: per-block leaves stacked (``stack([block 0, block 1, ...])``) where
    ``like`` holds the stack, stacked leaves split (``row(leaf, i)``) where ``like`` holds
    the blocks; every other leaf unchanged. A stack is moved whole (all its blocks ``0 ..
    n - 1``, in order); one whose layout already matches, or that ``like`` does not have,
    stays as it is, so a caller's own check of paths and shapes still reports what differs.
    ``stack`` / ``row``: NumPy by default; ``jnp.stack`` for device arrays, or functions on
    shape structs for an abstract target."""
    want = layout_of(like)
    have = layout_of(leaves)
    out: dict[str, Any] = {}
    gathered: dict[tuple[str, str], dict[int, Any]] = {}
    for name, value in leaves.items():
        per_block, whole = _PER_BLOCK.match(name), _STACKED.match(name)
        if per_block is not None and want.get(per_block["stack"]) == "scanned" \
                and have.get(per_block["stack"]) == "unrolled":
            key = (per_block["stack"], per_block["name"])
            gathered.setdefault(key, {})[int(per_block["index"])] = value
        elif whole is not None and want.get(whole["stack"]) == "unrolled":
            count = int(value.shape[0])
            for i in range(count):
                out[f"{whole['stack']}/{i}/{whole['name']}"] = row(value, i)
        else:
            out[name] = value
    for (prefix, name), rows in gathered.items():
        if sorted(rows) != list(range(len(rows))):
            raise ConfigError(f"the blocks of {prefix} are not numbered 0 .. n - 1 for {name!r} "
                              f"(found {sorted(rows)}): a damaged or hand-made parameter tree")
        out[f"{prefix}/{name}"] = stack([rows[i] for i in range(len(rows))])
    return out


def unrolled(leaves: Mapping[str, Any], **functions) -> dict[str, Any]:
    """``leaves`` with every stack of blocks split into its blocks (the unrolled layout, in
    which converters name each block's tensors); ``functions``: :func:`to_layout`'s."""
    like = [f"{m['stack']}/0/{m['name']}" for name in leaves
            if (m := _STACKED.match(name)) is not None]
    return to_layout(leaves, like, **functions)


def _moved_sharding(sharding, spec_of):
    """A leaf's sharding in the other layer layout: a named sharding's spec through
    ``spec_of``; one that places every element on every device it uses (a single device, a
    replicated state) is valid for any shape, so it stays; None stays None."""
    if sharding is None:
        return None
    if isinstance(sharding, jax.sharding.NamedSharding):
        return jax.sharding.NamedSharding(
            sharding.mesh, jax.sharding.PartitionSpec(*spec_of(tuple(sharding.spec))))
    if sharding.is_fully_replicated:
        return sharding
    raise ValueError(f"a leaf placed by a {type(sharding).__name__} that splits it cannot be "
                     "moved into the other layer layout; place the state with NamedShardings")


def abstract_stack(structs: list) -> jax.ShapeDtypeStruct:
    """:func:`to_layout`'s ``stack`` for shape structs: ``(n, *shape)``, the layer axis not
    split (a named sharding gains a leading ``None``; a single-device or replicated one is
    kept)."""
    first = structs[0]
    sharding = _moved_sharding(getattr(first, "sharding", None), lambda spec: (None, *spec))
    return jax.ShapeDtypeStruct((len(structs), *first.shape), first.dtype, sharding=sharding)


def abstract_row(struct: jax.ShapeDtypeStruct, index: int) -> jax.ShapeDtypeStruct:
    """:func:`to_layout`'s ``row`` for a shape struct: ``shape[1:]``, a named sharding's spec
    without its (unsplit) layer axis (a single-device or replicated one is kept)."""
    del index
    rank = len(struct.shape)
    sharding = _moved_sharding(getattr(struct, "sharding", None),
                               lambda spec: (*spec, *(None,) * (rank - len(spec)))[1:])
    return jax.ShapeDtypeStruct(struct.shape[1:], struct.dtype, sharding=sharding)
