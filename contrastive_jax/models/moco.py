"""MoCo's momentum key encoder and queue (004), as pure functions on the train state.

The query encoder is a :class:`~contrastive_jax.models.simclr.SimCLR` module. The key
encoder is a second copy of its parameters, never differentiated, moved towards the query
parameters after every step by an exponential moving average,

    theta_k <- m theta_k + (1 - m) theta_q        (``optax.incremental_update``),

and the queue is a FIFO ``(K, d)`` buffer of past keys: each step enqueues the global batch's
keys over the oldest ones, so ``K`` must be a multiple of the global batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def momentum_update(key_params, query_params, momentum: float):
    """``m * key + (1 - m) * query`` leaf by leaf."""
    if not 0.0 <= momentum <= 1.0:
        raise ValueError(f"momentum must lie in [0, 1]; got {momentum}")
    return optax.incremental_update(query_params, key_params, step_size=1.0 - momentum)


def check_queue_size(queue_size: int, global_batch: int) -> None:
    """A ValueError unless ``queue_size`` is a positive multiple of ``global_batch``."""
    if queue_size < global_batch or queue_size % global_batch:
        raise ValueError(f"MoCo queue size {queue_size} must be a positive multiple of the "
                         f"global batch {global_batch}; change model.queue_size or "
                         "data.batch_size")


def init_queue(key: jax.Array, size: int, dim: int) -> jax.Array:
    """A ``(size, dim)`` queue of random unit vectors (MoCo's initialisation)."""
    q = jax.random.normal(key, (size, dim), jnp.float32)
    return q / jnp.linalg.norm(q, axis=1, keepdims=True)


def enqueue(queue: jax.Array, pointer: jax.Array, keys: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Write ``keys (B, d)`` over rows ``pointer .. pointer + B - 1``; the next pointer.

    ``B`` divides ``K`` (:func:`check_queue_size`), so a write never wraps.
    """
    keys = jax.lax.stop_gradient(keys).astype(queue.dtype)
    queue = jax.lax.dynamic_update_slice(queue, keys, (pointer, jnp.zeros_like(pointer)))
    return queue, (pointer + keys.shape[0]) % queue.shape[0]
