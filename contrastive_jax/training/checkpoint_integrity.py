"""Whether a saved checkpoint is intact: the checksums saved with it, the check of what is read
back against them, and a template-free read of a saved item on the host.

Orbax reads changed array bytes without complaint, so each checkpoint also records, per leaf,
two integer sums of the leaf's bits (:func:`state_checksums`, in
``checkpoints/<step>/checksums/metadata``). Integer sums are exact in any order: the numbers
do not depend on how a leaf is sharded or on the mesh it is restored onto, and a flipped byte
changes them (tests/test_reliability.py).

:func:`checksums_mismatch` is the one check of a read-back tree against that record, shared by
every reader: the trainer's restore (the whole state, on the devices:
:mod:`contrastive_jax.training.run.checkpoints`) and the pretrained-source reader behind
``evaluate --model=WORKDIR``, ``load_pretrained``, ``clip_export`` and ``model.init_from``
(its parameters and BatchNorm statistics only, NumPy arrays on the host:
:mod:`contrastive_jax.training.models.converters.pretrained_source`), which sums host arrays
with :func:`host_checksum_record`, the same numbers in NumPy. :func:`read_on_host` reads a
saved item without a template (both of those readers: the restore, to tell a checkpoint whose
files are damaged from one that only failed to fit its template).

A room of its own below ``run/`` and ``models/`` (docs/architecture.md), since both read
checkpoints.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

from contrastive_jax.errors import CheckpointError
from contrastive_jax.training.parameter_paths import leaves_by_path

CHECKSUMS = "checksums"  # the checkpoint item (a folder beside state/ and data/)
CHECKSUMS_FILE = "metadata"  # its JSON file (orbax's JsonCheckpointHandler's default name)


@jax.jit
def state_checksums(state) -> jax.Array:
    """``(leaves, 2)`` uint32: per leaf of ``state``, the sum of its bits read as unsigned words
    and their position-weighted sum ``sum (2 i + 1) w_i``, both mod 2^32 (``i``: the word's
    index in the leaf's row-major order). Integer sums are exact in any order, so the numbers
    do not depend on how the leaf is sharded or on the mesh it is restored onto; a flipped byte
    changes them. Saved with each checkpoint, checked at restore: orbax itself reads damaged
    array bytes without complaint.

    Each device sums what it holds: the word index is built from broadcast iotas over the
    leaf's own shape (never a ``ravel``, which would gather a leaf split on a non-leading
    axis), so XLA's partitioner keeps every product and partial sum on the device holding the
    words and all-reduces two scalars per leaf; the program's temporaries stay within the
    largest shard (tests/test_reliability.py, FSDP on 8 devices). The weights of one shape are
    traced once for all its leaves (a state repeats few shapes many times: the optimizer's
    moments, the layers).
    """
    weights = {}
    return jnp.stack([_leaf_sums(leaf, weights) for leaf in jax.tree.leaves(state)])


def _add_pairs(a, b):
    """The variadic reduction's body: one function, so JAX traces it once, not once a leaf."""
    return a[0] + b[0], a[1] + b[1]


def _word_weights(shape: tuple[int, ...]) -> jax.Array:
    """``2 i + 1`` (uint32, wrapping) for each word of a ``shape`` array, ``i`` its row-major
    index, from broadcast iotas (no ``ravel``: see :func:`state_checksums`)."""
    index = jnp.zeros((), jnp.uint32)
    stride = 1
    for axis in reversed(range(len(shape))):  # row-major position, wrapping mod 2^32
        position = jax.lax.broadcasted_iota(jnp.uint32, shape, axis)
        index = index + position * jnp.uint32(stride % 2**32)
        stride *= shape[axis]
    return 2 * index + 1


def _leaf_sums(leaf, weights: dict) -> jax.Array:
    """``[sum w_i, sum (2 i + 1) w_i]`` (uint32, mod 2^32) of one leaf's words (see
    :func:`state_checksums`); 8-byte values are two words each, in memory order. ``weights``:
    the :func:`_word_weights` traced so far, by shape."""
    x = jnp.asarray(leaf)
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
    words = jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)  # 8 bytes: (..., 2)
    if words.shape not in weights:
        weights[words.shape] = _word_weights(words.shape)
    # one variadic reduction: XLA fuses the words, the iotas and the product into it (two
    # separate sums would keep the shared words of every leaf in memory at once)
    total, weighted = jax.lax.reduce(
        (words, words * weights[words.shape]), (jnp.uint32(0), jnp.uint32(0)), _add_pairs,
        tuple(range(words.ndim)))
    return jnp.stack([total, weighted])


def checksum_record(state) -> dict[str, list[int]]:
    """``{leaf name: [sum, weighted sum]}`` of :func:`state_checksums` (a device sync)."""
    names = list(leaves_by_path(state, drop_value=True))
    return dict(zip(names, jax.device_get(state_checksums(state)).tolist(), strict=True))


_CHUNK = 1 << 22  # words summed at a time on the host (bounded temporaries)


