"""MoCo's InfoNCE: one positive key per query against a queue of negatives ([MoCo];
docs/derivations.md §10)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from contrastive_jax.errors import InputError
from contrastive_jax.losses.info_nce import masked_logsumexp, positive_relative_loss
from contrastive_jax.losses.parts.normalize import l2_normalize
from contrastive_jax.losses.parts.similarity import similarities
from contrastive_jax.losses.parts.validation import (
    check_embeddings,
    check_pair,
    check_positive,
    loss_dtype,
)

Array = jax.Array


def moco_infonce(q: Array, k: Array, queue: Array, temperature: Array | float) -> Array:
    """Mean InfoNCE of queries against their keys (positives) and a queue of keys (negatives).

    Args:
      q: (N, d) query embeddings (gradients flow here).
      k: (N, d) key embeddings from the momentum encoder; ``k[i]`` is the positive of ``q[i]``.
      queue: (K, d) keys of earlier batches, K >= 1, the negatives.
      temperature: ``tau > 0``.

    Returns:
      Scalar: ``mean_i -log exp(q_i.k_i/tau) / (exp(q_i.k_i/tau) + sum_k exp(q_i.n_k/tau))`` on
      L2-normalised rows (docs/derivations.md §10.1, [MoCo] §3.1: the (1 + K)-way classification
      with the positive at index 0).

    ``k`` and ``queue`` are under ``stop_gradient``: in MoCo the key encoder is updated only by
    the momentum (EMA) rule, never by back-propagation. Queue rows are normalised again, which
    is idempotent for stored unit keys. Negatives from a queue come from older encoders, so
    ``log(K + 1) - L`` is not the mutual-information bound of docs/derivations.md §15 (see §5.4,
    §15.4).

    References:
      docs/derivations.md §10; [MoCo] He et al. 2019, https://arxiv.org/abs/1911.05722.

    Example (two queries with their own keys and two orthogonal queue entries, tau 0.5):

      >>> import jax.numpy as jnp
      >>> from contrastive_jax.losses import moco_infonce
      >>> q = jnp.eye(2, 4)
      >>> print(f"{float(moco_infonce(q, q, jnp.eye(4)[2:], 0.5)):.6f}")
      0.239545
    """
    check_pair("q", q, "k", k)
    check_embeddings("queue", queue)
    if jnp.shape(queue)[1] != jnp.shape(q)[1]:
        raise InputError(
            f"queue rows must have the query dim {jnp.shape(q)[1]}; got queue shape "
            f"{jnp.shape(queue)}."
        )
    if jnp.shape(queue)[0] < 1:
        raise InputError("queue is empty: MoCo needs at least one negative key in the queue.")
    check_positive("temperature", temperature)
    dtype = loss_dtype(q, k, queue)
    q_hat = l2_normalize(jnp.asarray(q).astype(dtype))
    k_hat = lax.stop_gradient(l2_normalize(jnp.asarray(k).astype(dtype)))
    queue_hat = lax.stop_gradient(l2_normalize(jnp.asarray(queue).astype(dtype)))
    temperature = jnp.asarray(temperature).astype(dtype)
    positive = jnp.sum(q_hat * k_hat, axis=1) / temperature
    negatives = similarities(q_hat, queue_hat) / temperature
    lse_neg = masked_logsumexp(negatives, jnp.ones(negatives.shape, dtype=bool))
    return jnp.mean(positive_relative_loss(lse_neg, positive))
