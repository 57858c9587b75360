"""Pairwise cosine similarities between two sets of L2-normalised embeddings."""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array

# Full float32 (or float64) matmuls for every logit. On CPU this is the default anyway; on
# TPU/GPU the default f32 matmul rounds its inputs to bf16/tf32, which would put ~1e-3 relative
# errors into logits of scale 100 and break the exactness this library promises.
MATMUL_PRECISION = jax.lax.Precision.HIGHEST


def similarities(a_hat: Array, b_hat: Array) -> Array:
    """``a_hat @ b_hat.T``: (n, d), (m, d) -> (n, m) at full matmul precision.

    Callers scale the result (``s * C`` for a logit scale, ``C / tau`` for a temperature) so
    that the rounding matches the formula they state.
    """
    return jnp.matmul(a_hat, b_hat.T, precision=MATMUL_PRECISION)
