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
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from contrastive_jax.losses.normalize import l2_normalize, l2_normalize_vjp
from contrastive_jax.losses.temperature import clip_active, logit_scale
from contrastive_jax.similarity import MATMUL_PRECISION

Array = jax.Array

# Measured on 2 CPU cores, d = 512 (benchmarks/loss_bench.py --sweep-block): 512-1024 are
# fastest at N = 16384; below 256 the loop overhead shows, above 2048 the tile memory grows.
DEFAULT_BLOCK_SIZE = 1024


class TilePlan(NamedTuple):
    """Static layout: ``n`` real rows padded to ``num_blocks * block`` rows."""

    n: int
    block: int
    num_blocks: int
    symmetric: bool  # visit only r <= c (the rows and the columns are the same vectors)
    exclude: str  # "diagonal" (CLIP: j == i) or "nt_xent" (j == i or j == (i + n/2) mod n)

    @property
    def n_pad(self) -> int:
        return self.block * self.num_blocks

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        r, c = np.divmod(np.arange(self.num_blocks**2), self.num_blocks)
        keep = r <= c if self.symmetric else np.ones_like(r, bool)
        return r[keep].astype(np.int32), c[keep].astype(np.int32)


def make_plan(n: int, block_size: int, *, symmetric: bool, exclude: str) -> TilePlan:
    """Blocks of ``min(block_size, n)`` rows; the last one is padded and masked."""
    block = min(block_size, n)
    return TilePlan(n, block, math.ceil(n / block), symmetric, exclude)


def pad_rows(x: Array, plan: TilePlan) -> Array:
    extra = plan.n_pad - x.shape[0]
    return x if extra == 0 else jnp.pad(x, ((0, extra), (0, 0)))


