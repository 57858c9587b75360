"""nt_xent against the definition of docs/derivations.md §9.1, chance level, its dense_vjp backward,
and input errors."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import float32_bounds as fb
import reference_losses as ref
from contrastive_jax.losses import nt_xent
from contrastive_jax.training.methods import LossSettings


def _views(n, d, seed=0, noise=1.0):
    """Two views; ``noise=None`` makes the second independent of the first."""
    rng = np.random.default_rng(seed)
    z1 = rng.normal(size=(n, d)).astype(np.float32)
    z2 = rng.normal(size=(n, d)) if noise is None else z1 + noise * rng.normal(size=(n, d))
    return z1, z2.astype(np.float32)


def _nt_xent_bound(z1, z2, tau):
    """The float32 bound (tests/float32_bounds.py) of nt_xent on these views at float32 tau."""
    return fb.bounds_for("nt_xent", z1, z2, tau).loss


@jax.jit
def _every_impl(z1, z2, tau):
    """The loss of every impl: one program per shape (a new temperature reuses it)."""
    return {impl: nt_xent(z1, z2, tau, impl=impl) for impl in ("tiled", "dense_vjp", "autodiff")}


@pytest.mark.parametrize("n, d", list(itertools.product([2, 3, 17], [1, 8, 64])))
def test_matches_reference_in_float32(n, d):
    for noise in (None, 0.3):  # independent views, then correlated views (tiny losses)
        z1, z2 = _views(n, d, seed=n * d, noise=noise)
        for tau in (1.0, 0.07, 0.01):
            tau32 = float(np.float32(tau))
            expected = ref.nt_xent(z1, z2, tau32)
            bound = _nt_xent_bound(z1, z2, tau32)
            for impl, loss in _every_impl(z1, z2, np.float32(tau)).items():
                fb.assert_within(loss, expected, bound, f"{impl}, tau {tau}, noise {noise}")


@pytest.mark.parametrize("n", [2, 5, 64])
@pytest.mark.parametrize("tau", [0.01, 0.5])
def test_identical_embeddings_give_chance_level(n, tau):
    z = np.ones((n, 8), np.float32)
    tau32 = float(np.float32(tau))
    fb.assert_within(nt_xent(z, z, tau), np.log(2 * n - 1), _nt_xent_bound(z, z, tau32))


def test_self_similarity_is_masked():
    # Without the mask every row would include exp(1/tau), the largest term (docs/derivations.md
    # §9.1 step 4).
    z1, z2 = _views(4, 3, seed=1, noise=0.2)
    unmasked = []
    views = np.concatenate([z1, z2]) / np.linalg.norm(np.concatenate([z1, z2]), axis=1)[:, None]
    s = views @ views.T / 0.1
    for i in range(8):
        unmasked.append(np.logaddexp.reduce(s[i]) - s[i, (i + 4) % 8])
    assert abs(float(nt_xent(z1, z2, 0.1)) - np.mean(unmasked)) > 1e-2


def test_pairs_are_symmetric_in_the_two_views():
    z1, z2 = _views(6, 5, seed=2)
    tau32 = float(np.float32(0.2))
    expected = ref.nt_xent(z1, z2, tau32)
    assert abs(ref.nt_xent(z2, z1, tau32) - expected) <= 1e-12 * expected
    for a, b in ((z1, z2), (z2, z1)):
        fb.assert_within(nt_xent(a, b, 0.2), expected, _nt_xent_bound(z1, z2, tau32))


@jax.jit
def _both_impls(z1, z2, tau):
    """Value and gradients of impl="autodiff" and impl="dense_vjp": one program per dtype (a
    new temperature reuses it)."""
    return {impl: jax.value_and_grad(nt_xent, argnums=(0, 1, 2))(z1, z2, tau, impl=impl)
            for impl in ("autodiff", "dense_vjp")}


@pytest.mark.parametrize("tau", [0.05, 0.5])
def test_dense_vjp_backward_equals_autodiff(tau):
    z1, z2 = _views(29, 24, seed=3, noise=0.5)
    z1[4] = 0.0
    with jax.enable_x64(True):  # float64: the two backward passes agree to round-off
        a, b, t = jnp.asarray(z1, jnp.float64), jnp.asarray(z2, jnp.float64), jnp.float64(tau)
        both = _both_impls(a, b, t)
        (la, ga), (lb, gb) = both["autodiff"], both["dense_vjp"]
        np.testing.assert_allclose(lb, la, rtol=1e-12)
        for x, y in zip(ga, gb, strict=True):
            x, y = np.asarray(x, np.float64).ravel(), np.asarray(y, np.float64).ravel()
            assert np.linalg.norm(x - y) <= 1e-12 * np.linalg.norm(x)
        tau32 = float(np.float32(tau))
        want_loss, want = _both_impls(a, b, jnp.float64(tau32))["autodiff"]
    # float32: each impl against the float64 result, within the derived bounds.
    bounds = fb.bounds_for("nt_xent", z1, z2, tau32)
    for impl, (loss, grads) in _both_impls(z1, z2, np.float32(tau)).items():
        fb.assert_within(loss, want_loss, bounds.loss, impl)
        fb.assert_rows_within(grads[0], want[0], bounds.rows_x, f"{impl} grad_z1")
        fb.assert_rows_within(grads[1], want[1], bounds.rows_y, f"{impl} grad_z2")
        fb.assert_within(grads[2], want[2], bounds.third_grad, f"{impl} grad_tau")


def test_analytic_is_a_deprecated_alias_of_dense_vjp():
    z1, z2 = _views(7, 5, seed=2, noise=0.5)
    grad = jax.value_and_grad(nt_xent, argnums=(0, 1, 2))
    want_loss, want = grad(z1, z2, jnp.float32(0.3), impl="dense_vjp")
    with pytest.warns(DeprecationWarning, match=r"impl='analytic' is deprecated.*'dense_vjp'"):
        loss, grads = grad(z1, z2, jnp.float32(0.3), impl="analytic")
    assert float(loss) == float(want_loss) and float(loss) > 0
    for g, w in zip(grads, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    # the config's loss block: the old name is accepted, warned about and mapped
    with pytest.warns(DeprecationWarning, match="'dense_vjp'"):
        settings = LossSettings(name="clip", impl="analytic")
    assert settings.impl == "dense_vjp"
    assert settings.tiled_kwargs() == {}


@jax.jit
def _both_impls_at_tau_001(z1, z2):
    return {impl: jax.value_and_grad(nt_xent, argnums=(0, 1))(z1, z2, 0.01, impl=impl)
            for impl in ("autodiff", "dense_vjp")}


@pytest.mark.parametrize("impl", ["autodiff", "dense_vjp"])
def test_finite_with_bfloat16_and_zero_rows_at_tau_001(impl):
    z = jnp.zeros((8, 16), jnp.bfloat16).at[:4].set(1.0)
    loss, grads = _both_impls_at_tau_001(z, z)[impl]  # both impls: one program
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
    with the positive leading, scaling every embedding by 2 lowers the loss (docs/derivations.md
    §12.4)."""
    z1, z2 = _views(5, 4, seed=3, noise=0.2)

    @jax.jit
    def losses(a, b):  # every loss below: one program
        u = jnp.eye(4, dtype=jnp.float64) + 0.01 * a[:4]
        v = u + 0.01 * b[:4]
        unit_a, unit_b = a / jnp.linalg.norm(a, axis=1, keepdims=True), b / jnp.linalg.norm(
            b, axis=1, keepdims=True)
        return {"dot": nt_xent(a, b, 0.5, impl="autodiff", normalize=False),
                "ray": [nt_xent(s * u, s * v, 0.5, impl="autodiff", normalize=False)
                        for s in (1.0, 2.0, 4.0)],
                "cosine 4u": nt_xent(4 * u, 4 * v, 0.5, impl="autodiff"),
                "cosine u": nt_xent(u, v, 0.5, impl="autodiff"),
                "dot unit": nt_xent(unit_a, unit_b, 0.5, impl="autodiff", normalize=False),
                "cosine": nt_xent(a, b, 0.5, impl="autodiff")}

    with jax.enable_x64(True):
        got = losses(jnp.asarray(z1, jnp.float64), jnp.asarray(z2, jnp.float64))
        np.testing.assert_allclose(got["dot"], ref.nt_xent(z1, z2, 0.5, normalize=False),
                                   rtol=1e-12)
        # every positive leads its row (near-orthogonal classes, close views): the loss falls
        # as all norms grow, towards 0 (with cosines it would not move)
        ray = [float(v) for v in got["ray"]]
        assert ray[0] > ray[1] > ray[2] > 0
        np.testing.assert_allclose(got["cosine 4u"], got["cosine u"], rtol=1e-12)
        np.testing.assert_allclose(got["dot unit"], got["cosine"], rtol=1e-12)
    for impl in ("tiled", "dense_vjp"):
        with pytest.raises(ValueError, match="impl='autodiff' only"):
            nt_xent(z1, z2, 0.5, impl=impl, normalize=False)
    # the config's loss block says what to change
    with pytest.raises(ValueError, match=r"set loss\.impl = 'autodiff'"):
        LossSettings(normalize=False)
    LossSettings(normalize=False, impl="autodiff", max_scale=float("inf"))
    with pytest.raises(ValueError, match="max_scale must be > 0"):
        LossSettings(max_scale=0.0)
