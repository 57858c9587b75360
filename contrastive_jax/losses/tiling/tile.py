"""One tile: blocks of rows, their masks from ids, the running normalisers, and ``Gamma``.

Every tiled and sharded loss meets two *chunks* of rows (:class:`Chunk`: raw embeddings, their
clamped norms and integer ids) in ``(b, b)`` tiles of logits ``S = s R_hat C_hat^T``. Rows are
cut into blocks of ``b`` (:class:`Blocks`); when ``b`` does not divide a chunk, its last block
is moved back to end at the chunk's end and overlaps the one before, and only the rows a block
*owns* (those not covered by the block before) enter the masks, so each entry is counted once.

Masks come from ids (docs/derivations.md §5): candidate ``j`` is a *positive* of anchor ``i``
iff their ids are equal, a *negative* otherwise, and nothing when it is the anchor itself (in a
chunk met with itself). With the default ids (a row's global index; both views of an example
share it) this is CLIP's diagonal and NT-Xent's partner; equal caption ids make duplicate
captions positives instead of false negatives.

Per anchor the InfoNCE losses keep two running log-sum-exps (:class:`Stats`), over its
negatives and over its positives, each as a :class:`Normaliser` ``(shift, total)`` merged tile
by tile (the online log-sum-exp, §13.1). The anchor's loss is ``softplus(t)``
(:func:`anchor_losses_from_stats`), ``t = lse_negatives - lse_positives`` (§6.2;
:func:`log_odds_against_positives`), and the gradient w.r.t. the logits (§5.2, §8.3) is
``+sigmoid(t) softmax_negatives`` on the negatives and ``-sigmoid(t) softmax_positives`` on the
positives (:class:`Weights`, :func:`infonce_tile_grad`), so every entry keeps its relative
precision. SigLIP's terms are independent per pair (§11): :func:`sigmoid_tile` gives a tile's
loss and its ``dL/dl`` at once.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from contrastive_jax.losses.parts.normalize import clamped_norms
from contrastive_jax.losses.parts.similarity import MATMUL_PRECISION

Array = jax.Array


def _varying_axes(x) -> frozenset:
    aval = jax.typeof(x)
    vma = getattr(aval, "vma", None)  # jax <= 0.9
    if vma is None:  # jax 0.10: the axis types of a manual mesh
        vma = getattr(getattr(aval, "manual_axis_type", None), "varying", frozenset())
    return frozenset(vma)


def varying_like(value, ref):
    """``value`` (a pytree) made device-varying over the mesh axes that ``ref`` varies over.

    Inside ``shard_map`` (with ``check_vma``) a loop carry started from a constant is
    invariant, while the loop body makes it vary with the device's data: the types must agree.
    Outside ``shard_map`` this is the identity.
    """
    want = _varying_axes(jax.tree.leaves(ref)[0])

    def one(v):
        missing = tuple(sorted(want - _varying_axes(v)))
        if not missing:
            return v
        if hasattr(lax, "pcast"):
            return lax.pcast(v, missing, to="varying")
        return lax.pvary(v, missing)  # jax < 0.8

    return jax.tree.map(one, value)


class Chunk(NamedTuple):
    """Rows that meet in tiles: raw ``x`` (n, d), clamped norms (n,), integer ``ids`` (n,)."""

    x: Array
    norm: Array
    ids: Array

    @classmethod
    def of(cls, x: Array, ids: Array) -> Chunk:
        return cls(x, clamped_norms(x), ids)


class Blocks(NamedTuple):
    """``count`` blocks of ``block`` rows over ``n`` rows; the last one overlaps when needed."""

    n: int
    block: int
    count: int

    def start(self, r: Array) -> Array:
        return jnp.minimum(r * self.block, self.n - self.block)

    def owned(self, r: Array) -> Array:
        """(b,) True for the rows of block ``r`` that it owns."""
        return self.start(r) + jnp.arange(self.block) >= r * self.block


def blocks(n: int, block_size: int) -> Blocks:
    """Blocks of ``min(block_size, n)`` rows covering ``n`` rows."""
    block = min(block_size, n)
    return Blocks(n, block, math.ceil(n / block))


def select_part(parts, part: Array):
    """``parts[part]`` for a traced ``part``: the leaves of several same-shaped pytrees,
    selected elementwise (no copy of the unselected)."""
    out = parts[0]
    for k in range(1, len(parts)):
        out = jax.tree.map(lambda a, b, k=k: jnp.where(part == k, b, a), out, parts[k])
    return out


def read_block(chunks: tuple[Chunk, ...], plan: Blocks, part: Array,
               r: Array) -> tuple[Array, Array]:
    """Block ``r`` of chunk ``part``: its normalised rows (b, d) and ids (b,)."""
    start = plan.start(r)
    block = select_part([slice_rows(c, start, plan.block) for c in chunks], part)
    return block.x / block.norm[:, None], block.ids


def cosines(a_hat: Array, b_hat: Array) -> Array:
    """``a_hat b_hat^T`` at full matmul precision: (b, d), (b', d) -> (b, b')."""
    return jnp.matmul(a_hat, b_hat.T, precision=MATMUL_PRECISION)


def masks(plan: Blocks, r: Array, c: Array, row_ids: Array, col_ids: Array,
          same) -> tuple[Array, Array]:
    """(b, b) masks ``(positives, negatives)`` of tile ``(r, c)``.

    ``same`` (a bool, possibly traced): the rows and the columns are one chunk, so the diagonal
    ``i == j`` (the anchor itself) is neither.
    """
    valid = plan.owned(r)[:, None] & plan.owned(c)[None, :]
    if same is not False:
        i = plan.start(r) + jnp.arange(plan.block)
        j = plan.start(c) + jnp.arange(plan.block)
        valid &= ~(same & (i[:, None] == j[None, :]))
    equal = row_ids[:, None] == col_ids[None, :]
    return valid & equal, valid & ~equal


# ------------------------------------------------------------------------- log-sum-exps


class Normaliser(NamedTuple):
    """``log sum exp = shift + log(total)`` over a set, kept as the pair (empty: ``-inf, 0``).

    Keeping ``(shift, total)`` rather than the log-sum-exp lets probabilities be formed as
    ``exp(S - shift) / total``, exact for the large entries.
    """

    shift: Array
    total: Array


def _safe(shift: Array) -> Array:
    return jnp.where(jnp.isfinite(shift), shift, 0.0)


def normaliser(tile: Array, axis: int) -> Normaliser:
    """The normaliser of a masked tile (``-inf`` = excluded) along ``axis``."""
    shift = jnp.max(tile, axis=axis)
    return Normaliser(shift, jnp.sum(jnp.exp(tile - jnp.expand_dims(_safe(shift), axis)),
                                     axis=axis))


def merge_normalisers(a: Normaliser, b: Normaliser) -> Normaliser:
    """The normaliser of the union of two disjoint sets (one online log-sum-exp step)."""
    shift = jnp.maximum(a.shift, b.shift)
    safe = _safe(shift)
    return Normaliser(shift, a.total * jnp.exp(a.shift - safe) + b.total * jnp.exp(b.shift - safe))


def empty_normalisers(n: int, dtype) -> Normaliser:
    """The normalisers of ``n`` empty sets."""
    return Normaliser(jnp.full((n,), -jnp.inf, dtype), jnp.zeros((n,), dtype))


class Stats(NamedTuple):
    """Per anchor: the normalisers of its negatives and of its positives."""

    neg: Normaliser
    pos: Normaliser


def empty_stats(n: int, dtype) -> Stats:
    """Statistics of ``n`` anchors before any tile."""
    return Stats(empty_normalisers(n, dtype), empty_normalisers(n, dtype))


def merge_stats(a: Stats, b: Stats) -> Stats:
    """:func:`merge_normalisers` for both normalisers of each anchor."""
    return Stats(merge_normalisers(a.neg, b.neg), merge_normalisers(a.pos, b.pos))


def slice_rows(tree, start: Array, size: int):
    """Rows ``start:start + size`` of every leaf of a per-row pytree."""
    return jax.tree.map(lambda a: lax.dynamic_slice_in_dim(a, start, size), tree)


def write_rows(tree, part, start: Array):
    """``tree`` with ``part`` written into rows ``start:`` of every leaf (a per-row pytree)."""
    return jax.tree.map(lambda a, p: lax.dynamic_update_slice_in_dim(a, p, start, 0), tree, part)


def _log(total: Array) -> Array:
    """``log(total)``, 0 for an empty set; a NaN total stays NaN (never the empty set's 0)."""
    return jnp.log(jnp.where(total == 0, 1.0, total))


def log_odds_against_positives(stats: Stats) -> Array:
    """``t = lse_negatives - lse_positives = -logit p(P)`` per anchor (``-inf`` without negatives),
    formed from the differences of the shifts first so that it is exact when they are close. A NaN
    anywhere in an anchor's logits makes its totals, hence ``t`` and its loss, NaN."""
    t = (stats.neg.shift - stats.pos.shift) + (_log(stats.neg.total) - _log(stats.pos.total))
    return jnp.where(stats.neg.total == 0, -jnp.inf, t)


def anchor_losses_from_stats(stats: Stats) -> Array:
    """``-log sum_{j in P} p_j = softplus(t)`` per anchor, from its final statistics
    (docs/derivations.md §5.1, §6.2); the tiled counterpart of
    :func:`contrastive_jax.losses.info_nce.row_losses`, which starts from the logits."""
    return jax.nn.softplus(log_odds_against_positives(stats))


def tile_stats(logits: Array, pos: Array, neg: Array, axis: int, positives: bool) -> Stats:
    """A tile's contribution to the stats of its rows (``axis=1``) or columns (``axis=0``).

    ``positives=False`` (static) says the tile holds no positive (with the default ids, every
    pair of chunks but a device's own): its positive normaliser is the empty one, and the tile
    is not read a second time.
    """
    masked = jnp.where(neg, logits, -jnp.inf)
    if positives:
        pos_part = normaliser(jnp.where(pos, logits, -jnp.inf), axis)
    else:
        pos_part = varying_like(empty_normalisers(logits.shape[1 - axis], logits.dtype), logits)
    return Stats(normaliser(masked, axis), pos_part)


class Weights(NamedTuple):
    """Per anchor, ``dL/dS`` on its negatives is ``neg_w exp(S - neg_shift)`` and on its
    positives ``-pos_w exp(S - pos_shift)``; ``ref`` centres the scale's gradient."""

    neg_shift: Array
    neg_w: Array
    pos_shift: Array
    pos_w: Array
    ref: Array


def weights(stats: Stats, coeff, scale: Array) -> Weights:
    """:class:`Weights` of anchors with loss weight ``coeff``: ``coeff sigmoid(t) / total``.

    ``p_ij - q_ij`` (docs/derivations.md §5.2): on a negative ``(1 - p(P)) softmax_neg``, on a
    positive ``-(1 - p(P)) softmax_pos``, with ``1 - p(P) = sigmoid(t)`` (§6.3).
    """
    rest = jax.nn.sigmoid(log_odds_against_positives(stats))

    def per(normaliser):
        nonempty = normaliser.total > 0
        return coeff * rest * jnp.where(nonempty, 1.0 / jnp.where(nonempty, normaliser.total,
                                                                     1.0), 0.0)

    ref = _safe(stats.pos.shift) / scale
    return Weights(_safe(stats.neg.shift), per(stats.neg), _safe(stats.pos.shift), per(stats.pos),
                   ref)


def _side(w: Weights, axis: int, logits: Array, pos: Array, neg: Array,
          positives: bool) -> Array:
    expand = (lambda a: a[:, None]) if axis == 1 else (lambda a: a[None, :])
    out = jnp.where(neg, expand(w.neg_w) * jnp.exp(logits - expand(w.neg_shift)), 0.0)
    if positives:
        out = out - jnp.where(pos, expand(w.pos_w) * jnp.exp(logits - expand(w.pos_shift)), 0.0)
    return out


def infonce_tile_grad(cos: Array, logits: Array, pos: Array, neg: Array, rows: Weights | None,
                      cols: Weights | None, positives: bool = True) -> tuple[Array, Array]:
    """One tile of ``Gamma = dL/dS`` (rows' and columns' anchors) and its ``sum Gamma * C``.

    The sum (``dL/ds``, docs/derivations.md §8.5) is centred on each anchor's ``ref``: exact,
    as each anchor's ``Gamma`` sums to zero over all its candidates.
    """
    gamma = total = 0.0
    if rows is not None:
        part = _side(rows, 1, logits, pos, neg, positives)
        gamma, total = part, jnp.sum(part * (cos - rows.ref[:, None]))
    if cols is not None:
        part = _side(cols, 0, logits, pos, neg, positives)
        gamma, total = gamma + part, total + jnp.sum(part * (cos - cols.ref[None, :]))
    return gamma, total


def sigmoid_tile(logits: Array, pos: Array, neg: Array, coeff) -> tuple[Array, Array]:
    """A tile's ``sum softplus(t)`` and ``dL/dl = coeff sigmoid(t) dt/dl`` per pair.

    ``t = -l`` on positives, ``+l`` on negatives (``z = +1``, ``-1``; docs/derivations.md §11):
    each pair's loss is ``softplus(t)``, its derivative ``-z sigmoid(-z l)`` (§11.2). One
    ``exp`` per entry gives both (``e = exp(-|t|)``); entries in neither mask give 0.
    """
    t = jnp.where(pos, -logits, logits)
    e = jnp.exp(-jnp.abs(t))
    valid = pos | neg
    loss = jnp.sum(jnp.where(valid, jnp.maximum(t, 0.0) + jnp.log1p(e), 0.0))
    sigmoid = jnp.where(t >= 0, 1.0, e) / (1.0 + e)
    return loss, coeff * jnp.where(pos, -sigmoid, jnp.where(neg, sigmoid, 0.0))
