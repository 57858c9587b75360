"""Per-step training diagnostics: contrastive top-1 and embedding norms.

Both are computed under ``jit`` inside the train step with ``stop_gradient``; neither needs the
full N x N similarity matrix: top-1 uses the first ``max_anchors`` anchors only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from contrastive_jax.losses.normalize import l2_normalize

MAX_ANCHORS = 256


def contrastive_top1(anchors: jax.Array, candidates: jax.Array, positive: jax.Array,
                     exclude: jax.Array | None = None, *, normalize: bool = True) -> jax.Array:
    """Fraction of anchors whose positive candidate has the highest cosine similarity.

    anchors (A, d), candidates (K, d), positive (A,) int index of each anchor's positive in
    ``candidates``, exclude (A,) int index to leave out (the anchor itself, NT-Xent's self
    mask) or None. Ties count as misses. ``normalize=False`` ranks by dot product (the logits
    of a loss without L2 normalisation).
    """
    a = jax.lax.stop_gradient(anchors).astype(jnp.float32)
    c = jax.lax.stop_gradient(candidates).astype(jnp.float32)
    if normalize:
        a, c = l2_normalize(a), l2_normalize(c)
    sims = a @ c.T
    rows = jnp.arange(a.shape[0])
    if exclude is not None:
        sims = sims.at[rows, exclude].set(-jnp.inf)
    pos = sims[rows, positive]
    beaten = jnp.sum(sims >= pos[:, None], axis=1) - 1  # candidates at least as close
    return jnp.mean((beaten == 0).astype(jnp.float32))


def first_anchors(n: int, max_anchors: int = MAX_ANCHORS) -> int:
    """How many anchors the top-1 metric uses: ``min(n, max_anchors)``."""
    return min(n, max_anchors)


def mean_norm(z: jax.Array) -> jax.Array:
    """Mean L2 norm of the rows of ``z`` before normalisation (docs/derivations.md §12.3, §12.4
    watch it grow)."""
    return jnp.mean(jnp.linalg.norm(jax.lax.stop_gradient(z).astype(jnp.float32), axis=-1))
