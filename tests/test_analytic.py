"""Every closed form of docs/derivations.md (index §18.2) against jax.grad, and their identities."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from contrastive_jax.analytic import anchor, batch
from contrastive_jax.analytic.gradcheck import CHECKS, check_error, relative_error
from contrastive_jax.losses import info_nce, l2_normalize

# (dtype, n, d): float64 on two shapes, float32 on the larger; float64 with seeds 0 and 1,
# float32 with seed 0.
CASES = [("float64", 3, 2), ("float64", 17, 33), ("float32", 17, 33)]


@pytest.mark.parametrize("check", CHECKS, ids=[c.source + " " + c.name for c in CHECKS])
def test_formula_equals_jax_grad(check):
    # The three cases of a check are one jitted program (one compile, not one per dtype and
    # shape), run once per seed; x64 is on so that the float64 cases are float64, and the
    # float32 case stays float32.
    def every_case(keys):
        return [check.fn(key, jnp.dtype(dtype), n, d)
                for key, (dtype, n, d) in zip(keys, CASES, strict=True)]

    with jax.enable_x64(True):
        every_case = jax.jit(every_case)
        for seed in (0, 1):
            results = every_case(jnp.stack([jax.random.key(seed)] * len(CASES)))
            for (dtype, n, d), (formula, autodiff) in zip(CASES, results, strict=True):
                assert formula.dtype == autodiff.dtype == jnp.dtype(dtype), formula.dtype
                if dtype == "float32" and seed != 0:
                    continue
                error = relative_error(formula, autodiff, check.identity)
                assert error < (1e-10 if dtype == "float64" else 1e-5), (dtype, n, d, seed,
                                                                         error)


def test_check_error_is_the_worst_relative_error_over_shapes_and_seeds():
    check = CHECKS[0]
    with jax.enable_x64(True):
        errors = [relative_error(*jax.jit(check.fn, static_argnums=(1, 2, 3))(
            jax.random.key(seed), jnp.dtype("float64"), 3, 2)) for seed in (0, 1)]
        assert check_error(check, "float64", shapes=((3, 2),), seeds=(0, 1)) == max(errors)
    assert 0 < max(errors) < 1e-10


@jax.jit
def _anchor_loss(u, v, pos, tau):
    c = l2_normalize(v) @ l2_normalize(u)
    return info_nce((c / tau)[None], jnp.asarray(pos)[None])


_anchor_grad = jax.jit(jax.grad(_anchor_loss))

# The identities below hold for every size: a few sizes (each one compiles) and any seed.
sizes = st.sampled_from([(2, 1), (5, 4), (12, 10)])
seeds = st.integers(0, 2**16)


@jax.jit
def _logit_grads(z):
    return batch.symmetric_logit_grad(z), batch.row_logit_grad(z), batch.column_logit_grad(z)


@given(sizes, seeds, st.floats(0.5, 30.0))
def test_gamma_sums_to_zero_with_negative_diagonal(shape, seed, scale):
    n, _ = shape
    with jax.enable_x64(True):
        z = scale * np.random.default_rng(seed).normal(size=(n, n))
        gamma, rows, cols = (np.asarray(a) for a in _logit_grads(z))
        assert abs(gamma.sum()) < 1e-14
        assert np.all(np.diag(gamma) < 0)
        assert np.all(gamma[~np.eye(n, dtype=bool)] >= 0)
        # Each row of P_r - I and each column of P_c - I sums to zero (docs/derivations.md §8.3).
        np.testing.assert_allclose(rows.sum(axis=1), 0.0, atol=1e-15)
        np.testing.assert_allclose(cols.sum(axis=0), 0.0, atol=1e-15)


@jax.jit
def _scale_invariance(u, v, alpha):
    """The loss at alpha u and u, the gradient g at u, u . g, |u| |g|, the gradient at alpha u
    and the rescaling formula applied to g."""
    g = jax.grad(_anchor_loss)(u, v, 0, 0.2)
    return (_anchor_loss(alpha * u, v, 0, 0.2), _anchor_loss(u, v, 0, 0.2), jnp.dot(u, g),
            jnp.linalg.norm(u) * jnp.linalg.norm(g), jax.grad(_anchor_loss)(alpha * u, v, 0, 0.2),
            anchor.rescaled_anchor_grad(g, alpha))


@given(sizes, seeds, st.floats(0.01, 100.0))
def test_anchor_grad_scale_invariance(shape, seed, alpha):
    k, d = shape
    with jax.enable_x64(True):
        rng = np.random.default_rng(seed)
        u, v = rng.normal(size=(d + 1,)), rng.normal(size=(k, d + 1))
        scaled, loss, u_dot_g, norms, scaled_grad, rescaled = _scale_invariance(u, v, alpha)
        np.testing.assert_allclose(scaled, loss, rtol=1e-12)
        assert abs(float(u_dot_g)) <= 1e-12 * float(norms)
        np.testing.assert_allclose(scaled_grad, rescaled, rtol=1e-10, atol=1e-300)


_log_scale_grad = jax.jit(jax.grad(lambda c, t: info_nce((c * jnp.exp(t))[None], jnp.array([0])),
                                   argnums=1))


@given(sizes, seeds, st.floats(-3.0, 3.0))
def test_log_scale_grad_is_negative_iff_positive_beats_weighted_average(shape, seed, t):
    k, _ = shape
    with jax.enable_x64(True):
        c = np.random.default_rng(seed).uniform(-1.0, 1.0, size=k)
        dl_dt = _log_scale_grad(c, t)
        p = np.exp(c * np.exp(t) - np.logaddexp.reduce(c * np.exp(t)))
        margin = float(c[0] - p @ c)
        assert np.sign(float(dl_dt)) == -np.sign(margin)


def test_dot_product_loss_decreases_along_the_ray_when_positive_leads():
    with jax.enable_x64(True):
        v = jax.random.normal(jax.random.key(0), (6, 5), jnp.float64)
        u = v[2] + 0.1 * jax.random.normal(jax.random.key(1), (5,), jnp.float64)
        z = v @ u
        assert int(jnp.argmax(z)) == 2  # the positive leads
        loss = jax.jit(jax.vmap(lambda a: info_nce(((v @ (a * u)) / 0.5)[None], jnp.array([2]))))
        values = np.asarray(loss(jnp.array([0.25, 0.5, 1.0, 2.0, 4.0, 8.0])))
        assert np.all(np.diff(values) < 0)
        assert float(anchor.dot_product_ray_derivative(u, v, 2, 0.5)) < 0
        # ...while the cosine loss is flat along the same ray (docs/derivations.md §12.1 vs §12.4).
        np.testing.assert_allclose(_anchor_loss(8.0 * u, v, 2, 0.5), _anchor_loss(u, v, 2, 0.5),
                                   rtol=1e-12)


@pytest.mark.parametrize("positive_leads", [True, False])
def test_low_temperature_limit_is_the_hinge(positive_leads):
    with jax.enable_x64(True):
        c = jnp.array([0.3, -0.2, 0.5, 0.1]) if not positive_leads else jnp.array(
            [0.6, -0.2, 0.5, 0.1])
        gaps, scaled_grad, scaled_limit = _low_temperature_gaps_and_grads(c)
        gaps = [float(g) for g in gaps]
        assert all(a > b for a, b in itertools.pairwise(gaps))
        assert gaps[-1] < 1e-9
        np.testing.assert_allclose(scaled_grad, scaled_limit, atol=1e-9)


@jax.jit
def _low_temperature_gaps_and_grads(c):
    """|loss - hinge limit| at tau = 0.5, 0.1, 0.02, 0.004, and tau * the gradient and tau * its
    limit at tau = 0.004: one program."""
    gaps = [jnp.abs(info_nce((c / tau)[None], jnp.array([0]))
                    - anchor.low_temperature_loss_limit(c, 0, tau))
            for tau in (0.5, 0.1, 0.02, 0.004)]
    tau = 0.004
    grad = jax.grad(lambda c: info_nce((c / tau)[None], jnp.array([0])))(c)
    return gaps, grad * tau, (
        anchor.low_temperature_grad_limit(c, 0, tau) * tau)


def test_high_temperature_weights_become_uniform_and_gradient_vanishes():
    c = jnp.array([0.9, -0.5, 0.2])
    for tau in (1e2, 1e4):
        p = jax.nn.softmax(c / tau)
        np.testing.assert_allclose(p, 1 / 3, atol=2 / tau)
    grads = [jnp.linalg.norm(anchor.infonce_similarity_grad(c, 0, tau)) for tau in (1, 10, 100)]
    assert grads[0] > grads[1] > grads[2]
    np.testing.assert_allclose(anchor.high_temperature_grad_limit(3, 0, 1.0),
                               [-2 / 3, 1 / 3, 1 / 3], rtol=1e-6)


def test_weight_ratio_examples_of_derivations_7_1():
    np.testing.assert_allclose(anchor.softmax_weight_ratio(0.3, 0.2, 0.1), np.e, rtol=1e-5)
    np.testing.assert_allclose(anchor.softmax_weight_ratio(0.3, 0.2, 0.01), 22026.47, rtol=1e-4)


def test_cosine_gradient_norm_and_orthogonality():
    with jax.enable_x64(True):
        u, v = jnp.array([3.0, 0.0, 4.0]), jnp.array([1.0, 2.0, -2.0])
        gu, gv = anchor.cosine_grads(u, v)
        c = float(jnp.dot(u, v) / (jnp.linalg.norm(u) * jnp.linalg.norm(v)))
        np.testing.assert_allclose(jnp.linalg.norm(gu), np.sqrt(1 - c**2) / 5.0, rtol=1e-14)
        np.testing.assert_allclose(jnp.dot(u, gu), 0.0, atol=1e-15)
        np.testing.assert_allclose(jnp.dot(v, gv), 0.0, atol=1e-15)


def test_candidate_grads_pull_the_positive_push_the_negatives():
    u = jnp.array([1.0, 0.2, 0.0])
    v = jnp.array([[1.0, 0.0, 0.5], [0.0, 1.0, 0.0], [-1.0, 0.3, 0.2]])
    grads = anchor.infonce_candidate_grads(u, v, 0, 0.1)
    u_hat = u / jnp.linalg.norm(u)
    # Descent moves v_pos towards u (negative inner product of the gradient with u_hat), and the
    # negatives away from it.
    assert float(jnp.dot(grads[0], u_hat)) < 0
    assert float(jnp.dot(grads[1], u_hat)) > 0 and float(jnp.dot(grads[2], u_hat)) > 0
