"""moco_infonce: queue negatives, no gradient into keys or queue, input errors."""

import jax
import numpy as np
import pytest

import float32_bounds as fb
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
    tau32 = float(np.float32(tau))
    part = fb.moco_dense(q, k, queue, tau32)
    bound = fb.loss_bound(part, fb.logit_error(1.0 / tau32, part.max_logit, q.shape[1],
                                                   scale_roundings=2.0))
    fb.assert_within(moco_infonce(q, k, queue, tau), ref.moco_infonce(q, k, queue, tau32), bound)


def test_gradient_flows_only_into_queries():
    q, k, queue = _batch(seed=1)
    gq, gk, gqueue = jax.grad(moco_infonce, argnums=(0, 1, 2))(q, k, queue, 0.1)
    assert float(np.abs(gq).max()) > 0
    assert float(np.abs(gk).max()) == 0.0
    assert float(np.abs(gqueue).max()) == 0.0


def test_queue_of_copies_of_the_key_gives_log_k_plus_one():
    q, k, _ = _batch(n=1, seed=2)
    queue = np.repeat(k, 9, axis=0)
    # Ten equal logits in exact arithmetic; float32 rounds the positive (a row-wise dot) and the
    # queue's (a matmul) differently, within the cosine bound.
    part = fb.moco_dense(q, k, queue, float(np.float32(0.1)))
    bound = fb.loss_bound(part, fb.logit_error(10.0, part.max_logit, q.shape[1],
                                                   scale_roundings=2.0))
    fb.assert_within(moco_infonce(q, k, queue, 0.1), np.log(10.0), bound)


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
