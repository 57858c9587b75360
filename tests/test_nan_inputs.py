"""A NaN anywhere in a loss's inputs gives a NaN loss: every loss, impl and sharded strategy.

The trainer's non-finite guard (contrastive_jax.training.train) skips a step whose loss or
gradient is not finite; it relies on a NaN input never being averaged away into a finite loss
(a masked log-sum-exp that turns NaN into an empty row would do exactly that).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contrastive_jax.errors import InputError
from contrastive_jax.losses import clip_loss, info_nce, moco_infonce, nt_xent
from contrastive_jax.losses.info_nce import masked_logsumexp
from contrastive_jax.losses.sharded import sharded_clip_loss, sharded_nt_xent, sharded_siglip_loss
from contrastive_jax.losses.siglip import siglip_loss
from contrastive_jax.mesh import make_mesh

RNG = np.random.default_rng(0)
X = RNG.normal(size=(8, 4)).astype(np.float32)
Y = RNG.normal(size=(8, 4)).astype(np.float32)


def with_nan(a, index):
    a = np.array(a, copy=True)
    a[index] = np.nan
    return a


@pytest.mark.parametrize("where", ["negative", "positive"])
def test_info_nce_and_logsumexp_propagate_nan(where):
    logits = RNG.normal(size=(4, 5)).astype(np.float32)
    logits = with_nan(logits, (1, 3) if where == "negative" else (1, 0))
    assert np.isnan(float(info_nce(logits, jnp.zeros(4, jnp.int32))))
    mask = np.ones((4, 5), bool)
    lse = np.asarray(masked_logsumexp(jnp.asarray(logits), mask))
    assert np.isnan(lse[1]) and np.all(np.isfinite(np.delete(lse, 1)))
    # -inf still removes a candidate and an empty mask still gives -inf
    assert float(masked_logsumexp(jnp.array([0.0, -jnp.inf]), jnp.array([True, True]))) == 0.0
    assert float(masked_logsumexp(jnp.array([1.0, 2.0]), jnp.array([False, False]))) == -np.inf


@pytest.mark.parametrize("impl", ["tiled", "dense_vjp", "autodiff"])
@pytest.mark.parametrize("bad", ["x", "y", "scale"])
def test_clip_and_nt_xent_return_nan(impl, bad):
    """NaN in either embedding or in the (traced) log-scale / temperature; a concrete NaN
    temperature is refused at the boundary instead (an InputError naming it)."""
    x, y = (with_nan(X, (3, 1)) if bad == "x" else X), (with_nan(Y, (5, 2)) if bad == "y" else Y)
    s = jnp.nan if bad == "scale" else 2.0
    assert np.isnan(float(clip_loss(x, y, s, impl=impl)))
    tau = jnp.nan if bad == "scale" else 0.1
    traced = jax.jit(lambda a, b, t: nt_xent(a, b, t, impl=impl))
    assert np.isnan(float(traced(x, y, tau)))
    if bad == "scale":
        with pytest.raises(InputError, match="temperature must be a positive finite number"):
            nt_xent(x, y, float("nan"), impl=impl)


@pytest.mark.parametrize("impl", ["tiled", "autodiff"])
@pytest.mark.parametrize("bad", ["x", "y", "scale", "bias"])
def test_siglip_returns_nan(impl, bad):
    x, y = (with_nan(X, (3, 1)) if bad == "x" else X), (with_nan(Y, (5, 2)) if bad == "y" else Y)
    loss = siglip_loss(x, y, jnp.nan if bad == "scale" else 2.0,
                       jnp.nan if bad == "bias" else -1.0, impl=impl)
    assert np.isnan(float(loss))


@pytest.mark.parametrize("bad", ["q", "k", "queue", "temperature"])
def test_moco_returns_nan(bad):
    queue = RNG.normal(size=(16, 4)).astype(np.float32)
    q = with_nan(X, (2, 0)) if bad == "q" else X
    k = with_nan(Y, (6, 3)) if bad == "k" else Y
    queue = with_nan(queue, (9, 1)) if bad == "queue" else queue
    loss = jax.jit(moco_infonce)(q, k, queue, jnp.nan if bad == "temperature" else 0.1)
    assert np.isnan(float(loss))


@pytest.mark.parametrize("strategy", ["all_gather", "all_gather_no_grad", "ring"])
def test_sharded_losses_return_nan(strategy):
    mesh = make_mesh({"data": 4}, jax.devices()[:4])
    x = with_nan(X, (6, 1))  # a row on the last device
    assert np.isnan(float(sharded_clip_loss(x, Y, 2.0, mesh=mesh, strategy=strategy)))
    assert np.isnan(float(sharded_nt_xent(X, x, 0.1, mesh=mesh, strategy=strategy)))
    if strategy != "all_gather_no_grad":
        assert np.isnan(float(sharded_siglip_loss(Y, x, 2.0, -1.0, mesh=mesh,
                                                  strategy=strategy)))
