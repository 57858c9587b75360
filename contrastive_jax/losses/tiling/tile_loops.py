"""Loops over the tile pairs of two chunks: the forward statistics and the backward gradients.

A pass meets the rows of the chunks ``R`` with the rows of the chunks ``C`` (tuples of chunks
of equal length: CLIP's ``x`` against ``y``, NT-Xent's two views against two views) in
``(b, b)`` tiles (:mod:`contrastive_jax.losses.tiling.tile`), in one ``lax.fori_loop`` over all
the tiles of all the pairs of chunks, recomputing each tile and keeping only per-row state:
O(n d) memory for the chunks and their gradients, O(b^2 + b d) per tile, no (n, n) array
(docs/derivations.md §13). One loop (not one per pair of chunks) keeps a single tile live.

- :func:`stats_pass` folds each tile into the running statistics of ``R``'s anchors (its rows)
  and of ``C``'s anchors (its columns);
- :func:`grad_pass` forms each tile of ``Gamma = dL/dS`` from the final statistics' weights and
  accumulates ``Gamma C_hat`` into ``R``'s gradient, ``Gamma^T R_hat`` into ``C``'s, and
  ``sum Gamma * C`` (``dL/ds``); four matmuls per tile in all with the forward's one;
- :func:`sigmoid_pass` does SigLIP's per-pair terms, value and gradient in one pass;
- :func:`l2_normalize_vjp_blockwise` takes an accumulated gradient through the normalisation
  (§2.2), in place.

``C=None`` meets ``R`` with itself (NT-Xent): the similarity is symmetric, so only the tiles
``(i, r) <= (j, c)`` (chunk, block) are visited; a tile serves its row block through its rows
and its column block through its columns (not on the diagonal, which its rows already cover),
and within a chunk the anchor itself is masked. Half the work.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from contrastive_jax.losses.parts.normalize import l2_normalize_vjp
from contrastive_jax.losses.parts.similarity import MATMUL_PRECISION
from contrastive_jax.losses.tiling.tile import (
    Chunk,
    Stats,
    Weights,
    blocks,
    cosines,
    infonce_tile_grad,
    masks,
    merge_stats,
    read_block,
    select_part,
    sigmoid_tile,
    slice_rows,
    tile_stats,
    varying_like,
    write_rows,
)

Array = jax.Array


Chunks = tuple[Chunk, ...]


class _Tile:
    """What a loop body sees of a tile: the blocks, cosines, masks, which chunks and rows."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


def _loop(R: Chunks, C: Chunks | None, block: int, body, carry, positives=True):
    """``body(tile, carry, positives)`` over every tile of ``R`` x ``C`` (``C=None``: ``R`` x
    ``R``, the tiles on and above the diagonal of the blocks of all its chunks).

    ``positives``: whether a tile can hold a positive, a bool or a static function of the two
    chunks' indices; the tiles are visited in one loop per answer (at most two, one after the
    other), each with the answer static in its body.
    """
    symmetric = C is None
    C = R if symmetric else C
    plan = blocks(R[0].x.shape[0], block)
    gr, gc = np.divmod(np.arange(len(R) * plan.count * len(C) * plan.count),
                       len(C) * plan.count)
    if symmetric:
        keep = gr <= gc
        gr, gc = gr[keep], gc[keep]
    may = positives if callable(positives) else (lambda i, j: positives)
    groups = np.array([bool(may(i, j)) for i, j in zip(gr // plan.count, gc // plan.count,
                                                       strict=True)])

    def run(carry, rows, cols, flag):
        rows, cols = jnp.asarray(rows, jnp.int32), jnp.asarray(cols, jnp.int32)

        def step(t, carry):
            i, r = jnp.divmod(rows[t], plan.count)
            j, c = jnp.divmod(cols[t], plan.count)
            r_hat, r_ids = read_block(R, plan, i, r)
            c_hat, c_ids = read_block(C, plan, j, c)
            pos, neg = masks(plan, r, c, r_ids, c_ids, symmetric and (i == j))
            tile = _Tile(r_hat=r_hat, c_hat=c_hat, cos=cosines(r_hat, c_hat), pos=pos, neg=neg,
                         i=i, j=j, r0=plan.start(r), c0=plan.start(c), block=plan.block,
                         off_diagonal=rows[t] != cols[t])
            return body(tile, carry, flag)

        return lax.fori_loop(0, rows.shape[0], step, varying_like(carry, R[0].x))

    for flag in (False, True):
        if np.any(groups == flag):
            carry = run(carry, gr[groups == flag], gc[groups == flag], flag)
    return carry


def _update(parts: tuple, k: Array, start: Array, size: int, fn) -> tuple:
    """``parts[k][start:start + size] = fn(that block)``, each part reading and writing only
    itself (so XLA never copies one part to order it against another)."""
    out = []
    for index, part in enumerate(parts):
        current = slice_rows(part, start, size)
        new = jax.tree.map(lambda a, b, index=index: jnp.where(k == index, a, b), fn(current),
                           current)
        out.append(write_rows(part, new, start))
    return tuple(out)


