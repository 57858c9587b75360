"""Tiled contrastive losses that never build the N x N logit matrix.

The engine behind ``clip_loss(..., impl="tiled")`` and ``nt_xent(..., impl="tiled")``.

Forward. The rows ``U`` and columns ``V`` (both L2-normalised, (n, d)) are cut into blocks of
``b`` rows; a ``lax.fori_loop`` visits tile pairs ``(r, c)``, forms the (b, b) tile
``S = s U_r V_c^T`` and folds it into a running max and sum per row and per column (the online
log-sum-exp). Only these O(n) statistics, over the *negatives* (the positive is masked out of
every tile and its logit is computed directly as a row-wise dot product), are kept. Each loss is
then ``softplus(lse_negatives - S_positive)``, as in the dense losses.

Backward (``jax.custom_vjp``; 000 P6, P9). Each tile is recomputed and its block of
``Gamma = alpha (P_r - I) + beta (P_c - I)`` formed from the stored statistics,
``P_r = exp(S - lse_row)``, ``P_c = exp(S - lse_col)``; then ``grad_U_r += s Gamma_tile V_c``
and ``grad_V_c += s Gamma_tile^T U_r``. The positives' entries ``p_ii - 1 = -sigmoid(lse_neg -
S_ii)`` are applied outside the tiles in O(n d), and ``sum Gamma * S`` gives the logit-scale
gradient (000 P8). Four matmuls per tile in all (one forward, three backward).

NT-Xent's similarity ``S = Z_hat Z_hat^T / tau`` is symmetric, so only the tiles with ``r <= c``
are visited: tile ``(r, c)`` serves as row block ``r`` and, through its columns, as row block
``c``; the two partial statistics are merged at the end. This halves the work.

Memory: O(n d) for the embeddings and their gradients, O(n) statistics and one (b, b) tile in
flight, so O(n d + b^2) instead of O(n^2).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from contrastive_jax.losses.normalize import clamped_norms, l2_normalize_vjp
from contrastive_jax.losses.temperature import clip_active, logit_scale
from contrastive_jax.losses.tiles import (
    DIRECTION_WEIGHTS,
    Normaliser,
    RowWeights,
    TilePlan,
    make_plan,
    merge,
    negative_probabilities,
    negatives_mask,
    negatives_minus_positive,
    pad_rows,
    pad_weights,
    partner_grads,
    positives_mask,
    put,
    take,
    tile_logit_grad,
    tile_normaliser,
)
from contrastive_jax.similarity import MATMUL_PRECISION

Array = jax.Array

# Rows per tile. On 2 CPU cores at N = 16384, d = 512 (experiments/results/block_sweep.md),
# blocks of 512, 1024 and 2048 ran within run-to-run noise of each other (6.2-7.2 s per
# forward+backward); JAX_NOTES.md found 256-wide tiles clearly slower and full-height strips
# slower at large N. 1024 keeps a tile at 4 MB of float32 and the loop at N^2 / 1024^2 steps.
DEFAULT_BLOCK_SIZE = 1024


class Rows(NamedTuple):
    """Raw embeddings (n_pad, d) and their clamped norms (n_pad,): ``x_hat = x / norm``.

    Each block of rows is normalised when its tile is formed (``b d`` divisions against the
    tile's ``b^2 d`` multiply-adds), bit for bit as :func:`l2_normalize` would, so no (n, d)
    copy of the normalised embeddings exists in either pass.
    """

    x: Array
    norm: Array

    def hat(self) -> Array:
        return self.x / self.norm[:, None]


def _rows(x: Array, plan: TilePlan) -> Rows:
    pad = plan.n_pad - x.shape[0]
    return Rows(pad_rows(x, plan), jnp.pad(clamped_norms(x), (0, pad), constant_values=1.0))


def _tile(u: Rows, v: Rows, plan: TilePlan, r: Array, c: Array):
    u_r = Rows(*(lax.dynamic_slice_in_dim(a, r * plan.block, plan.block) for a in u)).hat()
    v_c = Rows(*(lax.dynamic_slice_in_dim(a, c * plan.block, plan.block) for a in v)).hat()
    cosines = jnp.matmul(u_r, v_c.T, precision=MATMUL_PRECISION)
    return u_r, v_c, cosines, negatives_mask(plan, r, c)


def negative_normalisers(
    u: Rows, v: Rows, to_logits: Callable[[Array], Array], plan: TilePlan
) -> tuple[Normaliser, Normaliser, Array]:
    """Per row and per column, the normaliser of ``exp(S_ij)`` over the negatives, without S.

    Rows of (n_pad, d) -> two :class:`~contrastive_jax.losses.tiles.Normaliser` of (n_pad,)
    (empty for padded rows) and the positives' cosines (n_pad,), read off the same tiles so
    that they carry exactly the rounding of the negatives' logits (a separate row-wise dot
    product differs by ~1e-7, which a logit scale of 100 turns into ~1e-5 of a small loss).
    For a symmetric plan the second normaliser holds what the rows of block ``c`` see through
    the columns of the ``r < c`` tiles: :func:`merge` the two.
    """
    r_idx, c_idx = (jnp.asarray(a) for a in plan.pairs())
    b = plan.block
    dtype = u.x.dtype
    empty = Normaliser(jnp.full((plan.n_pad,), -jnp.inf, dtype), jnp.zeros((plan.n_pad,), dtype))

    def body(t, carry):
        rows, cols, positive = carry
        r, c = r_idx[t], c_idx[t]
        _, _, cosines, mask = _tile(u, v, plan, r, c)
        pos = jnp.where(positives_mask(plan, r, c), cosines, 0.0)
        positive = lax.dynamic_update_slice_in_dim(
            positive, lax.dynamic_slice_in_dim(positive, r * b, b) + pos.sum(axis=1), r * b, 0)
        tile = jnp.where(mask, to_logits(cosines), -jnp.inf)
        rows = put(rows, merge(take(rows, r * b, b), tile_normaliser(tile, 1)), r * b)
        if plan.symmetric:  # a diagonal tile's columns are its rows: count them once
            off_diagonal = r != c
            tile = jnp.where(off_diagonal, tile, -jnp.inf)
            col_pos = jnp.where(off_diagonal, pos.sum(axis=0), 0.0)
            positive = lax.dynamic_update_slice_in_dim(
                positive, lax.dynamic_slice_in_dim(positive, c * b, b) + col_pos, c * b, 0)
        cols = put(cols, merge(take(cols, c * b, b), tile_normaliser(tile, 0)), c * b)
        return rows, cols, positive

    init = (empty, empty, jnp.zeros((plan.n_pad,), dtype))
    return lax.fori_loop(0, r_idx.shape[0], body, init)


def tiled_logit_grad_products(
    u: Rows,
    v: Rows,
    to_logits: Callable[[Array], Array],
    row_weights: RowWeights,
    col_weights: RowWeights,
    pos_row: Array,
    pos_col: Array,
    plan: TilePlan,
) -> tuple[Array, Array, Array]:
    """``Gamma V_hat``, ``Gamma^T U_hat`` over the negatives, and ``sum Gamma * C`` in full.

    Tile by tile with :func:`contrastive_jax.losses.tiles.tile_logit_grad`; ``pos_row`` /
    ``pos_col`` are the positives' cosines. For a symmetric plan the column term is dropped on
    diagonal tiles (it is the transpose of their row term).
    """
    r_idx, c_idx = (jnp.asarray(a) for a in plan.pairs())
    b = plan.block

    def body(t, carry):
        g_u, g_v, total = carry
        r, c = r_idx[t], c_idx[t]
        u_r, v_c, cosines, mask = _tile(u, v, plan, r, c)
        rows = lambda a: lax.dynamic_slice_in_dim(a, r * b, b)  # noqa: E731
        cols = lambda a: lax.dynamic_slice_in_dim(a, c * b, b)  # noqa: E731
        col_w = take(col_weights, c * b, b)
        if plan.symmetric:
            col_w = RowWeights(col_w.shift, jnp.where(r == c, 0.0, col_w.weight))
        gamma, part = tile_logit_grad(cosines, to_logits(cosines), mask,
                                      take(row_weights, r * b, b), col_w,
                                      rows(pos_row), cols(pos_col))
        d_u = jnp.matmul(gamma, v_c, precision=MATMUL_PRECISION)
        d_v = jnp.matmul(gamma.T, u_r, precision=MATMUL_PRECISION)
        g_u = lax.dynamic_update_slice_in_dim(g_u, rows(g_u) + d_u, r * b, 0)
        g_v = lax.dynamic_update_slice_in_dim(g_v, cols(g_v) + d_v, c * b, 0)
        return g_u, g_v, total + part

    init = (jnp.zeros_like(u.x), jnp.zeros_like(v.x), jnp.zeros((), u.x.dtype))
    return lax.fori_loop(0, r_idx.shape[0], body, init)


# ------------------------------------------------------------------------------------ CLIP


def _unpad(norm: Normaliser, n: int) -> Normaliser:
    return Normaliser(norm.shift[:n], norm.total[:n])


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def clip_loss_tiled(x, y, log_scale, max_scale, direction, block_size):
    """Tiled ``clip_loss`` on float arrays already in the compute dtype (see ``clip_loss``)."""
    return _clip_tiled_fwd(x, y, log_scale, max_scale, direction, block_size)[0]


def _clip_tiled_fwd(x, y, log_scale, max_scale, direction, block_size):
    n = x.shape[0]
    scale = logit_scale(log_scale, max_scale)
    plan = make_plan(n, block_size, symmetric=False, exclude="diagonal")
    u, v = _rows(x, plan), _rows(y, plan)
    rows, cols, positive_cos = negative_normalisers(u, v, lambda c: scale * c, plan)
    rows, cols, positive_cos = _unpad(rows, n), _unpad(cols, n), positive_cos[:n]
    positive = scale * positive_cos
    w_row, w_col = DIRECTION_WEIGHTS[direction]
    loss = (w_row * jnp.mean(jax.nn.softplus(negatives_minus_positive(rows, positive)))
            + w_col * jnp.mean(jax.nn.softplus(negatives_minus_positive(cols, positive))))
    return loss, (x, y, log_scale, positive_cos, rows, cols)


def _clip_tiled_bwd(max_scale, direction, block_size, residuals, g):
    x, y, log_scale, positive_cos, rows, cols = residuals
    n = x.shape[0]
    scale = logit_scale(log_scale, max_scale)
    positive = scale * positive_cos
    plan = make_plan(n, block_size, symmetric=False, exclude="diagonal")
    u, v = _rows(x, plan), _rows(y, plan)
    w_row, w_col = DIRECTION_WEIGHTS[direction]
    alpha, beta = g * w_row / n, g * w_col / n
    pos = jnp.pad(positive_cos, (0, plan.n_pad - n))
    g_u, g_v, total = tiled_logit_grad_products(
        u, v, lambda c: scale * c,
        pad_weights(negative_probabilities(rows, positive, alpha), plan.n_pad),
        pad_weights(negative_probabilities(cols, positive, beta), plan.n_pad), pos, pos, plan)
    # The positives: Gamma_ii = -(alpha (1 - p^r_ii) + beta (1 - p^c_ii)), in O(n d).
    gamma_ii = -(alpha * jax.nn.sigmoid(negatives_minus_positive(rows, positive))
                 + beta * jax.nn.sigmoid(negatives_minus_positive(cols, positive)))
    g_x_hat = scale * (g_u[:n] + gamma_ii[:, None] * (y / v.norm[:n, None]))
    g_y_hat = scale * (g_v[:n] + gamma_ii[:, None] * (x / u.norm[:n, None]))
    g_log_scale = jnp.where(clip_active(log_scale, max_scale), 0.0, scale * total)
    g_log_scale = g_log_scale.astype(log_scale.dtype)
    return l2_normalize_vjp(x, g_x_hat), l2_normalize_vjp(y, g_y_hat), g_log_scale


clip_loss_tiled.defvjp(_clip_tiled_fwd, _clip_tiled_bwd)


# ---------------------------------------------------------------------------------- NT-Xent


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def nt_xent_tiled(z, temperature, block_size):
    """Tiled ``nt_xent`` on the stacked views ``z = [z1; z2]`` (2N, d) in the compute dtype."""
    return _nt_xent_tiled_fwd(z, temperature, block_size)[0]


def _nt_xent_tiled_fwd(z, temperature, block_size):
    m = z.shape[0]
    plan = make_plan(m, block_size, symmetric=True, exclude="nt_xent")
    u = _rows(z, plan)
    rows, cols, positive_cos = negative_normalisers(u, u, lambda c: c / temperature, plan)
    negatives, positive_cos = _unpad(merge(rows, cols), m), positive_cos[:m]
    positive = positive_cos / temperature
    loss = jnp.mean(jax.nn.softplus(negatives_minus_positive(negatives, positive)))
    return loss, (z, temperature, positive_cos, negatives)


def _nt_xent_tiled_bwd(block_size, residuals, g):
    z, temperature, positive_cos, negatives = residuals
    m = z.shape[0]
    positive = positive_cos / temperature
    plan = make_plan(m, block_size, symmetric=True, exclude="nt_xent")
    alpha = g / m
    u = _rows(z, plan)
    z_hat = z / u.norm[:m, None]
    weights = pad_weights(negative_probabilities(negatives, positive, alpha), plan.n_pad)
    pos = jnp.pad(positive_cos, (0, plan.n_pad - m))
    g_u, g_v, total = tiled_logit_grad_products(u, u, lambda c: c / temperature, weights,
                                                weights, pos, pos, plan)
    # Partners: G_{i, pi(i)} = -alpha (1 - p_{i, pi(i)}).
    partner = -alpha * jax.nn.sigmoid(negatives_minus_positive(negatives, positive))
    g_z_hat = (g_u[:m] + g_v[:m] + partner_grads(partner, z_hat)) / temperature
    g_temperature = (-total / temperature**2).astype(temperature.dtype)
    return l2_normalize_vjp(z, g_z_hat), g_temperature


nt_xent_tiled.defvjp(_nt_xent_tiled_fwd, _nt_xent_tiled_bwd)
