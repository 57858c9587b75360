"""nt_xent against 004's pseudo-code, chance level, its analytic backward, and input errors."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference_losses as ref
from contrastive_jax.losses import nt_xent
from contrastive_jax.objectives import LossSettings


def _views(n, d, seed=0, noise=1.0):
    """Two views; ``noise=None`` makes the second independent of the first."""
    rng = np.random.default_rng(seed)
    z1 = rng.normal(size=(n, d)).astype(np.float32)
    z2 = rng.normal(size=(n, d)) if noise is None else z1 + noise * rng.normal(size=(n, d))
    return z1, z2.astype(np.float32)


@pytest.mark.parametrize("n, d", list(itertools.product([2, 3, 17], [1, 8, 64])))
def test_matches_004_pseudocode_in_float32(n, d):
    for noise in (None, 0.3):  # independent views, then correlated views (tiny losses)
        z1, z2 = _views(n, d, seed=n * d, noise=noise)
        for tau in (1.0, 0.07, 0.01):
            expected = ref.nt_xent(z1, z2, float(np.float32(tau)))
            # A float32 cosine carries ~1e-7 of rounding, i.e. ~1e-7 / tau in each logit; a loss
            # far below 1 (a confident positive) inherits that as a *relative* error.
            # Below float32's smallest normal number (1.2e-38) a loss cannot be represented.
            rtol = 1e-6 if expected > 1e-2 else max(1e-6, 2e-7 / tau)
            for impl in ("tiled", "analytic", "autodiff"):
                np.testing.assert_allclose(nt_xent(z1, z2, tau, impl=impl), expected, rtol=rtol,
                                           atol=np.finfo(np.float32).tiny, err_msg=impl)


@pytest.mark.parametrize("n", [2, 5, 64])
@pytest.mark.parametrize("tau", [0.01, 0.5])
def test_identical_embeddings_give_chance_level(n, tau):
    z = jnp.ones((n, 8))
    # Equal cosines up to float32 rounding (~1e-7, i.e. ~1e-7 / tau per logit).
    np.testing.assert_allclose(nt_xent(z, z, tau), np.log(2 * n - 1), atol=max(1e-6, 2e-7 / tau))


def test_self_similarity_is_masked():
    # Without the mask every row would include exp(1/tau), the largest term (004).
    z1, z2 = _views(4, 3, seed=1, noise=0.2)
    unmasked = []
    views = np.concatenate([z1, z2]) / np.linalg.norm(np.concatenate([z1, z2]), axis=1)[:, None]
    s = views @ views.T / 0.1
    for i in range(8):
        unmasked.append(np.logaddexp.reduce(s[i]) - s[i, (i + 4) % 8])
    assert abs(float(nt_xent(z1, z2, 0.1)) - np.mean(unmasked)) > 1e-2


def test_pairs_are_symmetric_in_the_two_views():
    z1, z2 = _views(6, 5, seed=2)
    np.testing.assert_allclose(nt_xent(z1, z2, 0.2), nt_xent(z2, z1, 0.2), rtol=1e-6)


@pytest.mark.parametrize("tau", [0.05, 0.5])
def test_analytic_backward_equals_autodiff(tau):
    for dtype, tol in ((jnp.float32, 1e-6), (jnp.float64, 1e-12)):
        with jax.enable_x64(dtype == jnp.float64):
            z1, z2 = (jnp.asarray(a, dtype) for a in _views(29, 24, seed=3, noise=0.5))
            z1 = z1.at[4].set(0.0)
            t = jnp.asarray(tau, dtype)
            f = jax.jit(jax.value_and_grad(nt_xent, argnums=(0, 1, 2)), static_argnames="impl")
            (la, ga), (lb, gb) = f(z1, z2, t, impl="autodiff"), f(z1, z2, t, impl="analytic")
            np.testing.assert_allclose(lb, la, rtol=tol)
            for a, b in zip(ga, gb, strict=True):
                a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
                assert np.linalg.norm(a - b) <= tol * np.linalg.norm(a)


@pytest.mark.parametrize("impl", ["autodiff", "analytic"])
def test_finite_with_bfloat16_and_zero_rows_at_tau_001(impl):
    z = jnp.zeros((8, 16), jnp.bfloat16).at[:4].set(1.0)
    loss, grads = jax.value_and_grad(nt_xent, argnums=(0, 1))(z, z, 0.01, impl=impl)
    assert jnp.isfinite(loss) and all(bool(jnp.all(jnp.isfinite(g))) for g in grads)
    assert grads[0].dtype == jnp.bfloat16


@pytest.mark.parametrize("tau", [0.0, -0.5, float("inf"), float("nan")])
def test_non_positive_temperature_is_rejected(tau):
    z1, z2 = _views(4, 3)
    with pytest.raises(ValueError, match="temperature must be a positive finite number"):
        nt_xent(z1, z2, tau)


def test_shape_errors():
    z1, z2 = _views(4, 3)
    with pytest.raises(ValueError, match=r"z1 \(4, 3\) and z2 \(3, 3\)"):
        nt_xent(z1, z2[:3], 0.1)
    with pytest.raises(ValueError, match="batch size 1"):
        nt_xent(z1[:1], z2[:1], 0.1)
    with pytest.raises(ValueError, match="rank-2"):
        nt_xent(z1[0], z2[0], 0.1)


def test_dot_product_logits_match_the_reference_and_reward_growing_norms():
    """normalize=False: logits z_i . z_j / tau (SimCLR Table 5 "no l2 norm"), exact in float64;
    with the positive leading, scaling every embedding by 2 lowers the loss (000 P10)."""
    z1, z2 = _views(5, 4, seed=3, noise=0.2)
    with jax.enable_x64(True):
        a, b = jnp.asarray(z1, jnp.float64), jnp.asarray(z2, jnp.float64)
        loss = nt_xent(a, b, 0.5, impl="autodiff", normalize=False)
        np.testing.assert_allclose(loss, ref.nt_xent(z1, z2, 0.5, normalize=False), rtol=1e-12)
        # every positive leads its row (near-orthogonal classes, close views): the loss falls
        # as all norms grow, towards 0 (with cosines it would not move)
        u = jnp.eye(4, dtype=jnp.float64) + 0.01 * a[:4]
        v = u + 0.01 * b[:4]
        losses = [nt_xent(s * u, s * v, 0.5, impl="autodiff", normalize=False)
                  for s in (1.0, 2.0, 4.0)]
        assert losses[0] > losses[1] > losses[2] > 0
        np.testing.assert_allclose(nt_xent(4 * u, 4 * v, 0.5, impl="autodiff"),
                                   nt_xent(u, v, 0.5, impl="autodiff"), rtol=1e-12)
        unit_a, unit_b = a / jnp.linalg.norm(a, axis=1, keepdims=True), b / jnp.linalg.norm(
            b, axis=1, keepdims=True)
        np.testing.assert_allclose(nt_xent(unit_a, unit_b, 0.5, impl="autodiff",
                                           normalize=False),
                                   nt_xent(a, b, 0.5, impl="autodiff"), rtol=1e-12)
    for impl in ("tiled", "analytic"):
        with pytest.raises(ValueError, match="impl='autodiff' only"):
            nt_xent(z1, z2, 0.5, impl=impl, normalize=False)
    # the config's loss block says what to change
    with pytest.raises(ValueError, match=r"set loss\.impl = 'autodiff'"):
        LossSettings(normalize=False)
    LossSettings(normalize=False, impl="autodiff", max_scale=float("inf"))
    with pytest.raises(ValueError, match="max_scale must be > 0"):
        LossSettings(max_scale=0.0)
