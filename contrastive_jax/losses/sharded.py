"""Contrastive losses over a device mesh: every device's rows meet all N rows as negatives.

Each device holds ``n = N / D`` rows of the global batch (``D`` devices on the mesh axis
``data``). The denominator, the effective batch and whether gradients pass through the gather are
part of the objective (docs/derivations.md §14.6), so each choice is a named ``strategy``:

``"all_gather"`` (exact)
    The candidates are gathered (``lax.all_gather``; per device ``(D - 1) n d`` floats in; raw
    rows, as normalisation is row-wise: each device normalises what it receives, and the exact
    normalisation Jacobian of docs/derivations.md §2.2 is applied at home) and each device computes
    the
    *local loss*: its own anchors against all ``N`` candidates, tiled in (b, b) blocks as in
    :mod:`contrastive_jax.losses.tiled`. For CLIP one pass gives both directions: the tiles
    ``s x_l y_k^T`` of this device's ``x`` rows against every ``y`` chunk yield its rows'
    statistics and its share of every ``y`` column's, and a log-sum-exp all-reduce of those
    O(N) column shares completes each column (so only ``y`` is gathered, and each logit is
    computed once on one device, as on a single device). A ``psum`` of the local sums is exactly
    the single-device loss on the concatenated batch. The backward pass sends the gradient of
    the gathered candidates home with ``lax.psum_scatter`` (the transpose of the gather), so
    every device gets exactly the gradient of the global loss w.r.t. its rows: no world-size
    factor to patch.
``"all_gather_no_grad"`` (a different objective)
    The same loss value, but the gathered remote candidates are constants, as in the PyTorch
    codebases that gather without autograd. Device ``k`` differentiates only its own terms
    (its anchors' rows) w.r.t. its own rows; what it drops is every term in which one of its
    rows is a *candidate of a remote anchor* (a negative of the other devices' anchors, and for
    CLIP the positive of no one: positives are always local). Its gradient is therefore
    ``grad_k = d L_k / d rows_k`` instead of ``sum_m d L_m / d rows_k``; the anchor part is
    identical, the candidate part keeps only the terms of the device's own anchors. For CLIP
    ``L_k`` is its ``x`` rows against all ``y`` plus its ``y`` rows against all ``x`` (two
    passes). ``tests/test_sharding.py`` checks this decomposition term by term.
``"ring"`` (exact)
    No gather: the candidate chunks travel round the devices with ``lax.ppermute``, one chunk
    per hop, while the anchors' online log-sum-exp accumulates (for CLIP the chunk's column
    statistics ride along and one last hop brings them home); the backward pass sends each
    chunk round again with its gradient accumulator riding along, and one last hop brings the
    accumulator home. Per-device memory O(n d) plus the chunk in flight, never O(N d).

All strategies use the analytic backward pass of :mod:`contrastive_jax.losses.chunk_stream` inside a
``jax.custom_vjp`` that owns its collectives (:mod:`contrastive_jax.losses.collective_vjp`), so
gradients are exact under ``jit`` and ``shard_map`` (``check_vma=True``), with the logit scale
replicated as in a train step.

Functions named ``*_shard`` run *inside* a ``shard_map`` (on per-device shards, with the mesh
axis name); ``sharded_*`` wrap them for global arrays and a :class:`jax.sharding.Mesh`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from contrastive_jax.errors import InputError
from contrastive_jax.losses.collective_vjp import Setup, clip_one_pass, streamed_loss
from contrastive_jax.losses.temperature import logit_scale
from contrastive_jax.losses.tile_kernels import DIRECTION_WEIGHTS
from contrastive_jax.losses.tiled import DEFAULT_BLOCK_SIZE
from contrastive_jax.losses.validation import (
    check_block_size,
    check_choice,
    check_has_negatives,
    check_pair,
    check_positive,
    compute_dtype,
)
from contrastive_jax.mesh import DATA_AXIS, check_divisible

Array = jax.Array
STRATEGIES = ("all_gather", "all_gather_no_grad", "ring")
__all__ = ["STRATEGIES", "clip_loss_shard", "nt_xent_shard", "sharded_clip_loss",
           "sharded_nt_xent"]


# ------------------------------------------------------------------- per-shard losses


def clip_loss_shard(
    x: Array,
    y: Array,
    log_scale: Array | float,
    *,
    axis_name: str = DATA_AXIS,
    axis_size: int,
    strategy: str = "all_gather",
    max_scale: float = 100.0,
    direction: str = "both",
    block_size: int | None = None,
) -> Array:
    """CLIP loss of the global batch, called inside ``shard_map`` on this device's (n, d) rows.

    Returns the global loss (the same on every device), equal to
    :func:`contrastive_jax.losses.clip_loss` on the concatenation of all devices' rows
    (docs/derivations.md §14.1; loss §8.1, scale §7.6). ``axis_size`` is the number of devices on
    ``axis_name``.
    """
    check_choice("strategy", strategy, STRATEGIES)
    check_choice("direction", direction, tuple(DIRECTION_WEIGHTS))
    block_size = check_block_size(block_size, "tiled", DEFAULT_BLOCK_SIZE)
    dtype = compute_dtype(x, y)
    x, y = jnp.asarray(x).astype(dtype), jnp.asarray(y).astype(dtype)
    scale = logit_scale(jnp.asarray(log_scale).astype(dtype), max_scale)
    total = x.shape[0] * axis_size
    w_row, w_col = DIRECTION_WEIGHTS[direction]
    passes = tuple(p for p in ((0, 1, w_row), (1, 0, w_col)) if p[2])  # (anchors, candidates, w)
    setup = Setup(axis_name, axis_size, "clip", strategy, block_size, passes)
    if len(passes) == 2 and strategy != "all_gather_no_grad":
        return clip_one_pass(x, y, scale, setup) / total
    return streamed_loss((x, y), scale, setup) / total


def nt_xent_shard(
    z1: Array,
    z2: Array,
    temperature: Array | float,
    *,
    axis_name: str = DATA_AXIS,
    axis_size: int,
    strategy: str = "all_gather",
    block_size: int | None = None,
) -> Array:
    """NT-Xent of the global batch, inside ``shard_map`` on this device's two views (n, d).

    Row ``i`` of ``z1`` on a device is paired with row ``i`` of ``z2`` on the same device, as in
    :func:`contrastive_jax.losses.nt_xent` on the concatenated views; every other of the
    ``2N - 2`` views is a negative (docs/derivations.md §9.1, §14.6).
    """
    check_choice("strategy", strategy, STRATEGIES)
    block_size = check_block_size(block_size, "tiled", DEFAULT_BLOCK_SIZE)
    dtype = compute_dtype(z1, z2)
    z = jnp.concatenate([jnp.asarray(z1).astype(dtype), jnp.asarray(z2).astype(dtype)])
    scale = 1.0 / jnp.asarray(temperature).astype(dtype)
    setup = Setup(axis_name, axis_size, "nt_xent", strategy, block_size, ((0, 0, 1.0),))
    return streamed_loss((z,), scale, setup) / (z.shape[0] * axis_size)


# --------------------------------------------------------------- global-array wrappers


def _over_mesh(fn, mesh: Mesh, axis: str, a: Array, b: Array, third) -> Array:
    """``fn(a_shard, b_shard, third)`` under ``shard_map``: rows split over ``axis``, ``third``
    (the scale or temperature) replicated, the loss replicated."""
    return jax.shard_map(fn, mesh=mesh, in_specs=(P(axis), P(axis), P()), out_specs=P())(
        a, b, jnp.asarray(third))


def _data_axis_size(mesh: Mesh, axis: str) -> int:
    if axis not in mesh.shape:
        raise InputError(f"mesh has axes {tuple(mesh.shape)}, not '{axis}'; pass axis=one of them")
    return mesh.shape[axis]


def sharded_clip_loss(
    x: Array,
    y: Array,
    log_scale: Array | float,
    *,
    mesh: Mesh,
    strategy: str = "all_gather",
    axis: str = DATA_AXIS,
    max_scale: float = 100.0,
    direction: str = "both",
    block_size: int | None = None,
) -> Array:
    """:func:`clip_loss_shard` over ``mesh``: (N, d) global arrays, rows split over ``axis``.

    Equal to ``clip_loss(x, y, log_scale, max_scale=..., direction=...)`` for the exact
    strategies, in value and in every gradient. ``N`` must divide by the axis size.

    References:
      docs/derivations.md §14 (the sharded objective), §8 (CLIP); docs/sharding.md.

    Example (every device on the ``data`` axis; any device count that divides the 8 rows gives
    the same number):

      >>> import jax.numpy as jnp
      >>> from contrastive_jax.losses.sharded import sharded_clip_loss
      >>> from contrastive_jax.mesh import make_mesh
      >>> x = jnp.eye(8)
      >>> loss = sharded_clip_loss(x, x, jnp.log(10.0), mesh=make_mesh(), strategy="ring")
      >>> print(f"{float(loss):.3e}")
      3.177e-04
    """
    check_pair("x", x, "y", y)
    check_has_negatives("x", jnp.shape(x)[0])
    size = _data_axis_size(mesh, axis)
    check_divisible(jnp.shape(x)[0], size)
    check_choice("strategy", strategy, STRATEGIES)
    fn = functools.partial(clip_loss_shard, axis_name=axis, axis_size=size, strategy=strategy,
                           max_scale=max_scale, direction=direction, block_size=block_size)
    return _over_mesh(fn, mesh, axis, x, y, log_scale)


def sharded_nt_xent(
    z1: Array,
    z2: Array,
    temperature: Array | float,
    *,
    mesh: Mesh,
    strategy: str = "all_gather",
    axis: str = DATA_AXIS,
    block_size: int | None = None,
) -> Array:
    """:func:`nt_xent_shard` over ``mesh``; equal to ``nt_xent(z1, z2, temperature)``.

    References:
      docs/derivations.md §14 (the sharded objective), §9 (NT-Xent); docs/sharding.md.

    Example:

      >>> import jax.numpy as jnp
      >>> from contrastive_jax.losses.sharded import sharded_nt_xent
      >>> from contrastive_jax.mesh import make_mesh
      >>> x = jnp.eye(8)
      >>> loss = sharded_nt_xent(x, x, 0.1, mesh=make_mesh(), strategy="ring")
      >>> print(f"{float(loss):.3e}")
      6.354e-04
    """
    check_pair("z1", z1, "z2", z2)
    check_has_negatives("z1", jnp.shape(z1)[0])
    check_positive("temperature", temperature)
    size = _data_axis_size(mesh, axis)
    check_divisible(jnp.shape(z1)[0], size)
    check_choice("strategy", strategy, STRATEGIES)
    fn = functools.partial(nt_xent_shard, axis_name=axis, axis_size=size, strategy=strategy,
                           block_size=block_size)
    return _over_mesh(fn, mesh, axis, z1, z2, temperature)
