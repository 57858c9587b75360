"""InfoNCE rows of local anchors against candidates that arrive one chunk at a time.

The engine of the sharded losses (:mod:`contrastive_jax.losses.sharded`). A device holds ``n``
anchors
``A`` (its rows of the global batch) and sees the global candidates as ``D`` chunks of ``n``
rows, one per device: gathered (``all_gather``) or passed round a ring (``ppermute``). Chunk
``k`` meets the anchors in (b, b) tiles, as in :mod:`contrastive_jax.losses.tiled`; only the
anchors' online log-sum-exp statistics (O(n)) are carried from chunk to chunk, so no
(n, N) logit block exists. The device's own chunk holds each anchor's positive (and, for
NT-Xent, the anchor itself); every other chunk holds negatives only.

Two kinds of chunk (docs/derivations.md §4, §8.1, §9.1):

- ``"clip"``: anchor ``i`` is positive with candidate ``i`` of its own chunk (one direction of
  CLIP; the symmetric loss runs the engine twice, anchors ``x`` against candidates ``y`` and
  ``y`` against ``x``).
- ``"nt_xent"``: anchors and candidates are both ``[z1; z2]`` of the device (``2 n`` rows);
  in the own chunk row ``i`` excludes itself and is positive with ``(i + n) mod 2n``, its other
  view.

Forward per chunk: :func:`chunk_normalisers` folds the negatives' ``(shift, total)`` into the
running :class:`~contrastive_jax.losses.tile_kernels.Normaliser` of each anchor and reads the
positive
cosines off the own chunk's tiles. Backward per chunk (docs/derivations.md §8.3-8.4, §14.2):
:func:`chunk_grads` recomputes each tile, forms ``Gamma = g (P - I)`` on the negatives and
accumulates
``Gamma C_hat`` into the anchors' gradient and ``Gamma^T A_hat`` into the chunk's; the
positives' ``g (p_pos - 1)`` are applied in O(n d) by the caller.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from contrastive_jax.losses.normalize import clamped_norms
from contrastive_jax.losses.similarity import MATMUL_PRECISION
from contrastive_jax.losses.tile_kernels import (
    Normaliser,
    RowWeights,
    merge,
    put,
    take,
    tile_logit_grad,
    tile_normaliser,
)

Array = jax.Array
KINDS = ("clip", "nt_xent")


def _varying_axes(x) -> frozenset:
    """Mesh axes over which ``x`` varies inside ``shard_map`` (empty outside)."""
    aval = jax.typeof(x)
    vma = getattr(aval, "vma", None)  # jax <= 0.9
    if vma is None:  # jax 0.10: the axis types of a manual mesh
        vma = getattr(getattr(aval, "manual_axis_type", None), "varying", frozenset())
    return frozenset(vma)


def varying_like(value, ref: Array):
    """``value`` (a pytree) made device-varying over the mesh axes that ``ref`` varies over.

    Inside ``shard_map`` (with ``check_vma``) a loop carry started from a constant is
    invariant, while the loop body makes it vary with the device's data: the types must agree.
    Outside ``shard_map`` this is the identity.
    """
    want = _varying_axes(ref)

    def one(v):
        missing = tuple(sorted(want - _varying_axes(v)))
        if not missing:
            return v
        if hasattr(lax, "pcast"):
            return lax.pcast(v, missing, to="varying")
        return lax.pvary(v, missing)  # jax < 0.8

    return jax.tree.map(one, value)


class Embeddings(NamedTuple):
    """Raw rows (n, d) and their clamped norms (n,); blocks are normalised when used."""

    x: Array
    norm: Array

    @classmethod
    def of(cls, x: Array) -> Embeddings:
        return cls(x, clamped_norms(x))

    def hat(self) -> Array:
        return self.x / self.norm[:, None]


class ChunkPlan(NamedTuple):
    """Blocks of ``block`` rows over a chunk of ``n`` rows (anchors and chunks alike).

    When ``block`` does not divide ``n`` the last block is moved back to end at row ``n`` and
    overlaps the one before; each row is owned by the first block that covers it, and only
    owned rows and columns enter the masks (as in
    :class:`~contrastive_jax.losses.tile_kernels.TilePlan`).
    """

    n: int
    block: int
    num_blocks: int
    kind: str

    def start(self, r: Array) -> Array:
        return jnp.minimum(r * self.block, self.n - self.block)

    def owned(self, r: Array) -> Array:
        return self.start(r) + jnp.arange(self.block) >= r * self.block

    def pairs(self) -> tuple[Array, Array]:
        r, c = np.divmod(np.arange(self.num_blocks**2), self.num_blocks)
        return jnp.asarray(r, jnp.int32), jnp.asarray(c, jnp.int32)


def make_chunk_plan(n: int, block_size: int, kind: str) -> ChunkPlan:
    """Blocks of ``min(block_size, n)`` rows covering a chunk of ``n`` rows."""
    block = min(block_size, n)
    return ChunkPlan(n, block, -(-n // block), kind)


def to_partners(values: Array, plan: ChunkPlan) -> Array:
    """Row ``i`` of the result is row ``pi(i)`` of ``values``: each anchor's positive candidate
    in the own chunk (CLIP: ``pi(i) = i``; NT-Xent: ``pi(i) = (i + n/2) mod n``, the other view).
    """
    return values if plan.kind == "clip" else jnp.roll(values, -(plan.n // 2), axis=0)


def tile_masks(plan: ChunkPlan, r: Array, c: Array, own: Array) -> tuple[Array, Array]:
    """(b, b) masks (positive, negative) of tile ``(r, c)``; ``own``: is this the own chunk."""
    rows = plan.start(r) + jnp.arange(plan.block)[:, None]
    cols = plan.start(c) + jnp.arange(plan.block)[None, :]
    owned = plan.owned(r)[:, None] & plan.owned(c)[None, :]
    if plan.kind == "clip":
        positive = own & (cols == rows)
        excluded = positive
    else:
        positive = own & (cols == (rows + plan.n // 2) % plan.n)
        excluded = positive | (own & (cols == rows))
    return owned & positive, owned & ~excluded


def _block(e: Embeddings, start: Array, size: int) -> Array:
    return (lax.dynamic_slice_in_dim(e.x, start, size)
            / lax.dynamic_slice_in_dim(e.norm, start, size)[:, None])


def chunk_normalisers(
    anchors: Embeddings,
    chunk: Embeddings,
    scale: Array,
    own: Array,
    plan: ChunkPlan,
    stats: tuple[Normaliser, Array],
    columns: Normaliser | None = None,
) -> tuple[tuple[Normaliser, Array], Normaliser | None]:
    """Fold one chunk into the anchors' (negatives' normaliser (n,), positive cosine (n,)).

    With ``columns`` (the chunk's own (n,) normaliser, for CLIP's second direction), the same
    tiles are also folded into it column-wise: what this device's anchors contribute to the
    log-sum-exp of each of the chunk's columns. Returns ``(stats, columns)``.
    """
    r_idx, c_idx = plan.pairs()
    b = plan.block

    def body(t, carry):
        (norm, positive), cols = carry
        r, c = r_idx[t], c_idx[t]
        r0, c0 = plan.start(r), plan.start(c)
        cosines = jnp.matmul(_block(anchors, r0, b), _block(chunk, c0, b).T,
                             precision=MATMUL_PRECISION)
        pos_mask, neg_mask = tile_masks(plan, r, c, own)
        positive = lax.dynamic_update_slice_in_dim(
            positive, lax.dynamic_slice_in_dim(positive, r0, b)
            + jnp.where(pos_mask, cosines, 0.0).sum(axis=1), r0, 0)
        tile = jnp.where(neg_mask, scale * cosines, -jnp.inf)
        norm = put(norm, merge(take(norm, r0, b), tile_normaliser(tile, 1)), r0)
        if cols is not None:
            cols = put(cols, merge(take(cols, c0, b), tile_normaliser(tile, 0)), c0)
        return (norm, positive), cols

    return lax.fori_loop(0, r_idx.shape[0], body, varying_like((stats, columns), anchors.x))


def empty_stats(n: int, dtype) -> tuple[Normaliser, Array]:
    """Statistics of ``n`` anchors before any chunk: empty normalisers, zero positive cosines."""
    return (Normaliser(jnp.full((n,), -jnp.inf, dtype), jnp.zeros((n,), dtype)),
            jnp.zeros((n,), dtype))


def chunk_grads(
    anchors: Embeddings,
    chunk: Embeddings,
    scale: Array,
    own: Array,
    weights: RowWeights,
    positive_cos: Array,
    plan: ChunkPlan,
    acc: tuple[Array, Array, Array],
    col_weights: RowWeights | None = None,
    col_positive_cos: Array | None = None,
) -> tuple[Array, Array, Array]:
    """Add one chunk's ``Gamma C_hat`` (anchors), ``Gamma^T A_hat`` (chunk), ``sum Gamma*C``.

    ``weights`` carry ``g p_ij`` of the negatives (:func:`~contrastive_jax.losses.tile_kernels.
    negative_probabilities`); ``acc = (g_anchors (n, d), g_chunk (n, d), total)``. The sum is
    centred on each anchor's positive cosine, exact because each row of ``P - I`` sums to zero.
    With ``col_weights`` / ``col_positive_cos`` (the chunk's columns' weights and positive
    cosines) the tile's ``Gamma`` also holds CLIP's second direction, ``beta (P_c - I)``.
    """
    r_idx, c_idx = plan.pairs()
    b = plan.block

    def body(t, carry):
        g_a, g_c, total = carry
        r, c = r_idx[t], c_idx[t]
        r0, c0 = plan.start(r), plan.start(c)
        a_r, c_c = _block(anchors, r0, b), _block(chunk, c0, b)
        cosines = jnp.matmul(a_r, c_c.T, precision=MATMUL_PRECISION)
        _, neg_mask = tile_masks(plan, r, c, own)
        cols = pos_col = None
        if col_weights is not None:
            cols = take(col_weights, c0, b)
            pos_col = lax.dynamic_slice_in_dim(col_positive_cos, c0, b)
        gamma, part = tile_logit_grad(cosines, scale * cosines, neg_mask, take(weights, r0, b),
                                      cols, lax.dynamic_slice_in_dim(positive_cos, r0, b),
                                      pos_col)
        g_a = lax.dynamic_update_slice_in_dim(
            g_a, lax.dynamic_slice_in_dim(g_a, r0, b)
            + jnp.matmul(gamma, c_c, precision=MATMUL_PRECISION), r0, 0)
        g_c = lax.dynamic_update_slice_in_dim(
            g_c, lax.dynamic_slice_in_dim(g_c, c0, b)
            + jnp.matmul(gamma.T, a_r, precision=MATMUL_PRECISION), c0, 0)
        return g_a, g_c, total + part

    return lax.fori_loop(0, r_idx.shape[0], body, varying_like(acc, anchors.x))
