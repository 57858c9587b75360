"""The tiled losses' ``jax.custom_vjp`` s, on one device or over a mesh: InfoNCE family, SigLIP.

One engine for every tiled loss (docs/derivations.md §13, §14): this device's rows meet the
rows of its own chunk in place, and every other device's through a
:class:`~contrastive_jax.losses.tiling.row_exchange.RowExchange` (none on one device; a gather or
a ring on a mesh), in the loops of :mod:`~contrastive_jax.losses.tiling.tile_loops` over the
tiles of :mod:`~contrastive_jax.losses.tiling.tile`. The single-device loss is the one-device
case of the sharded one.

- :func:`infonce_tiled`: CLIP (``x`` against ``y``, both directions from one tile per pair,
  the columns' statistics riding with ``y``) and NT-Xent (the views ``z1``, ``z2`` against
  themselves and each other; the similarity is symmetric, so each pair of devices meets once).
- :func:`sigmoid_tiled`: SigLIP, ``x`` against ``y``, one pass per pair, no statistics.

Positives are given by integer ids (equal ids: positives; docs/derivations.md §5); the default is
a row's global index, so row ``i`` of ``x`` pairs with row ``i`` of ``y`` (NT-Xent: both views of
example ``i``). Gradients are exact under ``jit`` and ``shard_map(check_vma=True)``; the scale's
cotangent is ``psum``'d inside each rule, as a replicated input's must be.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from contrastive_jax.losses.parts.temperature import clip_active, logit_scale
from contrastive_jax.losses.tiling.row_exchange import RowExchange, meet_payloads
from contrastive_jax.losses.tiling.tile import (
    Chunk,
    anchor_losses_from_stats,
    empty_stats,
    merge_stats,
    weights,
)
from contrastive_jax.losses.tiling.tile_loops import (
    grad_pass,
    l2_normalize_vjp_blockwise,
    sigmoid_pass,
    stats_pass,
)

Array = jax.Array

# Rows per tile: a (b, b) float32 tile of logits is 4 b^2 bytes in flight; the block sweep
# behind this choice is in docs/benchmarks.md ("Block size").
DEFAULT_BLOCK_SIZE = 1024


class Setup(NamedTuple):
    """Static settings: the loss (``"clip"``, ``"nt_xent"`` or ``"siglip"``), the exchange,
    the block size, CLIP's direction weights, ``max_scale``, and whether the ids are the
    caller's (positives anywhere) or the default (positives only in a device's own chunk)."""

    kind: str
    exchange: RowExchange
    block: int
    w_row: float = 0.5
    w_col: float = 0.5
    max_scale: float = 100.0
    by_id: bool = False  # positives from the caller's ids (anywhere), not the default (local)


def default_ids(n: int, exchange: RowExchange) -> Array:
    """Global row indices of this device's ``n`` rows: the default positives."""
    offset = lax.axis_index(exchange.axis_name) * n if exchange.sharded else 0
    return offset + jnp.arange(n, dtype=jnp.int32)


def _no_cotangent(ids: Array):
    return np.zeros(ids.shape, dtype=jax.dtypes.float0)


def _logit_scale(scale_param: Array, setup: Setup) -> Array:
    """The logit scale ``s`` from the loss's scale parameter: CLIP's clipped
    ``exp(log_scale)``, NT-Xent's ``1 / temperature``."""
    if setup.kind == "nt_xent":
        return 1.0 / scale_param
    return logit_scale(scale_param, setup.max_scale)


def _total(x: Array, setup: Setup) -> int:
    return x.shape[0] * setup.exchange.size


# ------------------------------------------------------------------------ InfoNCE family


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def infonce_tiled(x: Array, y: Array, scale_param: Array, ids: Array, setup: Setup) -> Array:
    """CLIP or NT-Xent (``setup.kind``) of the global batch, from this device's rows ``x``, ``y``
    (n, d) and their ids (n,).

    ``scale_param`` is the scalar the logit scale comes from, and whose gradient is returned:
    CLIP's ``log_scale`` (``s = min(exp(log_scale), max_scale)``) or NT-Xent's ``temperature``
    (``s = 1 / temperature``)."""
    return _infonce_fwd(x, y, scale_param, ids, setup)[0]