def stats_pass(R: Chunks, C: Chunks | None, scale: Array, block: int, *,
               row_stats: tuple[Stats, ...] | None, col_stats: tuple[Stats, ...] | None,
               positives: bool = True) -> tuple:
    """Fold the tiles of ``R`` x ``C`` into ``row_stats`` (``R``'s anchors) and ``col_stats``
    (``C``'s anchors), one :class:`~contrastive_jax.losses.tiling.tile.Stats` per chunk;
    ``None`` skips a side. ``C=None``: ``R`` against itself, its columns being its own anchors
    (``col_stats`` unused). ``positives`` (static; a bool or a function of the two chunks'
    indices): whether a pair of chunks can hold a positive; where not, a pass over each tile
    is saved."""
    symmetric = C is None

    def body(tile, carry, positives):
        rs, cs = carry
        logits = scale * tile.cos

        def fold(new):
            return lambda old: merge_stats(old, new)

        if rs is not None:
            rs = _update(rs, tile.i, tile.r0, tile.block,
                         fold(tile_stats(logits, tile.pos, tile.neg, 1, positives)))
        if symmetric:  # the columns are anchors of R too, but not on a diagonal tile
            off = tile.off_diagonal
            new = tile_stats(logits, tile.pos & off, tile.neg & off, 0, positives)
            rs = _update(rs, tile.j, tile.c0, tile.block, fold(new))
        elif cs is not None:
            cs = _update(cs, tile.j, tile.c0, tile.block,
                         fold(tile_stats(logits, tile.pos, tile.neg, 0, positives)))
        return rs, cs

    return _loop(R, C, block, body, (row_stats, None if symmetric else col_stats), positives)


def _matmul(a: Array, b: Array) -> Array:
    return jnp.matmul(a, b, precision=MATMUL_PRECISION)


def _adder(values: Array):
    return lambda g: g + values


def grad_pass(R: Chunks, C: Chunks | None, scale: Array, block: int, *,
              row_w: tuple[Weights, ...] | None, col_w: tuple[Weights, ...] | None,
              g_r: tuple[Array, ...], g_c: tuple[Array, ...] | None,
              positives: bool = True) -> tuple:
    """Accumulate ``Gamma C_hat`` into ``g_r``, ``Gamma^T R_hat`` into ``g_c`` (per chunk) and
    return ``(g_r, g_c, sum Gamma * C)``; ``Gamma`` holds the anchors of the sides whose
    weights are given. ``C=None``: ``R`` against itself (``col_w``, ``g_c`` unused: the
    columns' anchors are the rows')."""
    symmetric = C is None

    def body(tile, carry, positives):
        g_r, g_c, total = carry
        logits = scale * tile.cos
        rw = None if row_w is None else slice_rows(select_part(row_w, tile.i), tile.r0, tile.block)
        if symmetric:  # the columns' anchors are the rows', but not on a diagonal tile
            cw = slice_rows(select_part(row_w, tile.j), tile.c0, tile.block)
            off = tile.off_diagonal
            cw = cw._replace(neg_w=cw.neg_w * off, pos_w=cw.pos_w * off)
        else:
            cw = None if col_w is None else slice_rows(select_part(col_w, tile.j), tile.c0,
                                                       tile.block)
        gamma, part = infonce_tile_grad(tile.cos, logits, tile.pos, tile.neg, rw, cw, positives)
        g_r = _update(g_r, tile.i, tile.r0, tile.block, _adder(_matmul(gamma, tile.c_hat)))
        if symmetric:
            g_r = _update(g_r, tile.j, tile.c0, tile.block, _adder(_matmul(gamma.T, tile.r_hat)))
        elif g_c is not None:
            g_c = _update(g_c, tile.j, tile.c0, tile.block, _adder(_matmul(gamma.T, tile.r_hat)))
        return g_r, g_c, total + part

    zero = jnp.zeros((), R[0].x.dtype)
    return _loop(R, C, block, body, (g_r, None if symmetric else g_c, zero), positives)


def sigmoid_pass(R: Chunks, C: Chunks, scale: Array, bias: Array, block: int, coeff=None,
                 g_r: tuple[Array, ...] | None = None, g_c: tuple[Array, ...] | None = None):
    """SigLIP over ``R`` x ``C`` (§11): ``sum_ij softplus(-z_ij (s c_ij + b))``, and with
    ``coeff`` its gradient in the same pass (a pair's ``dL/dl`` needs no statistics): returns
    ``(loss, g_r + Gamma C_hat, g_c + Gamma^T R_hat, sum Gamma * C, sum Gamma)``, ``Gamma =
    coeff dL/dl``. Three matmuls per tile for the value and the gradient."""
    gradients = coeff is not None

    def body(tile, carry, _):
        total, g_r, g_c, d_scale, d_bias = carry
        part, gamma = sigmoid_tile(scale * tile.cos + bias, tile.pos, tile.neg,
                                   coeff if gradients else 0.0)
        if gradients:
            g_r = _update(g_r, tile.i, tile.r0, tile.block, _adder(_matmul(gamma, tile.c_hat)))
            g_c = _update(g_c, tile.j, tile.c0, tile.block,
                          _adder(_matmul(gamma.T, tile.r_hat)))
            d_scale, d_bias = d_scale + jnp.sum(gamma * tile.cos), d_bias + jnp.sum(gamma)
        return total + part, g_r, g_c, d_scale, d_bias

    zero = jnp.zeros((), R[0].x.dtype)
    return _loop(R, C, block, body, (zero, g_r, g_c, zero, zero))


def l2_normalize_vjp_blockwise(chunk: Chunk, g: Array, scale: Array, block: int) -> Array:
    """``l2_normalize_vjp(x, scale * g)`` block by block, in place (each row once)."""
    plan = blocks(chunk.x.shape[0], block)

    def body(r, g):
        start = plan.start(r)
        current = lax.dynamic_slice_in_dim(g, start, plan.block)
        x = lax.dynamic_slice_in_dim(chunk.x, start, plan.block)
        done = l2_normalize_vjp(x, scale * current)
        keep = plan.owned(r)[:, None]
        return lax.dynamic_update_slice_in_dim(g, jnp.where(keep, done, current), start, 0)

    return lax.fori_loop(0, plan.count, body, g)