def _host_leaf_sums(leaf) -> list[int]:
    """:func:`_leaf_sums` of one host array in NumPy: the same two numbers, for any dtype
    (float64 included, whatever ``jax_enable_x64`` says), summed in uint64 (which wraps mod
    2^64, so mod 2^32 the sums are exact) a chunk of words at a time."""
    x = np.ascontiguousarray(np.asarray(leaf))
    if x.dtype == np.bool_:
        x = x.astype(np.uint8)
    unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint32}[x.dtype.itemsize]
    words = x.reshape(-1).view(unsigned)  # 8 bytes: two words each, in memory order
    total = weighted = np.uint64(0)
    with np.errstate(over="ignore"):
        for start in range(0, words.size, _CHUNK):
            chunk = words[start:start + _CHUNK].astype(np.uint64)
            index = np.arange(start, start + chunk.size, dtype=np.uint64)
            total += chunk.sum(dtype=np.uint64)
            weighted += ((2 * index + 1) * chunk).sum(dtype=np.uint64)
    return [int(total % 2**32), int(weighted % 2**32)]


def host_checksum_record(tree) -> dict[str, list[int]]:
    """:func:`checksum_record` of a tree of host (NumPy) arrays, computed on the host: the
    same numbers as the devices give, without moving the arrays (or narrowing 64-bit ones)
    through JAX."""
    return {name: _host_leaf_sums(leaf)
            for name, leaf in leaves_by_path(tree, drop_value=True).items()}


class DamagedChecksums(Exception):
    """The checksum record of a checkpoint exists but cannot be read."""


def saved_checksums(step_dir: str | os.PathLike) -> Mapping[str, Any] | None:
    """The checksum record saved with the checkpoint ``step_dir`` (``checkpoints/<step>``),
    or None for a checkpoint saved before checksums existed. :class:`DamagedChecksums` when
    the record is there but unreadable (truncated, not JSON, not a record)."""
    folder = epath.Path(step_dir) / CHECKSUMS
    if not folder.exists():
        return None
    try:
        record = json.loads((folder / CHECKSUMS_FILE).read_text())
    except (OSError, ValueError) as err:
        raise DamagedChecksums(f"{folder}: {err}") from None
    if not isinstance(record, dict) or not isinstance(record.get("leaves", record.get("state")),
                                                      dict | list):
        raise DamagedChecksums(f"{folder} holds no checksum record")
    return record


def checksums_mismatch(step_dir: str | os.PathLike, tree, *, partial: bool = False
                       ) -> str | None:
    """Why ``tree``, read back from the checkpoint ``step_dir`` in the layout it was saved in,
    does not match the checksums saved with it; None when it does (or the checkpoint has none:
    saved before checksums existed).

    ``tree``: the whole train state on the devices (the trainer's restore; summed by
    :func:`state_checksums`), or with ``partial`` some of its top-level entries as host arrays
    (a reader of ``params`` and ``rest`` only; summed by :func:`host_checksum_record`), each
    leaf compared with the number saved under its name. Versions before 0.3 recorded a list in
    the state's tree order (``{"state": [...]}``): the whole state is compared as that list,
    or as a multiset when only the leaf order can differ; a partial tree's sums must each be
    in it.
    """
    try:
        saved = saved_checksums(step_dir)
    except DamagedChecksums as err:
        return f"its checksum record cannot be read ({err})"
    if saved is None:
        return None
    host = partial or all(isinstance(x, np.ndarray | np.generic) for x in jax.tree.leaves(tree))
    now = host_checksum_record(tree) if host else checksum_record(tree)
    damaged = "it does not match the checksums recorded when it was saved (damaged files)"
    if "leaves" in saved:
        recorded = saved["leaves"]
        if partial:
            return None if all(recorded.get(k) == v for k, v in now.items()) else damaged
        return None if recorded == now else damaged
    old, values = saved.get("state") or [], list(now.values())
    if partial:
        remaining = [tuple(v) for v in old]
        for value in map(tuple, values):
            if value not in remaining:
                return damaged
            remaining.remove(value)
        return None
    return None if old == values or sorted(map(tuple, old)) == sorted(map(tuple, values)) \
        else damaged


def read_on_host(directory: str | os.PathLike, keys: tuple[str, ...] | None = None):
    """An orbax PyTree checkpoint item (``checkpoints/<step>/state``) as host NumPy arrays in
    the layout it was saved in, without a template (its own metadata gives the tree), only the
    top-level ``keys`` if given. Raises what orbax raises for files it cannot read."""
    import orbax.checkpoint as ocp

    checkpointer = ocp.PyTreeCheckpointer()
    meta = checkpointer.metadata(directory)
    tree = getattr(meta, "item_metadata", meta)
    tree = getattr(tree, "tree", tree)
    if tree is None:
        raise CheckpointError(f"{directory} holds no readable checkpoint metadata")
    if keys is not None:
        tree = {k: tree[k] for k in keys if k in tree}
    item = jax.tree.map(lambda m: np.zeros((), m.dtype), tree)  # structure only
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item)
    return checkpointer.restore(directory, args=ocp.args.PyTreeRestore(
        item=item, restore_args=restore_args, partial_restore=keys is not None))