def _clip_stats(X: Chunk, Y: Chunk, scale, setup: Setup):
    """Per-anchor statistics of this device's ``x`` rows (x -> y) and ``y`` rows (y -> x)."""
    exchange, w_row, w_col = setup.exchange, setup.w_row, setup.w_col
    empty = (empty_stats(X.x.shape[0], X.x.dtype),)
    if exchange.strategy == "all_gather_no_grad":  # each direction on its own: anchors vs all rows
        stream = RowExchange("all_gather", exchange.axis_name, exchange.size)

        def anchors_against(A, C):
            def body(Ck, acc, rs, own):
                rs, _ = stats_pass((A,), (Ck,), scale, setup.block, row_stats=rs,
                                   col_stats=None, positives=own or setup.by_id)
                return acc, rs
            return meet_payloads(stream, C, None, body, empty)[0][0]

        return (anchors_against(X, Y) if w_row else None,
                anchors_against(Y, X) if w_col else None)

    def body(Yk, acc, rs, own):
        rs, acc = stats_pass((X,), (Yk,), scale, setup.block, row_stats=rs, col_stats=acc,
                             positives=own or setup.by_id)
        return acc, rs

    rows, cols = meet_payloads(exchange, Y, empty if w_col else None, body,
                               empty if w_row else None)
    return (None if rows is None else rows[0]), (None if cols is None else cols[0])


def _local_positives(setup: Setup):
    """Which pairs of a device's views can hold positives: with the default ids only a view
    and the other (an example's two views); with the caller's ids, any. On a mesh the own views
    are a small share of the work, and one loop for them (not one per answer) holds less
    memory when they are a single tile each."""
    return True if setup.by_id or setup.exchange.sharded else (lambda i, j: i != j)


def _nt_xent_stats(Z: tuple[Chunk, Chunk], scale, setup: Setup):
    """Per-anchor statistics of this device's two views: their own pairs, then (each pair of
    devices once) the other devices' views, whose share goes home with them."""
    n, dtype = Z[0].x.shape[0], Z[0].x.dtype
    empty = (empty_stats(n, dtype),) * 2
    # The own views against themselves and each other (with the default ids, the positives are
    # in the other view only).
    stats, _ = stats_pass(Z, None, scale, setup.block, row_stats=empty, col_stats=None,
                          positives=_local_positives(setup))
    exchange = setup.exchange
    if not exchange.sharded:
        return stats

    def body(P, acc, stats, own):
        stats, acc = stats_pass(Z, P, scale, setup.block, row_stats=stats, col_stats=acc,
                                positives=setup.by_id)
        return acc, stats

    exact = RowExchange("all_gather", exchange.axis_name, exchange.size) if exchange.strategy == (
        "all_gather_no_grad") else exchange
    stats, acc = meet_payloads(exact, Z, empty, body, stats, own=False, half=True)
    return tuple(merge_stats(s, a) for s, a in zip(stats, acc, strict=True))


def _infonce_fwd(x, y, scale_param, ids, setup: Setup):
    scale = _logit_scale(scale_param, setup)
    X, Y = Chunk.of(x, ids), Chunk.of(y, ids)
    if setup.kind == "clip":
        rows, cols = _clip_stats(X, Y, scale, setup)
        w_row, w_col = setup.w_row, setup.w_col
    else:
        rows, cols = _nt_xent_stats((X, Y), scale, setup)
        w_row = w_col = 0.5  # the mean over all 2N anchors
    loss = sum(w * jnp.sum(anchor_losses_from_stats(s))
               for s, w in ((rows, w_row), (cols, w_col)) if w)
    loss = setup.exchange.psum(loss) / _total(x, setup)
    return loss, (x, y, scale_param, ids, rows, cols)


