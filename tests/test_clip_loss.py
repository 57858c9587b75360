"""clip_loss against 001's step-by-step algorithm, its edge cases, and its analytic backward."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference_losses as ref
from contrastive_jax.losses import clip_loss, info_nce, logit_scale


def _pair(n, d, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)).astype(dtype), rng.normal(size=(n, d)).astype(dtype)


def _rel(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize("n, d", list(itertools.product([2, 3, 17, 256], [1, 8, 64])))
def test_matches_001_reference_in_float32(n, d):
    x, y = _pair(n, d, seed=n + d)
    for scale in (1.0, 14.3, 100.0):
        log_scale = np.float32(np.log(scale))
        # The reference gets the float32 logit scale the loss actually uses (001's input).
        expected = ref.clip_loss(x, y, float(logit_scale(log_scale)))
        for impl in ("tiled", "analytic", "autodiff"):
            loss = clip_loss(x, y, log_scale, impl=impl, **({"block_size": 64} if impl == "tiled"
                                                          else {}))
            np.testing.assert_allclose(loss, expected, rtol=1e-6, err_msg=impl)


def test_batch_of_one_is_rejected():
    x, y = _pair(1, 8)
    with pytest.raises(ValueError, match="batch size 1"):
        clip_loss(x, y, 0.0)


def test_directions_are_the_two_info_nce_and_their_mean():
    x, y = _pair(9, 5, seed=1)
    ls = jnp.log(20.0)
    z = 20.0 * (x / np.linalg.norm(x, axis=1, keepdims=True)) @ (
        y / np.linalg.norm(y, axis=1, keepdims=True)).T
    xy, yx = info_nce(z, jnp.arange(9)), info_nce(z.T, jnp.arange(9))
    np.testing.assert_allclose(clip_loss(x, y, ls, direction="x_to_y"), xy, rtol=2e-6)
    np.testing.assert_allclose(clip_loss(x, y, ls, direction="y_to_x"), yx, rtol=2e-6)
    np.testing.assert_allclose(clip_loss(x, y, ls), 0.5 * (xy + yx), rtol=2e-6)
    np.testing.assert_allclose(clip_loss(y, x, ls, direction="x_to_y"),
                               clip_loss(x, y, ls, direction="y_to_x"), rtol=1e-6)


def test_scale_is_clipped_at_max_scale_with_zero_log_scale_gradient():
    x, y = _pair(6, 4, seed=2)
    at_cap = clip_loss(x, y, jnp.log(100.0))
    np.testing.assert_allclose(clip_loss(x, y, jnp.log(1000.0)), at_cap, rtol=1e-6)
    assert float(jax.grad(clip_loss, argnums=2)(x, y, jnp.log(1000.0))) == 0.0
    assert float(jax.grad(clip_loss, argnums=2)(x, y, 1e4)) == 0.0  # no inf * 0 = NaN
    assert float(jax.grad(clip_loss, argnums=2)(x, y, jnp.log(50.0))) != 0.0
    np.testing.assert_allclose(clip_loss(x, y, jnp.log(500.0), max_scale=500.0),
                               ref.clip_loss(x, y, 500.0), rtol=1e-6)
    np.testing.assert_allclose(logit_scale(jnp.log(30.0)), 30.0, rtol=1e-6)


@pytest.mark.parametrize("impl", ["autodiff", "analytic"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("case", ["identical", "near_identical", "all_zero", "one_zero_row"])
def test_finite_at_scale_100(case, dtype, impl):
    n, d = 16, 32
    base = jax.random.normal(jax.random.key(3), (1, d))
    x = {
        "identical": jnp.tile(base, (n, 1)),
        "near_identical": base + 1e-6 * jax.random.normal(jax.random.key(4), (n, d)),
        "all_zero": jnp.zeros((n, d)),
        "one_zero_row": jax.random.normal(jax.random.key(5), (n, d)).at[3].set(0.0),
    }[case].astype(dtype)
    y = x
    loss, grads = jax.value_and_grad(clip_loss, argnums=(0, 1, 2))(x, y, jnp.log(100.0),
                                                                     impl=impl)
    assert jnp.isfinite(loss)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)
    assert grads[0].dtype == dtype
    if case in ("identical", "all_zero"):  # every logit equal: chance level
        # float32 cosines of identical rows differ by ~1e-7, i.e. ~1e-5 in a logit of scale 100.
        np.testing.assert_allclose(loss, np.log(n), atol=1e-5 if case == "identical" else 1e-6)


def test_bfloat16_inputs_compute_in_float32():
    x, y = _pair(12, 16, seed=6)
    xb, yb = jnp.asarray(x, jnp.bfloat16), jnp.asarray(y, jnp.bfloat16)
    loss = clip_loss(xb, yb, jnp.log(100.0))
    assert loss.dtype == jnp.float32
    expected = clip_loss(xb.astype(jnp.float32), yb.astype(jnp.float32), jnp.log(100.0))
    np.testing.assert_allclose(loss, expected, rtol=1e-7)


def test_well_separated_rows_keep_relative_precision():
    # x_i = y_i = e_i: Z = s I exactly, each row and column loss is log1p((N - 1) e^-s).
    n, s = 8, 20.0
    x = jnp.eye(n, 16) * jnp.arange(1.0, n + 1)[:, None]
    expected = np.log1p((n - 1) * np.exp(-np.float64(logit_scale(jnp.log(s)))))
    np.testing.assert_allclose(clip_loss(x, x, jnp.log(s)), expected, rtol=1e-6)


@pytest.mark.parametrize("direction", ["both", "x_to_y", "y_to_x"])
@pytest.mark.parametrize("log_scale", [np.log(14.3), np.log(100.0), np.log(250.0)])
def test_analytic_backward_equals_autodiff(direction, log_scale):
    for dtype, tol in ((jnp.float32, 1e-6), (jnp.float64, 1e-12)):
        with jax.enable_x64(dtype == jnp.float64):
            x, y = (jnp.asarray(a, dtype) for a in _pair(37, 24, seed=7))
            x = x.at[5].set(0.0)  # the zero-norm branch of the normalisation
            ls = jnp.asarray(log_scale, dtype)
            out = {}
            for impl in ("autodiff", "analytic"):
                f = jax.jit(jax.value_and_grad(clip_loss, argnums=(0, 1, 2)),
                            static_argnames=("direction", "impl"))
                out[impl] = f(x, y, ls, direction=direction, impl=impl)
            (la, ga), (lb, gb) = out["autodiff"], out["analytic"]
            np.testing.assert_allclose(lb, la, rtol=tol)
            for a, b in zip(ga, gb, strict=True):
                assert _rel(b, a) <= tol if np.any(np.asarray(a)) else np.all(np.asarray(b) == 0)


def test_analytic_backward_returns_input_dtypes():
    x, y = _pair(8, 4)
    grads = jax.grad(clip_loss, argnums=(0, 1, 2))(
        jnp.asarray(x, jnp.bfloat16), jnp.asarray(y), jnp.float32(2.0), impl="analytic")
    assert [g.dtype for g in grads] == [jnp.bfloat16, jnp.float32, jnp.float32]


@pytest.mark.parametrize(
    "x, y, kwargs, message",
    [
        (np.zeros((4, 3, 2)), np.zeros((4, 3)), {}, r"x must be a rank-2.*\(4, 3, 2\)"),
        (np.zeros((4, 3)), np.zeros((5, 3)), {}, r"\(4, 3\) and y \(5, 3\).*batch sizes"),
        (np.zeros((4, 3)), np.zeros((4, 2)), {}, r"embedding dims"),
        (np.zeros((4, 3), int), np.zeros((4, 3), int), {}, "floating point"),
        (np.zeros((4, 3)), np.zeros((4, 3)), {"direction": "xy"}, "direction must be one of"),
        (np.zeros((4, 3)), np.zeros((4, 3)), {"impl": "tiled?"}, "impl must be one of"),
        (np.zeros((4, 3)), np.zeros((4, 3)), {"max_scale": 0.0},
         "max_scale must be a positive finite number"),
    ],
)
def test_bad_input_raises_value_error(x, y, kwargs, message):
    with pytest.raises(ValueError, match=message):
        clip_loss(x, y, 1.0, **kwargs)


def test_log_scale_must_be_a_scalar():
    x, y = _pair(4, 3)
    with pytest.raises(ValueError, match=r"log_scale must be a scalar; got shape \(1,\)"):
        clip_loss(x, y, jnp.zeros((1,)))
