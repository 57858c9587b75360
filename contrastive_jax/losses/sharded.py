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
    :mod:`contrastive_jax.losses.tiling.custom_vjps`. For CLIP one pass gives both directions:
    the tiles ``s x_l y_k^T`` of this device's ``x`` rows against every ``y`` chunk yield its rows'
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

All strategies run the tiled engine of :mod:`contrastive_jax.losses.tiling.custom_vjps` (the same
loops as on one device; how the rows arrive is a
:class:`~contrastive_jax.losses.tiling.row_exchange.RowExchange`) inside a ``jax.custom_vjp`` that
owns its collectives, so gradients are exact under ``jit`` and ``shard_map`` (``check_vma=True``),
with the logit scale replicated as in a train step. NT-Xent's similarity is symmetric, so the exact
strategies meet each pair of devices once (half the tiles). SigLIP's per-pair terms need no
statistics: one pass per pair of devices' rows.

Positives by id: every loss takes optional integer ``positive_ids`` (the global batch's, split
over the mesh like the rows); equal ids are positives (docs/derivations.md §5).

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
from contrastive_jax.losses.clip import DIRECTION_WEIGHTS
from contrastive_jax.losses.parts.validation import (
    check_block_size,
    check_choice,
    check_has_negatives,
    check_ids,
    check_pair,
    check_positive,
    check_scalar,
    loss_dtype,
)
from contrastive_jax.losses.tiling.custom_vjps import (
    DEFAULT_BLOCK_SIZE,
    Setup,
    default_ids,
    infonce_tiled,
    sigmoid_tiled,
)
from contrastive_jax.losses.tiling.row_exchange import STRATEGIES, RowExchange
from contrastive_jax.mesh import DATA_AXIS, check_divisible

Array = jax.Array
__all__ = ["STRATEGIES", "clip_loss_shard", "nt_xent_shard", "sharded_clip_loss",
           "sharded_nt_xent", "sharded_siglip_loss", "siglip_loss_shard"]


# ------------------------------------------------------------------- per-shard losses


def _prepare(x, y, ids, axis_name, axis_size, strategy, block_size):
    """Cast to the compute dtype; the exchange, the block, and the ids (default: global row
    indices)."""
    check_choice("strategy", strategy, STRATEGIES)
    block = check_block_size(block_size, "tiled", DEFAULT_BLOCK_SIZE)
    dtype = loss_dtype(x, y)
    exchange = RowExchange(strategy, axis_name, axis_size)
    n = jnp.shape(x)[0]
    ids = default_ids(n, exchange) if ids is None else jnp.asarray(ids)
    return jnp.asarray(x).astype(dtype), jnp.asarray(y).astype(dtype), ids, exchange, block


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
    positive_ids: Array | None = None,
) -> Array:
    """CLIP loss of the global batch, called inside ``shard_map`` on this device's (n, d) rows.

    Returns the global loss (the same on every device), equal to
    :func:`contrastive_jax.losses.clip_loss` on the concatenation of all devices' rows
    (docs/derivations.md §14.1; loss §8.1, scale §7.6). ``axis_size`` is the number of devices on
    ``axis_name``; ``positive_ids`` this device's (n,) ids.
    """
    check_choice("direction", direction, tuple(DIRECTION_WEIGHTS))
    x, y, ids, exchange, block = _prepare(x, y, positive_ids, axis_name, axis_size, strategy,
                                           block_size)
    w_row, w_col = DIRECTION_WEIGHTS[direction]
    setup = Setup("clip", exchange, block, w_row, w_col, float(max_scale),
                  by_id=positive_ids is not None)
    return infonce_tiled(x, y, jnp.asarray(log_scale).astype(x.dtype), ids, setup)


def nt_xent_shard(
    z1: Array,
    z2: Array,
    temperature: Array | float,
    *,
    axis_name: str = DATA_AXIS,
    axis_size: int,
    strategy: str = "all_gather",
    block_size: int | None = None,
    positive_ids: Array | None = None,
) -> Array:
    """NT-Xent of the global batch, inside ``shard_map`` on this device's two views (n, d).

    Row ``i`` of ``z1`` on a device is paired with row ``i`` of ``z2`` on the same device, as in
    :func:`contrastive_jax.losses.nt_xent` on the concatenated views; every other of the
    ``2N - 2`` views is a negative (docs/derivations.md §9.1, §14.6).
    """
    z1, z2, ids, exchange, block = _prepare(z1, z2, positive_ids, axis_name, axis_size,
                                             strategy, block_size)
    setup = Setup("nt_xent", exchange, block, by_id=positive_ids is not None)
    return infonce_tiled(z1, z2, jnp.asarray(temperature).astype(z1.dtype), ids, setup)


def siglip_loss_shard(
    x: Array,
    y: Array,
    log_scale: Array | float,
    bias: Array | float,
    *,
    axis_name: str = DATA_AXIS,
    axis_size: int,
    strategy: str = "all_gather",
    max_scale: float = 100.0,
    block_size: int | None = None,
    positive_ids: Array | None = None,
) -> Array:
    """SigLIP of the global batch, inside ``shard_map`` on this device's (n, d) rows: equal to
    :func:`contrastive_jax.losses.siglip_loss` on all rows (docs/derivations.md §11, §14)."""
    if strategy == "all_gather_no_grad":
        raise InputError("SigLIP has no anchors whose terms a device could keep alone; use "
                         "strategy 'all_gather' or 'ring'")
    x, y, ids, exchange, block = _prepare(x, y, positive_ids, axis_name, axis_size, strategy,
                                           block_size)
    setup = Setup("siglip", exchange, block, max_scale=float(max_scale),
                  by_id=positive_ids is not None)
    return sigmoid_tiled(x, y, jnp.asarray(log_scale).astype(x.dtype),
                         jnp.asarray(bias).astype(x.dtype), ids, setup)