def _infonce_bwd(setup: Setup, residuals, g):
    x, y, scale_param, ids, rows, cols = residuals
    scale = _logit_scale(scale_param, setup)
    X, Y = Chunk.of(x, ids), Chunk.of(y, ids)
    coeff = g / _total(x, setup)
    if setup.kind == "clip":
        rw = weights(rows, coeff * setup.w_row, scale) if setup.w_row else None
        cw = weights(cols, coeff * setup.w_col, scale) if setup.w_col else None
        g_x, g_y, total = _clip_grads(X, Y, rw, cw, scale, setup)
        d_scale_param = jnp.where(clip_active(scale_param, setup.max_scale), 0.0, scale * total)
    else:
        rw, cw = weights(rows, coeff * 0.5, scale), weights(cols, coeff * 0.5, scale)
        g_x, g_y, total = _nt_xent_grads((X, Y), (rw, cw), scale, setup)
        d_scale_param = -total * scale * scale  # dL/dtau = dL/ds * (-1 / tau^2)
    g_x = l2_normalize_vjp_blockwise(X, g_x, scale, setup.block)
    g_y = l2_normalize_vjp_blockwise(Y, g_y, scale, setup.block)
    return g_x, g_y, d_scale_param.astype(scale_param.dtype), _no_cotangent(ids)


def _clip_grads(X: Chunk, Y: Chunk, rw, cw, scale, setup: Setup):
    """``Gamma Y_hat``, ``Gamma^T X_hat`` for this device's rows, and its ``sum Gamma * C``."""
    exchange, block = setup.exchange, setup.block
    zeros = (jnp.zeros_like(X.x), jnp.zeros_like(Y.x))
    if exchange.strategy == "all_gather_no_grad":
        # Each direction's anchors against all rows; of the candidates' gradient only the own
        # chunk's is kept (the remote rows are constants).
        g, total = list(zeros), jnp.zeros((), X.x.dtype)
        stream = RowExchange("all_gather", exchange.axis_name, exchange.size)
        for a, (A, C, w) in enumerate(((X, Y, rw), (Y, X, cw))):
            if w is None:
                continue
            (g[a],), (g[1 - a],), part = grad_pass(
                (A,), (C,), scale, block, row_w=(w,), col_w=None, g_r=(g[a],), g_c=(g[1 - a],))

            def body(Ck, acc, carry, own, A=A, w=w):
                g_a, t = carry
                g_a, _, p = grad_pass((A,), (Ck,), scale, block, row_w=(w,), col_w=None,
                                      g_r=g_a, g_c=None, positives=setup.by_id)
                return acc, (g_a, t + p)

            ((g[a],), part2), _ = meet_payloads(stream, C, None, body, ((g[a],), part), own=False)
            total = total + part2
        return g[0], g[1], exchange.psum(total)

    def body(payload, g_yk, carry, own):
        Yk, cwk = payload
        g_x, total = carry
        g_x, g_yk, part = grad_pass((X,), (Yk,), scale, block, row_w=None if rw is None else (rw,),
                                    col_w=None if cwk is None else (cwk,), g_r=g_x, g_c=g_yk,
                                    positives=own or setup.by_id)
        return g_yk, (g_x, total + part)

    ((g_x,), total), (g_y,) = meet_payloads(exchange, (Y, cw), (zeros[1],), body,
                                            ((zeros[0],), jnp.zeros((), X.x.dtype)))
    return g_x, g_y, exchange.psum(total)


