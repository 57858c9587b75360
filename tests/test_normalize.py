"""l2_normalize: unit rows, the Jacobian of docs/derivations.md §2.2, and a finite result at
zero."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contrastive_jax.losses import l2_normalize, l2_normalize_vjp


def test_rows_have_unit_norm_and_keep_direction():
    x = jax.random.normal(jax.random.key(0), (5, 7)) * jnp.arange(1.0, 6.0)[:, None]
    y = l2_normalize(x)
    np.testing.assert_allclose(jnp.linalg.norm(y, axis=-1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(y * jnp.linalg.norm(x, axis=-1, keepdims=True), x, rtol=1e-5)


def test_other_axis():
    x = jax.random.normal(jax.random.key(1), (4, 3))
    np.testing.assert_allclose(l2_normalize(x, axis=0), l2_normalize(x.T).T, rtol=1e-6)


def test_jacobian_is_a_12_8_in_float64():
    with jax.enable_x64(True):
        x = jax.random.normal(jax.random.key(2), (6,), jnp.float64) * 3.0
        jac = jax.jacobian(l2_normalize)(x)
        n = np.linalg.norm(np.asarray(x))
        u = np.asarray(x) / n
        expected = (np.eye(6) - np.outer(u, u)) / n  # derivations §2.2
        np.testing.assert_allclose(jac, expected, rtol=1e-13, atol=1e-15)
        # derivations §2.4
        np.testing.assert_allclose(np.asarray(x) @ np.asarray(jac), 0.0, atol=1e-14)


def test_zero_vector_gives_finite_output_and_gradient():
    x = jnp.zeros((3, 4)).at[1].set(jnp.array([1.0, 2.0, 2.0, 0.0]))
    y = l2_normalize(x)
    assert jnp.all(jnp.isfinite(y))
    np.testing.assert_array_equal(y[0], 0.0)
    g = jax.grad(lambda x: jnp.sum(l2_normalize(x) * jnp.arange(4.0)))(x)
    assert jnp.all(jnp.isfinite(g))
    # Below eps the map is x / eps, so the Jacobian is I / eps (documented).
    np.testing.assert_allclose(g[0], jnp.arange(4.0) / 1e-12, rtol=1e-6)


def test_eps_sets_the_length_below_which_output_is_not_unit():
    x = jnp.array([[3e-4, 4e-4]])  # norm 5e-4
    np.testing.assert_allclose(jnp.linalg.norm(l2_normalize(x, eps=1e-3)), 0.5, rtol=1e-6)
    np.testing.assert_allclose(jnp.linalg.norm(l2_normalize(x, eps=1e-4)), 1.0, rtol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_dtype_is_kept(dtype):
    x = jax.random.normal(jax.random.key(3), (4, 8)).astype(dtype)
    assert l2_normalize(x).dtype == dtype
    assert jax.grad(lambda x: jnp.sum(l2_normalize(x)[:, 0].astype(jnp.float32)))(x).dtype == dtype


def test_vjp_matches_autodiff_including_zero_rows():
    with jax.enable_x64(True):
        x = jax.random.normal(jax.random.key(4), (5, 6), jnp.float64).at[2].set(0.0)
        g = jax.random.normal(jax.random.key(5), (5, 6), jnp.float64)
        expected = jax.vjp(l2_normalize, x)[1](g)[0]
        np.testing.assert_allclose(l2_normalize_vjp(x, g), expected, rtol=1e-13)
