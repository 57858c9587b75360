"""SigLIP's pairwise sigmoid loss (Zhai et al. 2023) with a learnable scale and bias.

Derived in docs/derivations.md §11 ([SigLIP]); it replaces the softmax over candidates (§8.1) by an
independent binary decision per pair, so there is no normaliser to share across devices.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from contrastive_jax.losses.parts.normalize import l2_normalize
from contrastive_jax.losses.parts.similarity import similarities
from contrastive_jax.losses.parts.temperature import logit_scale
from contrastive_jax.losses.parts.validation import (
    check_block_size,
    check_has_negatives,
    check_ids,
    check_impl,
    check_pair,
    check_positive,
    check_scalar,
    loss_dtype,
)
from contrastive_jax.losses.tiling.custom_vjps import DEFAULT_BLOCK_SIZE, Setup, sigmoid_tiled_jit
from contrastive_jax.losses.tiling.row_exchange import RowExchange

Array = jax.Array


IMPLS = ("tiled", "autodiff")


def siglip_loss(x: Array, y: Array, log_scale: Array | float, bias: Array | float, *,
                max_scale: float = 100.0, impl: str = "tiled", block_size: int | None = None,
                positive_ids: Array | None = None) -> Array:
    """``-(1/N) sum_ij log sigmoid(z_ij (s x_hat_i . y_hat_j + b))``; ``z_ii = 1``, else ``-1``.

    Args:
      x, y: (N, d) raw embeddings, row i of ``x`` paired with row i of ``y``; L2-normalised
        inside (a zero row stays finite, docs/derivations.md §2.3).
      log_scale: scalar, ``s = min(exp(log_scale), max_scale)`` (clipped as in
        :func:`contrastive_jax.losses.clip_loss`; gradient 0 where the clip is active).
      bias: scalar ``b`` (SigLIP initialises ``log_scale = log 10``, ``b = -10``, so that the
        N^2 - N negatives do not dominate the first steps).
      impl: ``"tiled"`` (default: the pairs in (block, block) tiles, recomputed in the backward
        pass, which is written by hand, docs/derivations.md §11.2; memory O(N d + block^2)) or
        ``"autodiff"`` (dense N x N logits, reverse mode; also forward mode).
      block_size: rows per tile for ``impl="tiled"``.
      positive_ids: optional (N,) integers: pair ``(i, j)`` is positive (``z_ij = 1``) iff
        ``ids[i] == ids[j]``. Default: the diagonal.
    Returns:
      Scalar loss, float32 (float64 for float64 inputs): the sum over all N^2 pairs divided by
      N, as in the paper. ``log sigmoid`` is evaluated stably (``-softplus(-t)``).

    Over a device mesh: :func:`contrastive_jax.losses.sharded.sharded_siglip_loss`.

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
    check_positive("max_scale", max_scale, allow_inf=True)
    impl = check_impl(impl, IMPLS)
    block_size = check_block_size(block_size, impl, DEFAULT_BLOCK_SIZE)
    check_ids("positive_ids", positive_ids, jnp.shape(x)[0])
    dtype = loss_dtype(x, y)
    x, y = jnp.asarray(x).astype(dtype), jnp.asarray(y).astype(dtype)
    log_scale, bias = jnp.asarray(log_scale).astype(dtype), jnp.asarray(bias).astype(dtype)
    n = x.shape[0]
    if impl == "tiled":
        ids = jnp.arange(n, dtype=jnp.int32) if positive_ids is None else jnp.asarray(
            positive_ids)
        setup = Setup("siglip", RowExchange(), block_size, max_scale=float(max_scale),
                      by_id=positive_ids is not None)
        return sigmoid_tiled_jit(x, y, log_scale, bias, ids, setup)
    scale = logit_scale(log_scale, float(max_scale))
    logits = scale * similarities(l2_normalize(x), l2_normalize(y)) + bias
    if positive_ids is None:
        signs = 2.0 * jnp.eye(n, dtype=dtype) - 1.0
    else:
        ids = jnp.asarray(positive_ids)
        signs = jnp.where(ids[:, None] == ids[None, :], 1.0, -1.0).astype(dtype)
    return -jnp.sum(jax.nn.log_sigmoid(signs * logits)) / n