def _negatives_mask(plan: TilePlan, r: Array, c: Array) -> Array:
    """(b, b) True where column j is a negative for row i (real, not self, not positive)."""
    rows = r * plan.block + jnp.arange(plan.block)[:, None]
    cols = c * plan.block + jnp.arange(plan.block)[None, :]
    mask = (rows < plan.n) & (cols < plan.n) & (rows != cols)
    if plan.exclude == "nt_xent":
        mask &= cols != (rows + plan.n // 2) % plan.n
    return mask


def _tile(u: Array, v: Array, scale: Array, plan: TilePlan, r: Array, c: Array):
    u_r = lax.dynamic_slice_in_dim(u, r * plan.block, plan.block)
    v_c = lax.dynamic_slice_in_dim(v, c * plan.block, plan.block)
    logits = scale * jnp.matmul(u_r, v_c.T, precision=MATMUL_PRECISION)
    return u_r, v_c, logits, _negatives_mask(plan, r, c)


def _online_lse_update(m: Array, total: Array, start: Array, tile: Array, axis: int, block: int):
    """Fold a masked tile (``-inf`` = excluded) into the running (max, sum) of its rows/cols."""
    m_old = lax.dynamic_slice_in_dim(m, start, block)
    total_old = lax.dynamic_slice_in_dim(total, start, block)
    m_new = jnp.maximum(m_old, jnp.max(tile, axis=axis))
    shift = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
    total_new = total_old * jnp.exp(m_old - shift) + jnp.sum(
        jnp.exp(tile - jnp.expand_dims(shift, axis)), axis=axis)
    return (lax.dynamic_update_slice_in_dim(m, m_new, start, 0),
            lax.dynamic_update_slice_in_dim(total, total_new, start, 0))


def negative_logsumexps(u: Array, v: Array, scale: Array, plan: TilePlan) -> tuple[Array, Array]:
    """Per row and per column ``log sum_{j negative} exp(S_ij)`` without forming S.

    (n_pad, d), (n_pad, d) -> (n_pad,), (n_pad,); ``-inf`` for padded rows. For a symmetric
    plan the second result holds the contributions seen through the columns of the r < c tiles;
    merge the two with ``logaddexp``.
    """
    r_idx, c_idx = (jnp.asarray(a) for a in plan.pairs())
    dtype = u.dtype
    init = jnp.full((plan.n_pad,), -jnp.inf, dtype), jnp.zeros((plan.n_pad,), dtype)

    def body(t, carry):
        m_row, l_row, m_col, l_col = carry
        r, c = r_idx[t], c_idx[t]
        _, _, logits, mask = _tile(u, v, scale, plan, r, c)
        tile = jnp.where(mask, logits, -jnp.inf)
        m_row, l_row = _online_lse_update(m_row, l_row, r * plan.block, tile, 1, plan.block)
        if plan.symmetric:  # a diagonal tile's columns are its rows: count them once
            tile = jnp.where(r == c, -jnp.inf, tile)
        m_col, l_col = _online_lse_update(m_col, l_col, c * plan.block, tile, 0, plan.block)
        return m_row, l_row, m_col, l_col

    m_row, l_row, m_col, l_col = lax.fori_loop(0, r_idx.shape[0], body, init + init)

    def finish(m, total):
        nonempty = total > 0
        return jnp.where(nonempty, m + jnp.log(jnp.where(nonempty, total, 1.0)), -jnp.inf)

    return finish(m_row, l_row), finish(m_col, l_col)


def tiled_logit_grad_products(
    u: Array,
    v: Array,
    scale: Array,
    lse_row: Array,
    lse_col: Array,
    pos_row: Array,
    pos_col: Array,
    alpha: Array,
    beta: Array,
    plan: TilePlan,
) -> tuple[Array, Array, Array]:
    """``s Gamma V``, ``s Gamma^T U`` over the negatives, and ``sum Gamma * S`` in full.

    ``Gamma_ij = alpha exp(S_ij - lse_row_i) + beta exp(S_ij - lse_col_j)`` on negatives (0 on
    excluded entries), where ``lse_row`` / ``lse_col`` are the full log-sum-exps (positives
    included) so that the exponentials are the softmax probabilities of 000 P6. For a symmetric
    plan the column term is dropped on diagonal tiles (it is the transpose of their row term).

    The third result is ``sum_ij Gamma_ij S_ij`` including the positives' entries, evaluated as
    ``sum alpha P_r (S - pos_row) + beta P_c (S - pos_col)`` over the negatives: each row of
    ``P_r - I`` (column of ``P_c - I``) sums to zero, so centring on the positive logit is exact
    and avoids cancelling large terms (the logit-scale gradient of 000 P8).
    """
    r_idx, c_idx = (jnp.asarray(a) for a in plan.pairs())
    b = plan.block

    def body(t, carry):
        g_u, g_v, total = carry
        r, c = r_idx[t], c_idx[t]
        u_r, v_c, logits, mask = _tile(u, v, scale, plan, r, c)
        tile = jnp.where(mask, logits, -jnp.inf)
        row_lse = lax.dynamic_slice_in_dim(lse_row, r * b, b)[:, None]
        col_lse = lax.dynamic_slice_in_dim(lse_col, c * b, b)[None, :]
        col_weight = jnp.where(r == c, 0.0, beta) if plan.symmetric else beta
        p_row, p_col = alpha * jnp.exp(tile - row_lse), col_weight * jnp.exp(tile - col_lse)
        gamma = p_row + p_col
        d_u = scale * jnp.matmul(gamma, v_c, precision=MATMUL_PRECISION)
        d_v = scale * jnp.matmul(gamma.T, u_r, precision=MATMUL_PRECISION)
        g_u = lax.dynamic_update_slice_in_dim(
            g_u, lax.dynamic_slice_in_dim(g_u, r * b, b) + d_u, r * b, 0)
        g_v = lax.dynamic_update_slice_in_dim(
            g_v, lax.dynamic_slice_in_dim(g_v, c * b, b) + d_v, c * b, 0)
        centred = (p_row * (logits - lax.dynamic_slice_in_dim(pos_row, r * b, b)[:, None])
                   + p_col * (logits - lax.dynamic_slice_in_dim(pos_col, c * b, b)[None, :]))
        total = total + jnp.sum(jnp.where(mask, centred, 0.0))
        return g_u, g_v, total

    init = (jnp.zeros_like(u), jnp.zeros_like(v), jnp.zeros((), u.dtype))
    return lax.fori_loop(0, r_idx.shape[0], body, init)


# ------------------------------------------------------------------------------------ CLIP


_DIRECTION_WEIGHTS = {"both": (0.5, 0.5), "x_to_y": (1.0, 0.0), "y_to_x": (0.0, 1.0)}


def _clip_stats(x, y, log_scale, max_scale, block_size):
    x_hat, y_hat = l2_normalize(x), l2_normalize(y)
    scale = logit_scale(log_scale, max_scale)
    positive = scale * jnp.sum(x_hat * y_hat, axis=1)
    plan = make_plan(x.shape[0], block_size, symmetric=False, exclude="diagonal")
    u, v = pad_rows(x_hat, plan), pad_rows(y_hat, plan)
    lse_row, lse_col = negative_logsumexps(u, v, scale, plan)
    n = plan.n
    return x_hat, y_hat, scale, positive, lse_row[:n], lse_col[:n], plan


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def clip_loss_tiled(x, y, log_scale, max_scale, direction, block_size):
    """Tiled ``clip_loss`` on float arrays already in the compute dtype (see ``clip_loss``)."""
    return _clip_tiled_fwd(x, y, log_scale, max_scale, direction, block_size)[0]


def _clip_tiled_fwd(x, y, log_scale, max_scale, direction, block_size):
    _, _, _, positive, lse_row, lse_col, _ = _clip_stats(x, y, log_scale, max_scale, block_size)
    w_row, w_col = _DIRECTION_WEIGHTS[direction]
    loss = (w_row * jnp.mean(jax.nn.softplus(lse_row - positive))
            + w_col * jnp.mean(jax.nn.softplus(lse_col - positive)))
    return loss, (x, y, log_scale, positive, lse_row, lse_col)


def _clip_tiled_bwd(max_scale, direction, block_size, residuals, g):
    x, y, log_scale, positive, lse_row, lse_col = residuals
    n = x.shape[0]
    x_hat, y_hat = l2_normalize(x), l2_normalize(y)
    scale = logit_scale(log_scale, max_scale)
    plan = make_plan(n, block_size, symmetric=False, exclude="diagonal")
    w_row, w_col = _DIRECTION_WEIGHTS[direction]
    alpha, beta = g * w_row / n, g * w_col / n
    pad = lambda a: jnp.pad(a, (0, plan.n_pad - n))  # noqa: E731
    g_u, g_v, total = tiled_logit_grad_products(
        pad_rows(x_hat, plan), pad_rows(y_hat, plan), scale,
        pad(jnp.logaddexp(lse_row, positive)), pad(jnp.logaddexp(lse_col, positive)),
        pad(positive), pad(positive), alpha, beta, plan)
    # The positives: Gamma_ii = -(alpha (1 - p^r_ii) + beta (1 - p^c_ii)), in O(n d).
    gamma_ii = -(alpha * jax.nn.sigmoid(lse_row - positive)
                 + beta * jax.nn.sigmoid(lse_col - positive))
    g_x_hat = g_u[:n] + scale * gamma_ii[:, None] * y_hat
    g_y_hat = g_v[:n] + scale * gamma_ii[:, None] * x_hat
    g_log_scale = jnp.where(clip_active(log_scale, max_scale), 0.0, total).astype(log_scale.dtype)
    return l2_normalize_vjp(x, g_x_hat), l2_normalize_vjp(y, g_y_hat), g_log_scale


clip_loss_tiled.defvjp(_clip_tiled_fwd, _clip_tiled_bwd)


# ---------------------------------------------------------------------------------- NT-Xent


def _nt_xent_stats(z, temperature, block_size):
    m = z.shape[0]
    z_hat = l2_normalize(z)
    positive = jnp.sum(z_hat * jnp.roll(z_hat, m // 2, axis=0), axis=1) / temperature
    plan = make_plan(m, block_size, symmetric=True, exclude="nt_xent")
    u = pad_rows(z_hat, plan)
    lse_row, lse_col = negative_logsumexps(u, u, 1.0 / temperature, plan)
    return z_hat, positive, jnp.logaddexp(lse_row, lse_col)[:m], plan


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def nt_xent_tiled(z, temperature, block_size):
    """Tiled ``nt_xent`` on the stacked views ``z = [z1; z2]`` (2N, d) in the compute dtype."""
    return _nt_xent_tiled_fwd(z, temperature, block_size)[0]


def _nt_xent_tiled_fwd(z, temperature, block_size):
    _, positive, lse_neg, _ = _nt_xent_stats(z, temperature, block_size)
    return jnp.mean(jax.nn.softplus(lse_neg - positive)), (z, temperature, positive, lse_neg)


def _nt_xent_tiled_bwd(block_size, residuals, g):
    z, temperature, positive, lse_neg = residuals
    m = z.shape[0]
    z_hat = l2_normalize(z)
    plan = make_plan(m, block_size, symmetric=True, exclude="nt_xent")
    alpha = g / m
    u = pad_rows(z_hat, plan)
    pad = lambda a: jnp.pad(a, (0, plan.n_pad - m))  # noqa: E731
    lse_all, pos = pad(jnp.logaddexp(lse_neg, positive)), pad(positive)
    g_u, g_v, total = tiled_logit_grad_products(u, u, 1.0 / temperature, lse_all, lse_all,
                                                pos, pos, alpha, alpha, plan)
    # Partners: G_{i, pi(i)} = -alpha (1 - p_{i, pi(i)}); (G + G^T) Z_hat with pi an involution.
    gamma = -alpha * jax.nn.sigmoid(lse_neg - positive)
    weighted = gamma[:, None] * z_hat
    g_z_hat = g_u[:m] + g_v[:m] + (gamma[:, None] * jnp.roll(z_hat, m // 2, axis=0)
                                   + jnp.roll(weighted, m // 2, axis=0)) / temperature
    g_temperature = (-total / temperature).astype(temperature.dtype)
    return l2_normalize_vjp(z, g_z_hat), g_temperature


nt_xent_tiled.defvjp(_nt_xent_tiled_fwd, _nt_xent_tiled_bwd)
