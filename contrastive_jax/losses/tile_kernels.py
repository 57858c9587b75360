"""Per-tile math shared by the dense analytic and the tiled losses.

A *tile* is a block ``S = s U_r V_c^T`` of the logit matrix, with a boolean mask of the entries
that are negatives (real rows and columns, not the anchor itself, not its positive). The dense
analytic backward passes treat the whole matrix as one tile; the tiled losses loop over many.
Every positive is handled outside the tiles, by its own logit, so that each loss and each
``p_pos - 1`` is formed relative to the positive (``softplus(lse_neg - S_pos)``,
``-sigmoid(lse_neg - S_pos)``) and keeps full relative precision.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from contrastive_jax.losses.similarity import MATMUL_PRECISION

Array = jax.Array

# Weights (row, column) of the two InfoNCE directions of the symmetric loss.
DIRECTION_WEIGHTS = {"both": (0.5, 0.5), "x_to_y": (1.0, 0.0), "y_to_x": (0.0, 1.0)}


class TilePlan(NamedTuple):
    """Static layout: ``n`` rows in ``parts`` equal parts, each cut into blocks of ``block`` rows.

    CLIP has one part; the tiled NT-Xent has two (the views ``z1``, ``z2``, kept as separate
    arrays, never stacked into a (2N, d) copy). Rows are numbered ``0..n-1``, part after part.
    Nothing is padded: when ``block`` does not divide a part, that part's last block is moved
    back to end at the part's end and overlaps the block before it; every row is *owned* by
    exactly one block (the first that covers it), and only owned rows and columns enter a
    tile's masks, so each entry of the similarity matrix is counted once.
    """

    n: int
    block: int
    num_blocks: int
    symmetric: bool  # visit only r <= c (the rows and the columns are the same vectors)
    exclude: str  # "diagonal" (CLIP: j == i) or "nt_xent" (j == i or j == (i + n/2) mod n)
    parts: int = 1

    @property
    def part_len(self) -> int:
        return self.n // self.parts

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        r, c = np.divmod(np.arange(self.num_blocks**2), self.num_blocks)
        keep = r <= c if self.symmetric else np.ones_like(r, bool)
        return r[keep].astype(np.int32), c[keep].astype(np.int32)

    def locate(self, r: Array) -> tuple[Array, Array]:
        """Block ``r`` -> (its part, its first row within that part)."""
        part, nominal = jnp.divmod(r, self.num_blocks // self.parts)
        return part, jnp.minimum(nominal * self.block, self.part_len - self.block)

    def start(self, r: Array) -> Array:
        """First row of block ``r`` in the numbering of all ``n`` rows."""
        part, local = self.locate(r)
        return part * self.part_len + local

    def owned(self, r: Array) -> Array:
        """(b,) True for the rows of block ``r`` that it owns (not covered by the block before)."""
        nominal = r % (self.num_blocks // self.parts) * self.block
        return self.locate(r)[1] + jnp.arange(self.block) >= nominal


def make_plan(n: int, block_size: int, *, symmetric: bool, exclude: str,
              parts: int = 1) -> TilePlan:
    """Blocks of ``min(block_size, n / parts)`` rows covering each part."""
    part = n // parts
    block = min(block_size, part)
    return TilePlan(n, block, parts * math.ceil(part / block), symmetric, exclude, parts)


def _indices(plan: TilePlan, r: Array, c: Array) -> tuple[Array, Array]:
    rows = plan.start(r) + jnp.arange(plan.block)[:, None]
    cols = plan.start(c) + jnp.arange(plan.block)[None, :]
    return rows, cols


def _owned(plan: TilePlan, r: Array, c: Array) -> Array:
    return plan.owned(r)[:, None] & plan.owned(c)[None, :]


def positives_mask(plan: TilePlan, r: Array, c: Array) -> Array:
    """(b, b) True where column j is the positive of row i (CLIP: j == i; NT-Xent: the partner).

    The relation is symmetric (the partner map is an involution), so the same mask marks, for
    column j, its positive row.
    """
    rows, cols = _indices(plan, r, c)
    partner = rows if plan.exclude == "diagonal" else (rows + plan.n // 2) % plan.n
    return _owned(plan, r, c) & (cols == partner)


def negatives_mask(plan: TilePlan, r: Array, c: Array) -> Array:
    """(b, b) True where column j is a negative for row i (owned, not self, not positive)."""
    rows, cols = _indices(plan, r, c)
    mask = _owned(plan, r, c) & (rows != cols)
    if plan.exclude == "nt_xent":
        mask &= cols != (rows + plan.n // 2) % plan.n
    return mask


class Normaliser(NamedTuple):
    """``log sum_j exp(S_j) = shift + log(total)`` per row (or column), kept as the pair.

    Keeping ``(shift, total)`` rather than the log-sum-exp lets probabilities be formed as
    ``exp(S - shift) / total``, where ``S - shift`` is exact for the large entries; ``exp(S -
    lse)`` would carry the rounding of ``lse`` (~1e-6 relative at logits ~20 in float32) into
    every probability. An empty set has ``shift = -inf`` and ``total = 0``.
    """

    shift: Array
    total: Array


def _safe(shift: Array) -> Array:
    return jnp.where(jnp.isfinite(shift), shift, 0.0)


def tile_normaliser(tile: Array, axis: int) -> Normaliser:
    """The normaliser of a masked tile (``-inf`` = excluded) along ``axis``."""
    shift = jnp.max(tile, axis=axis)
    total = jnp.sum(jnp.exp(tile - jnp.expand_dims(_safe(shift), axis)), axis=axis)
    return Normaliser(shift, total)


def merge(a: Normaliser, b: Normaliser) -> Normaliser:
    """The normaliser of the union of two disjoint sets (the online log-sum-exp step)."""
    shift = jnp.maximum(a.shift, b.shift)
    safe = _safe(shift)
    return Normaliser(shift, a.total * jnp.exp(a.shift - safe) + b.total * jnp.exp(b.shift - safe))


def negatives_minus_positive(negatives: Normaliser, positive: Array) -> Array:
    """``lse_negatives - S_pos``, evaluated as ``(shift - S_pos) + log(total)`` (``-inf`` if empty).

    The row loss is ``softplus`` of this and ``1 - p_pos`` its ``sigmoid``; forming the
    difference of shift and positive first keeps it exact when they are close.
    """
    nonempty = negatives.total > 0
    log_total = jnp.log(jnp.where(nonempty, negatives.total, 1.0))
    return jnp.where(nonempty, (negatives.shift - positive) + log_total, -jnp.inf)


def take(stats: NamedTuple, start: Array, size: int) -> NamedTuple:
    """Rows ``start:start + size`` of every field of a per-row statistics tuple."""
    return type(stats)(*(lax.dynamic_slice_in_dim(a, start, size) for a in stats))


def put(stats: NamedTuple, part: NamedTuple, start: Array) -> NamedTuple:
    """Write ``part`` into rows ``start:`` of every field."""
    return type(stats)(*(lax.dynamic_update_slice_in_dim(a, p, start, 0)
                         for a, p in zip(stats, part, strict=True)))


def partner_grads(partner_weight: Array, z_hat: Array) -> Array:
    """Rows of ``(G + G^T) Z_hat`` from the NT-Xent partner entries ``G_{i, pi(i)}`` alone.

    (n,), (n, d) -> (n, d), with ``pi(i) = (i + n/2) mod n``, an involution: row ``i`` gets
    ``G_{i, pi(i)} z_hat_{pi(i)}`` from ``G`` and ``G_{pi(i), i} z_hat_{pi(i)}`` from ``G^T``.
    """
    half = z_hat.shape[0] // 2
    return (partner_weight[:, None] * jnp.roll(z_hat, half, axis=0)
            + jnp.roll(partner_weight[:, None] * z_hat, half, axis=0))


class RowWeights(NamedTuple):
    """``p_ij = weight_i exp(S_ij - shift_i)`` for the negatives j of row i, times a coefficient."""

    shift: Array
    weight: Array


def negative_probabilities(negatives: Normaliser, positive: Array, coeff: Array) -> RowWeights:
    """``coeff p_ij`` for the negatives as ``coeff (1 - p_pos) softmax_negatives(S)_ij``.

    ``1 - p_pos = sigmoid(lse_neg - S_pos)`` and the softmax over the negatives is a ratio of
    exponentials of the same tile, so any systematic error of ``exp`` cancels (as it does in
    autodiff of the loss); writing ``p_ij = exp(S_ij - lse_all)`` instead mixes an exactly known
    positive term into the normaliser and leaves that error in every probability.
    """
    nonempty = negatives.total > 0
    inv_total = jnp.where(nonempty, 1.0 / jnp.where(nonempty, negatives.total, 1.0), 0.0)
    rest = jax.nn.sigmoid(negatives_minus_positive(negatives, positive))
    return RowWeights(negatives.shift, coeff * rest * inv_total)


def tile_logit_grad(
    cosines: Array,
    logits: Array,
    mask: Array,
    rows: RowWeights | None,
    cols: RowWeights | None,
    pos_row: Array | None,
    pos_col: Array | None,
    with_total: bool = True,
) -> tuple[Array, Array | None]:
    """One tile of ``Gamma = alpha (P_r - I) + beta (P_c - I)`` on the negatives
    (docs/derivations.md §8.3, §13.3).

    ``rows`` / ``cols`` carry ``alpha p`` and ``beta p`` for the negatives of each row / column
    (:func:`negative_probabilities`); excluded entries get 0 (the positives' ``p - 1`` are
    applied by the caller); a direction given as ``None`` is skipped. ``cosines`` is the tile of
    ``C = U_hat V_hat^T``, ``logits`` the same tile of ``S = s C`` exactly as the forward pass
    formed it (so that the probabilities match its normalisers bit for bit), and ``pos_row`` /
    ``pos_col`` are the positives' cosines.

    Also returns (unless ``with_total=False``) this tile's share of ``sum_ij Gamma_ij C_ij``
    (``s`` times it is the logit-scale gradient of docs/derivations.md §8.5), evaluated as
    ``sum Gamma_ij (C_ij - C_pos)`` over the negatives: each row of ``P_r - I`` (column of
    ``P_c - I``) sums to zero, so centring on the positive is exact, and differences of cosines
    (not of rounded logits of size ``scale``) keep hard negatives exact.
    """
    tile = jnp.where(mask, logits, -jnp.inf)
    gamma = centred = 0.0
    if rows is not None:
        p_row = rows.weight[:, None] * jnp.exp(tile - _safe(rows.shift)[:, None])
        gamma = p_row
        if with_total:
            centred = p_row * (cosines - pos_row[:, None])
    if cols is not None:
        p_col = cols.weight[None, :] * jnp.exp(tile - _safe(cols.shift)[None, :])
        gamma = gamma + p_col
        if with_total:
            centred = centred + p_col * (cosines - pos_col[None, :])
    if not with_total:
        return gamma, None
    # Row sums by a matrix-vector product, then their sum: XLA's fused float32 reductions over
    # the b^2 terms (even written as a reduce of row sums) lose ~1e-6 of this sum.
    centred = jnp.where(mask, centred, 0.0)
    ones = jnp.ones((centred.shape[1],), centred.dtype)
    return gamma, jnp.sum(jnp.matmul(centred, ones, precision=MATMUL_PRECISION))