# --------------------------------------------------------------- global-array wrappers


_SHARD_LOSSES = {"clip": clip_loss_shard, "nt_xent": nt_xent_shard,
                 "siglip": siglip_loss_shard}


@functools.partial(jax.jit, static_argnames=("loss", "mesh", "axis", "settings"))
def _over_mesh(loss: str, rows: tuple, scalars: tuple, ids, *, mesh: Mesh, axis: str,
               settings: tuple) -> Array:
    """The ``loss``'s ``*_shard`` function under ``shard_map``: rows (and ids) split over
    ``axis``, the scalars replicated, the loss replicated; ``settings`` its keyword arguments as
    sorted ``(name, value)`` pairs. Jitted, so that an eager call is one compiled program
    (cached per shapes and settings) rather than an op-by-op walk of the tile loops. Without
    ids each shard uses its rows' global indices."""
    shard_loss, kwargs = _SHARD_LOSSES[loss], dict(settings)
    k = len(rows) + len(scalars)

    def fn(*args):
        return shard_loss(*args[:k], axis_name=axis, **kwargs,
                          positive_ids=args[k] if ids is not None else None)

    specs = (P(axis),) * len(rows) + (P(),) * len(scalars)
    args = (*rows, *(jnp.asarray(s) for s in scalars))
    if ids is not None:
        specs, args = (*specs, P(axis)), (*args, jnp.asarray(ids))
    return jax.shard_map(fn, mesh=mesh, in_specs=specs, out_specs=P())(*args)


def _axis_size(mesh: Mesh, axis: str, rows: int, strategy: str, ids) -> int:
    if axis not in mesh.shape:
        raise InputError(f"mesh has axes {tuple(mesh.shape)}, not '{axis}'; pass axis=one of "
                         "them")
    size = mesh.shape[axis]
    check_divisible(rows, size)
    check_choice("strategy", strategy, STRATEGIES)
    check_ids("positive_ids", ids, rows)
    return size


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
    positive_ids: Array | None = None,
) -> Array:
    """:func:`clip_loss_shard` over ``mesh``: (N, d) global arrays, rows split over ``axis``.

    Equal to ``clip_loss(x, y, log_scale, max_scale=..., direction=..., positive_ids=...)`` for
    the exact strategies, in value and in every gradient. ``N`` must divide by the axis size.

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
    size = _axis_size(mesh, axis, jnp.shape(x)[0], strategy, positive_ids)
    check_positive("max_scale", max_scale, allow_inf=True)

    check_choice("direction", direction, tuple(DIRECTION_WEIGHTS))
    block = check_block_size(block_size, "tiled", DEFAULT_BLOCK_SIZE)
    settings = (("axis_size", size), ("block_size", block), ("direction", direction),
                ("max_scale", float(max_scale)), ("strategy", strategy))
    return _over_mesh("clip", (x, y), (log_scale,), positive_ids, mesh=mesh, axis=axis,
                      settings=settings)


def sharded_nt_xent(
    z1: Array,
    z2: Array,
    temperature: Array | float,
    *,
    mesh: Mesh,
    strategy: str = "all_gather",
    axis: str = DATA_AXIS,
    block_size: int | None = None,
    positive_ids: Array | None = None,
) -> Array:
    """:func:`nt_xent_shard` over ``mesh``; equal to ``nt_xent(z1, z2, temperature,
    positive_ids=...)``. Each pair of devices meets once (the similarity is symmetric).

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
    size = _axis_size(mesh, axis, jnp.shape(z1)[0], strategy, positive_ids)

    block = check_block_size(block_size, "tiled", DEFAULT_BLOCK_SIZE)
    settings = (("axis_size", size), ("block_size", block), ("strategy", strategy))
    return _over_mesh("nt_xent", (z1, z2), (temperature,), positive_ids, mesh=mesh, axis=axis,
                      settings=settings)


def sharded_siglip_loss(
    x: Array,
    y: Array,
    log_scale: Array | float,
    bias: Array | float,
    *,
    mesh: Mesh,
    strategy: str = "all_gather",
    axis: str = DATA_AXIS,
    max_scale: float = 100.0,
    block_size: int | None = None,
    positive_ids: Array | None = None,
) -> Array:
    """:func:`siglip_loss_shard` over ``mesh``; equal to ``siglip_loss(x, y, log_scale, bias,
    positive_ids=...)`` in value and every gradient (``all_gather`` or ``ring``).

    References:
      docs/derivations.md §11, §14; [SigLIP] Zhai et al. 2023, https://arxiv.org/abs/2303.15343.
    """
    check_pair("x", x, "y", y)
    check_has_negatives("x", jnp.shape(x)[0])
    check_scalar("log_scale", log_scale)
    check_scalar("bias", bias)
    size = _axis_size(mesh, axis, jnp.shape(x)[0], strategy, positive_ids)

    check_positive("max_scale", max_scale, allow_inf=True)
    block = check_block_size(block_size, "tiled", DEFAULT_BLOCK_SIZE)
    settings = (("axis_size", size), ("block_size", block), ("max_scale", float(max_scale)),
                ("strategy", strategy))
    return _over_mesh("siglip", (x, y), (log_scale, bias), positive_ids, mesh=mesh, axis=axis,
                      settings=settings)
