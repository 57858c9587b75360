"""Per-step training diagnostics: contrastive top-1 and embedding norms.

Both are computed under ``jit`` inside the train step with ``stop_gradient``; neither needs the
full N x N similarity matrix: top-1 uses the first ``max_anchors`` anchors only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from contrastive_jax.losses.parts.normalize import l2_normalize

MAX_ANCHORS = 256


def contrastive_top1(anchors: jax.Array, candidates: jax.Array, positive: jax.Array,
                     exclude: jax.Array | None = None, *, normalize: bool = True,
                     anchor_ids: jax.Array | None = None,
                     candidate_ids: jax.Array | None = None) -> jax.Array:
    """Fraction of anchors whose positive candidate has the highest cosine similarity.

    anchors (A, d), candidates (K, d), positive (A,) int index of each anchor's positive in
    ``candidates``, exclude (A,) int index to leave out (the anchor itself, NT-Xent's self
    mask) or None. Ties with a negative count as misses. ``normalize=False`` ranks by dot
    product (the logits of a loss without L2 normalisation). With ids (``anchor_ids`` (A,),
    ``candidate_ids`` (K,)), every candidate whose id equals the anchor's is a positive (the
    loss's positives by id): an anchor is right when no negative is at least as close as its
    closest positive.
    """
    a = jax.lax.stop_gradient(anchors).astype(jnp.float32)
    c = jax.lax.stop_gradient(candidates).astype(jnp.float32)
    if normalize:
        a, c = l2_normalize(a), l2_normalize(c)
    sims = a @ c.T
    rows = jnp.arange(a.shape[0])
    if exclude is not None:
        sims = sims.at[rows, exclude].set(-jnp.inf)
    if anchor_ids is None:
        is_pos = jnp.zeros(sims.shape, bool).at[rows, positive].set(True)
    else:
        is_pos = anchor_ids[:, None] == candidate_ids[None, :]
        if exclude is not None:
            is_pos = is_pos.at[rows, exclude].set(False)
    best = jnp.max(jnp.where(is_pos, sims, -jnp.inf), axis=1)
    beaten = jnp.sum(~is_pos & (sims >= best[:, None]), axis=1)  # negatives at least as close
    return jnp.mean((beaten == 0).astype(jnp.float32))


def first_anchors(n: int, max_anchors: int = MAX_ANCHORS) -> int:
    """How many anchors the top-1 metric uses: ``min(n, max_anchors)``."""
    return min(n, max_anchors)


def mean_norm(z: jax.Array) -> jax.Array:
    """Mean L2 norm of the rows of ``z`` before normalisation (docs/derivations.md §12.3, §12.4
    watch it grow)."""
    return jnp.mean(jnp.linalg.norm(jax.lax.stop_gradient(z).astype(jnp.float32), axis=-1))
