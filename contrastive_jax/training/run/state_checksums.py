"""Checksums of a train state, saved with each checkpoint and checked at restore.

Orbax reads changed array bytes without complaint, so each checkpoint also records, per leaf,
two integer sums of the leaf's bits (:func:`state_checksums`); a restore compares them
(:mod:`contrastive_jax.training.run.checkpoints`). Integer sums are exact in any order: the
numbers do not depend on how a leaf is sharded or on the mesh it is restored onto, and a
flipped byte changes them (tests/test_reliability.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from contrastive_jax.training.parameter_paths import leaves_by_path


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
