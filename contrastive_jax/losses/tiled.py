"""Tiled contrastive losses that never build the N x N logit matrix.

The engine behind ``clip_loss(..., impl="tiled")`` and ``nt_xent(..., impl="tiled")``.

Forward. The rows ``U`` and columns ``V`` (both L2-normalised, (n, d)) are cut into blocks of
``b`` rows; a ``lax.fori_loop`` visits tile pairs ``(r, c)``, forms the (b, b) tile
``S = s U_r V_c^T`` and folds it into a running max and sum per row and per column (the online
log-sum-exp). Only these O(n) statistics, over the *negatives* (the positive is masked out of
every tile and its logit is computed directly as a row-wise dot product), are kept. Each loss is
then ``softplus(lse_negatives - S_positive)``, as in the dense losses.

Backward (``jax.custom_vjp``; docs/derivations.md §13.3, with §8.3-8.4). Each tile is recomputed and
its block of
``Gamma = alpha (P_r - I) + beta (P_c - I)`` formed from the stored statistics,
``P_r = exp(S - lse_row)``, ``P_c = exp(S - lse_col)``; then ``grad_U_r += s Gamma_tile V_c``
and ``grad_V_c += s Gamma_tile^T U_r``. The positives' entries ``p_ii - 1 = -sigmoid(lse_neg -
S_ii)`` are applied outside the tiles in O(n d), and ``sum Gamma * S`` gives the logit-scale
gradient (docs/derivations.md §8.5). Four matmuls per tile in all (one forward, three backward). The
loop runs row block by row block, so each block of ``grad_U`` is complete when its inner loop over
the columns ends and goes through the normalisation's Jacobian (docs/derivations.md §2.2) straight
into the returned gradient; ``grad_V`` is accumulated in place in the array that is returned.

NT-Xent's similarity ``S = Z_hat Z_hat^T / tau`` is symmetric, so only the tiles with ``r <= c``
are visited: tile ``(r, c)`` serves as row block ``r`` and, through its columns, as row block
``c``; the two partial statistics are merged at the end. This halves the work. The two views
stay two arrays (the two parts of a :class:`~contrastive_jax.losses.tile_kernels.TilePlan`).

Memory: nothing of size (n, d) beyond the inputs and the returned gradients (no padded or
normalised copy, no accumulator besides the output: when the block size does not divide n the
last block overlaps the one before instead of padding), O(n) statistics and O(b^2 + b d) in
flight per tile. ``tests/test_tiled.py`` checks the compiled program's scratch memory;
``benchmarks/loss_bench.py`` measures the process.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from contrastive_jax.losses.normalize import clamped_norms, l2_normalize_vjp
from contrastive_jax.losses.similarity import MATMUL_PRECISION
from contrastive_jax.losses.temperature import clip_active, logit_scale
from contrastive_jax.losses.tile_kernels import (
    DIRECTION_WEIGHTS,
    Normaliser,
    RowWeights,
    TilePlan,
    make_plan,
    merge,
    negative_probabilities,
    negatives_mask,
    negatives_minus_positive,
    positives_mask,
    put,
    take,
    tile_logit_grad,
    tile_normaliser,
)

Array = jax.Array
Parts = tuple[Array, ...]

# Rows per tile. On 2 CPU cores at N = 16384, d = 512 (experiments/results/block_sweep.md),
# blocks of 512, 1024 and 2048 ran within run-to-run noise of each other (6.2-7.2 s per
# forward+backward); JAX_NOTES.md found 256-wide tiles clearly slower and full-height strips
# slower at large N. 1024 keeps a tile at 4 MB of float32 and the loop at N^2 / 1024^2 steps.
DEFAULT_BLOCK_SIZE = 1024


def read_block(parts: Parts, r: Array, plan: TilePlan) -> Array:
    """The (b, ...) rows of block ``r`` of an array kept as its parts (one dynamic slice)."""
    part, local = plan.locate(r)
    if len(parts) == 1:
        return lax.dynamic_slice_in_dim(parts[0], local, plan.block)
    return jnp.where(part == 0, lax.dynamic_slice_in_dim(parts[0], local, plan.block),
                     lax.dynamic_slice_in_dim(parts[1], local, plan.block))


def update_block(parts: Parts, r: Array, plan: TilePlan, fn: Callable[[Array], Array]) -> Parts:
    """Replace the rows that block ``r`` owns, ``g``, by ``fn(g)``, in place.

    Rows of the block that it does not own (the overlap of a part's last block) keep their
    value. Each part reads and writes only itself (``fn`` is applied to the candidate block of
    each part and kept where the block lies), so XLA never copies a part to order a read of one
    against a write of another.
    """
    part, local = plan.locate(r)
    keep = plan.owned(r)[:, None]
    out = []
    for i, p in enumerate(parts):
        current = lax.dynamic_slice_in_dim(p, local, plan.block)
        here = keep & (part == i) if len(parts) > 1 else keep
        out.append(lax.dynamic_update_slice_in_dim(
            p, jnp.where(here, fn(current), current), local, 0))
    return tuple(out)


class Rows(NamedTuple):
    """Raw embeddings by parts, each (n / parts, d), and their clamped norms (n / parts,).

    ``x_hat = x / norm``. Each block of rows is normalised when its tile is formed (``b d``
    divisions against the tile's ``b^2 d`` multiply-adds), bit for bit as :func:`l2_normalize`
    would, so no (n, d) copy of the normalised embeddings exists in either pass.
    """

    x: Parts
    norm: Parts


def _rows(parts: Parts) -> Rows:
    return Rows(tuple(parts), tuple(clamped_norms(p) for p in parts))


def _hat(rows: Rows, r: Array, plan: TilePlan) -> Array:
    """Block ``r`` of the normalised rows."""
    return read_block(rows.x, r, plan) / read_block(rows.norm, r, plan)[:, None]


def negative_normalisers(
    u: Rows, v: Rows, to_logits: Callable[[Array], Array], plan: TilePlan
) -> tuple[Normaliser, Normaliser, Array]:
    """Per row and per column, the normaliser of ``exp(S_ij)`` over the negatives, without S.

    Rows -> two :class:`~contrastive_jax.losses.tile_kernels.Normaliser` of (n,) and the positives'
    cosines (n,), read off the same tiles so that they carry exactly the rounding of the
    negatives' logits (a separate row-wise dot product differs by ~1e-7, which a logit scale of
    100 turns into ~1e-5 of a small loss). A block's rows that it does not own see only masked
    entries, an empty normaliser, which :func:`merge` leaves bit for bit unchanged. For a
    symmetric plan the second normaliser holds what the rows of block ``c`` see through the
    columns of the ``r < c`` tiles: :func:`merge` the two.
    """
    r_idx, c_idx = (jnp.asarray(a) for a in plan.pairs())
    b = plan.block
    dtype = u.x[0].dtype
    empty = Normaliser(jnp.full((plan.n,), -jnp.inf, dtype), jnp.zeros((plan.n,), dtype))

    def add(positive, start, values):
        return lax.dynamic_update_slice_in_dim(
            positive, lax.dynamic_slice_in_dim(positive, start, b) + values, start, 0)

    def body(t, carry):
        rows, cols, positive = carry
        r, c = r_idx[t], c_idx[t]
        r0, c0 = plan.start(r), plan.start(c)
        cosines = jnp.matmul(_hat(u, r, plan), _hat(v, c, plan).T, precision=MATMUL_PRECISION)
        pos = jnp.where(positives_mask(plan, r, c), cosines, 0.0)
        positive = add(positive, r0, pos.sum(axis=1))
        tile = jnp.where(negatives_mask(plan, r, c), to_logits(cosines), -jnp.inf)
        rows = put(rows, merge(take(rows, r0, b), tile_normaliser(tile, 1)), r0)
        if plan.symmetric:  # a diagonal tile's columns are its rows: count them once
            off_diagonal = r != c
            tile = jnp.where(off_diagonal, tile, -jnp.inf)
            positive = add(positive, c0, jnp.where(off_diagonal, pos.sum(axis=0), 0.0))
        cols = put(cols, merge(take(cols, c0, b), tile_normaliser(tile, 0)), c0)
        return rows, cols, positive

    init = (empty, empty, jnp.zeros((plan.n,), dtype))
    return lax.fori_loop(0, r_idx.shape[0], body, init)


def tiled_logit_grad_products(
    u: Rows,
    v: Rows,
    to_logits: Callable[[Array], Array],
    row_weights: RowWeights,
    col_weights: RowWeights,
    positive_cos: Array,
    plan: TilePlan,
    col_init: Parts,
    finish_rows: Callable[[Array, Array], Array],
    finish_cols: Callable[[Array, Array], Array] | None = None,
) -> tuple[Parts, Parts, Array]:
    """Finished row blocks of ``Gamma V_hat``, column blocks of ``Gamma^T U_hat``, ``sum Gamma*C``.

    Tile by tile with :func:`contrastive_jax.losses.tile_kernels.tile_logit_grad`, over the
    negatives;
    ``positive_cos`` (n,) are the positives' cosines. The loop runs over row blocks ``r`` and,
    inside, over column blocks ``c``. Row block ``r`` of ``Gamma V_hat`` is complete when its
    inner loop ends, so it is summed in a (b, d) carry and handed at once to
    ``finish_rows(r, g) -> (b, d)`` (the positives' terms and the normalisation's Jacobian, both
    row-wise), whose result is written straight into the output. The column side is
    accumulated in place over ``col_init`` (the positives' column terms, parts like ``v.x``)
    and, if ``finish_cols`` is given, finished block by block in place: the pass allocates its
    two gradients and nothing else of size (n, d).

    For a symmetric plan (``u is v``, tiles ``r <= c``) the column term is dropped on diagonal
    tiles (it is the transpose of their row term), and row block ``r`` is finished with the
    column contributions it received from tiles ``(r', r)``, ``r' <= r`` (all visited by then)
    and written over them, as no later tile touches it: rows and columns share one array.
    Returns (finished rows, columns, ``sum Gamma * C``), the arrays as parts.
    """
    b = plan.block

    def row_block(r, carry):
        out, g_v, total = carry
        u_r = _hat(u, r, plan)
        r0 = plan.start(r)
        row_w = take(row_weights, r0, b)
        pos_r = lax.dynamic_slice_in_dim(positive_cos, r0, b)

        def tile(c, inner):
            g_r, g_v, total = inner
            v_c = _hat(v, c, plan)
            c0 = plan.start(c)
            cosines = jnp.matmul(u_r, v_c.T, precision=MATMUL_PRECISION)
            col_w = take(col_weights, c0, b)
            if plan.symmetric:
                col_w = RowWeights(col_w.shift, jnp.where(r == c, 0.0, col_w.weight))
            gamma, part = tile_logit_grad(cosines, to_logits(cosines), negatives_mask(plan, r, c),
                                          row_w, col_w, pos_r,
                                          lax.dynamic_slice_in_dim(positive_cos, c0, b))
            g_r = g_r + jnp.matmul(gamma, v_c, precision=MATMUL_PRECISION)
            d_v = jnp.matmul(gamma.T, u_r, precision=MATMUL_PRECISION)
            g_v = update_block(g_v, c, plan, lambda g: g + d_v)
            return g_r, g_v, total + part

        first = r if plan.symmetric else 0
        g_r, g_v, total = lax.fori_loop(first, plan.num_blocks, tile,
                                        (jnp.zeros_like(u_r), g_v, total))
        if plan.symmetric:
            g_v = update_block(g_v, r, plan, lambda g: finish_rows(r, g_r + g))
        else:
            out = update_block(out, r, plan, lambda _: finish_rows(r, g_r))
        return out, g_v, total

    out = () if plan.symmetric else tuple(jnp.zeros_like(p) for p in u.x)
    out, g_v, total = lax.fori_loop(0, plan.num_blocks, row_block,
                                    (out, col_init, jnp.zeros((), u.x[0].dtype)))
    if finish_cols is not None:
        def col_block(c, g_v):
            return update_block(g_v, c, plan, lambda g: finish_cols(c, g))

        g_v = lax.fori_loop(0, plan.num_blocks, col_block, g_v)
    return (g_v if plan.symmetric else out), g_v, total


# ------------------------------------------------------------------------------------ CLIP


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def clip_loss_tiled(x, y, log_scale, max_scale, direction, block_size):
    """Tiled ``clip_loss`` on float arrays already in the compute dtype (see ``clip_loss``)."""
    return _clip_tiled_fwd(x, y, log_scale, max_scale, direction, block_size)[0]


def _clip_plan(n, block_size):
    return make_plan(n, block_size, symmetric=False, exclude="diagonal")


def _clip_tiled_fwd(x, y, log_scale, max_scale, direction, block_size):
    plan = _clip_plan(x.shape[0], block_size)
    scale = logit_scale(log_scale, max_scale)
    rows, cols, positive_cos = negative_normalisers(_rows((x,)), _rows((y,)),
                                                    lambda c: scale * c, plan)
    positive = scale * positive_cos
    w_row, w_col = DIRECTION_WEIGHTS[direction]
    loss = (w_row * jnp.mean(jax.nn.softplus(negatives_minus_positive(rows, positive)))
            + w_col * jnp.mean(jax.nn.softplus(negatives_minus_positive(cols, positive))))
    return loss, (x, y, log_scale, positive_cos, rows, cols)


def _clip_tiled_bwd(max_scale, direction, block_size, residuals, g):
    x, y, log_scale, positive_cos, rows, cols = residuals
    n = x.shape[0]
    plan = _clip_plan(n, block_size)
    scale = logit_scale(log_scale, max_scale)
    positive = scale * positive_cos
    u, v = _rows((x,)), _rows((y,))
    w_row, w_col = DIRECTION_WEIGHTS[direction]
    alpha, beta = g * w_row / n, g * w_col / n
    # The positives: Gamma_ii = -(alpha (1 - p^r_ii) + beta (1 - p^c_ii)), in O(n d).
    gamma_ii = -(alpha * jax.nn.sigmoid(negatives_minus_positive(rows, positive))
                 + beta * jax.nn.sigmoid(negatives_minus_positive(cols, positive)))[:, None]

    def finish_rows(r, g_r):  # grad_x of a row block: its positives, then the normalisation
        gamma = lax.dynamic_slice_in_dim(gamma_ii, plan.start(r), plan.block)
        g_hat = scale * (g_r + gamma * _hat(v, r, plan))
        return l2_normalize_vjp(read_block(u.x, r, plan), g_hat)

    def finish_cols(c, g_c):  # grad_y of a column block (its positives are in col_init)
        return l2_normalize_vjp(read_block(v.x, c, plan), scale * g_c)

    (g_x,), (g_y,), total = tiled_logit_grad_products(
        u, v, lambda c: scale * c, negative_probabilities(rows, positive, alpha),
        negative_probabilities(cols, positive, beta), positive_cos, plan,
        (gamma_ii * (x / u.norm[0][:, None]),), finish_rows, finish_cols)
    g_log_scale = jnp.where(clip_active(log_scale, max_scale), 0.0, scale * total)
    return g_x, g_y, g_log_scale.astype(log_scale.dtype)


clip_loss_tiled.defvjp(_clip_tiled_fwd, _clip_tiled_bwd)


# ---------------------------------------------------------------------------------- NT-Xent


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def nt_xent_tiled(z1, z2, temperature, block_size):
    """Tiled ``nt_xent`` on the two views (N, d) each, in the compute dtype.

    The views stay two arrays (two parts of the tile plan), never stacked into a (2N, d) copy.
    """
    return _nt_xent_tiled_fwd(z1, z2, temperature, block_size)[0]


def _nt_xent_plan(n, block_size):
    return make_plan(2 * n, block_size, symmetric=True, exclude="nt_xent", parts=2)


def _nt_xent_tiled_fwd(z1, z2, temperature, block_size):
    plan = _nt_xent_plan(z1.shape[0], block_size)
    u = _rows((z1, z2))
    rows, cols, positive_cos = negative_normalisers(u, u, lambda c: c / temperature, plan)
    negatives = merge(rows, cols)
    positive = positive_cos / temperature
    loss = jnp.mean(jax.nn.softplus(negatives_minus_positive(negatives, positive)))
    return loss, (z1, z2, temperature, positive_cos, negatives)


def _nt_xent_tiled_bwd(block_size, residuals, g):
    z1, z2, temperature, positive_cos, negatives = residuals
    n = z1.shape[0]
    plan = _nt_xent_plan(n, block_size)
    positive = positive_cos / temperature
    alpha = g / (2 * n)
    u = _rows((z1, z2))
    weights = negative_probabilities(negatives, positive, alpha)
    # Partners: G_{i, pi(i)} = -alpha (1 - p_{i, pi(i)}). Row i of either view gets
    # (G_{i, pi(i)} + G_{pi(i), i}) z_hat_{pi(i)} from (G + G^T) Z_hat: O(n d), the start of
    # the accumulator.
    partner = -alpha * jax.nn.sigmoid(negatives_minus_positive(negatives, positive))
    both = (partner[:n] + partner[n:])[:, None]
    col_init = (both * (z2 / u.norm[1][:, None]), both * (z1 / u.norm[0][:, None]))

    def finish_rows(r, g_r):  # rows of (G + G^T) Z_hat / tau through the normalisation
        return l2_normalize_vjp(read_block(u.x, r, plan), g_r / temperature)

    (g_z1, g_z2), _, total = tiled_logit_grad_products(
        u, u, lambda c: c / temperature, weights, weights, positive_cos, plan, col_init,
        finish_rows)
    g_temperature = (-total / temperature**2).astype(temperature.dtype)
    return g_z1, g_z2, g_temperature


nt_xent_tiled.defvjp(_nt_xent_tiled_fwd, _nt_xent_tiled_bwd)