def _nt_xent_grads(Z, W, scale, setup: Setup):
    exchange, block = setup.exchange, setup.block
    zeros = (jnp.zeros_like(Z[0].x), jnp.zeros_like(Z[1].x))
    grads, _, total = grad_pass(Z, None, scale, block, row_w=W, col_w=None, g_r=zeros, g_c=None,
                                positives=_local_positives(setup))
    if not exchange.sharded:
        return (*grads, total)
    no_grad = exchange.strategy == "all_gather_no_grad"

    def body(payload, acc, carry, own):
        P, PW = payload
        grads, total = carry
        grads, acc, part = grad_pass(Z, P, scale, block, row_w=W, col_w=None if no_grad else PW,
                                     g_r=grads, g_c=acc, positives=setup.by_id)
        return acc, (grads, total + part)

    if no_grad:  # every remote view meets this device's anchors; nothing goes home
        stream = RowExchange("all_gather", exchange.axis_name, exchange.size)
        (grads, total), _ = meet_payloads(stream, (Z, W), None, body, (grads, total), own=False)
        return (*grads, exchange.psum(total))
    (grads, total), acc = meet_payloads(exchange, (Z, W), zeros, body, (grads, total), own=False,
                                        half=True)
    return grads[0] + acc[0], grads[1] + acc[1], exchange.psum(total)


infonce_tiled.defvjp(_infonce_fwd, _infonce_bwd)

# The single-device entry points call these: an eager call then compiles its loops once per
# shape and setting instead of tracing them on every call (under an outer jit they inline).
infonce_tiled_jit = jax.jit(infonce_tiled, static_argnums=4)


# -------------------------------------------------------------------------------- SigLIP


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def sigmoid_tiled(x: Array, y: Array, log_scale: Array, bias: Array, ids: Array,
                  setup: Setup) -> Array:
    """SigLIP's ``(1/N) sum_ij softplus(-z_ij (s c_ij + b))`` of the global batch, tiled.

    A pair's gradient needs no statistics of other pairs, so under differentiation the forward
    pass computes the value and the gradient at once (three matmuls per tile, each pair of
    devices' rows met once) and the backward pass only scales them by the cotangent.
    """
    return _sigmoid(x, y, log_scale, bias, ids, setup, gradients=False)[0]


def _sigmoid(x, y, log_scale, bias, ids, setup: Setup, gradients: bool):
    exchange = setup.exchange
    scale = logit_scale(log_scale, setup.max_scale)
    X, Y = Chunk.of(x, ids), Chunk.of(y, ids)
    coeff = 1.0 / _total(x, setup) if gradients else None

    def body(Yk, g_yk, carry, own):
        total, g_x, d_scale, d_bias = carry
        part, g_x, g_yk, ds, db = sigmoid_pass((X,), (Yk,), scale, bias, setup.block, coeff,
                                               g_x, g_yk)
        return g_yk, (total + part, g_x, d_scale + ds, d_bias + db)

    zero = jnp.zeros((), x.dtype)
    init = (zero, (jnp.zeros_like(x),) if gradients else None, zero, zero)
    (total, g_x, d_scale, d_bias), g_y = meet_payloads(
        exchange, Y, (jnp.zeros_like(y),) if gradients else None, body, init)
    loss = exchange.psum(total) / _total(x, setup)
    if not gradients:
        return loss, None
    d_log_scale = jnp.where(clip_active(log_scale, setup.max_scale), 0.0,
                            scale * exchange.psum(d_scale))
    grads = (l2_normalize_vjp_blockwise(X, g_x[0], scale, setup.block),
             l2_normalize_vjp_blockwise(Y, g_y[0], scale, setup.block),
             d_log_scale.astype(log_scale.dtype), exchange.psum(d_bias).astype(bias.dtype))
    return loss, (grads, ids)


def _sigmoid_fwd(x, y, log_scale, bias, ids, setup: Setup):
    return _sigmoid(x, y, log_scale, bias, ids, setup, gradients=True)


def _sigmoid_bwd(setup: Setup, residuals, g):
    grads, ids = residuals
    return (*(g * d for d in grads), _no_cotangent(ids))


sigmoid_tiled.defvjp(_sigmoid_fwd, _sigmoid_bwd)
sigmoid_tiled_jit = jax.jit(sigmoid_tiled, static_argnums=5)


__all__ = ["DEFAULT_BLOCK_SIZE", "Setup", "default_ids", "infonce_tiled",
           "infonce_tiled_jit", "sigmoid_tiled", "sigmoid_tiled_jit"]
