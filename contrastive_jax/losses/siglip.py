"""SigLIP's pairwise sigmoid loss (Zhai et al. 2023) with a learnable scale and bias.

Derived in docs/derivations.md §11 ([SigLIP]); it replaces the softmax over candidates (§8.1) by an
independent binary decision per pair, so there is no normaliser to share across devices.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from contrastive_jax.losses.normalize import l2_normalize
from contrastive_jax.losses.similarity import similarities
from contrastive_jax.losses.temperature import logit_scale
from contrastive_jax.losses.validation import (
    check_has_negatives,
    check_pair,
    check_positive,
    check_scalar,
    compute_dtype,
)

Array = jax.Array


def siglip_loss(x: Array, y: Array, log_scale: Array | float, bias: Array | float, *,
                max_scale: float = 100.0) -> Array:
    """``-(1/N) sum_ij log sigmoid(z_ij (s x_hat_i . y_hat_j + b))``; ``z_ii = 1``, else ``-1``.

    Args:
      x, y: (N, d) raw embeddings, row i of ``x`` paired with row i of ``y``; L2-normalised
        inside (a zero row stays finite, docs/derivations.md §2.3).
      log_scale: scalar, ``s = min(exp(log_scale), max_scale)`` (clipped as in
        :func:`contrastive_jax.losses.clip_loss`; gradient 0 where the clip is active).
      bias: scalar ``b`` (SigLIP initialises ``log_scale = log 10``, ``b = -10``, so that the
        N^2 - N negatives do not dominate the first steps).

    Returns:
      Scalar loss, float32 (float64 for float64 inputs): the sum over all N^2 pairs divided by
      N, as in the paper. ``log sigmoid`` is evaluated stably (``-softplus(-t)``).

    Dense: builds the (N, N) logits. Under ``jit`` on a mesh with ``x``, ``y`` sharded over the
    batch, XLA partitions the pairs by rows; the per-pair form needs no cross-device softmax.

    References:
      docs/derivations.md §11; [SigLIP] Zhai et al. 2023, https://arxiv.org/abs/2303.15343.

    Example (orthonormal pairs, scale 10, bias -5: each row pays ``softplus(-5)`` for its
    positive and ``3 softplus(-5)`` for its negatives):

      >>> import jax.numpy as jnp
      >>> from contrastive_jax.losses import siglip_loss
      >>> print(f"{float(siglip_loss(jnp.eye(4), jnp.eye(4), jnp.log(10.0), -5.0)):.5f}")
      0.02686
    """
    check_pair("x", x, "y", y)
    check_has_negatives("x", jnp.shape(x)[0])
    check_scalar("log_scale", log_scale)
    check_scalar("bias", bias)
    check_positive("max_scale", max_scale)
    dtype = compute_dtype(x, y)
    x, y = l2_normalize(jnp.asarray(x).astype(dtype)), l2_normalize(jnp.asarray(y).astype(dtype))
    scale = logit_scale(jnp.asarray(log_scale).astype(dtype), float(max_scale))
    logits = scale * similarities(x, y) + jnp.asarray(bias).astype(dtype)
    n = logits.shape[0]
    signs = 2.0 * jnp.eye(n, dtype=dtype) - 1.0
    return -jnp.sum(jax.nn.log_sigmoid(signs * logits)) / n
