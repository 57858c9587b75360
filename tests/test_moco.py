"""moco_infonce: queue negatives, no gradient into keys or queue, input errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference_losses as ref
from contrastive_jax.losses import moco_infonce


def _batch(n=6, k=20, d=8, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(n, d)).astype(np.float32)
    key = (q + 0.5 * rng.normal(size=(n, d))).astype(np.float32)
    queue = rng.normal(size=(k, d)).astype(np.float32)
    return q, key, queue


@pytest.mark.parametrize("tau", [0.07, 0.2, 1.0])
def test_matches_reference(tau):
    q, k, queue = _batch()
    np.testing.assert_allclose(moco_infonce(q, k, queue, tau),
                               ref.moco_infonce(q, k, queue, float(np.float32(tau))), rtol=1e-6)


def test_gradient_flows_only_into_queries():
    q, k, queue = _batch(seed=1)
    gq, gk, gqueue = jax.grad(moco_infonce, argnums=(0, 1, 2))(q, k, queue, 0.1)
    assert float(jnp.max(jnp.abs(gq))) > 0
    assert float(jnp.max(jnp.abs(gk))) == 0.0
    assert float(jnp.max(jnp.abs(gqueue))) == 0.0


def test_queue_of_copies_of_the_key_gives_log_k_plus_one():
    q, k, _ = _batch(n=1, seed=2)
    queue = np.repeat(k, 9, axis=0)
    np.testing.assert_allclose(moco_infonce(q, k, queue, 0.1), np.log(10.0), rtol=1e-6)


def test_errors():
    q, k, queue = _batch()
    with pytest.raises(ValueError, match="queue rows must have the query dim 8"):
        moco_infonce(q, k, queue[:, :4], 0.1)
    with pytest.raises(ValueError, match="queue is empty"):
        moco_infonce(q, k, queue[:0], 0.1)
    with pytest.raises(ValueError, match="q and k must have the same shape"):
        moco_infonce(q, k[:3], queue, 0.1)
    with pytest.raises(ValueError, match="temperature must be a positive"):
        moco_infonce(q, k, queue, -0.1)
