"""clip_loss against the step-by-step algorithm of docs/derivations.md §8.1, its edge cases, and
its hand-written (dense_vjp) backward."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import float32_bounds as fb
import reference_losses as ref
from contrastive_jax.losses import clip_loss, info_nce, logit_scale


def _pair(n, d, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)).astype(dtype), rng.normal(size=(n, d)).astype(dtype)


def _rel(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def _exact_and_bound(x, y, log_scale, direction="both", max_scale=100.0):
    """The scale the float32 loss at this float32 ``log_scale`` stands for, and the float32
    bound on the loss (tests/float32_bounds.py)."""
    b = fb.bounds_for("clip", x, y, log_scale, direction, max_scale=max_scale)
    return b.scale, b.loss


IMPLS = ("tiled", "dense_vjp", "autodiff")


@jax.jit
def _every_impl(x, y, log_scale):
    """The loss of every impl: one program per shape (a new scale reuses it)."""
    return {impl: clip_loss(x, y, log_scale, impl=impl,
                            **({"block_size": 64} if impl == "tiled" else {}))
            for impl in IMPLS}


@pytest.mark.parametrize("n, d", list(itertools.product([2, 3, 17, 129], [1, 8, 64])))
def test_matches_reference_in_float32(n, d):
    x, y = _pair(n, d, seed=n + d)
    for scale in (1.0, 14.3, 100.0):
        log_scale = np.float32(np.log(scale))
        s, bound = _exact_and_bound(x, y, log_scale)
        expected = ref.clip_loss(x, y, s)
        for impl, loss in _every_impl(x, y, log_scale).items():
            fb.assert_within(loss, expected, bound, f"{impl}, scale {scale}")


def test_batch_of_one_is_rejected():
    x, y = _pair(1, 8)
    with pytest.raises(ValueError, match="batch size 1"):
        clip_loss(x, y, 0.0)


def test_directions_are_the_two_info_nce_and_their_mean():
    x, y = _pair(9, 5, seed=1)
    ls = np.float32(np.log(20.0))
    s, _ = _exact_and_bound(x, y, ls)
    z = np.float32(s) * (x / np.linalg.norm(x, axis=1, keepdims=True)) @ (
        y / np.linalg.norm(y, axis=1, keepdims=True)).T  # float32 logits, rounded like the loss's
    for direction, logits in (("x_to_y", z), ("y_to_x", z.T)):
        # Each side, and info_nce on those logits, against the exact loss within its bound.
        exact = sum(p.loss for p in fb.clip_dense(x, y, s, direction))
        _, bound = _exact_and_bound(x, y, ls, direction)
        fb.assert_within(clip_loss(x, y, ls, direction=direction), exact, bound, direction)
        fb.assert_within(info_nce(logits, jnp.arange(9)), exact, bound, f"info_nce {direction}")
        fb.assert_within(ref.info_nce(logits, np.arange(9)), exact, bound, "reference")
    both = sum(p.loss for p in fb.clip_dense(x, y, s, "both"))
    assert abs(both - 0.5 * sum(sum(p.loss for p in fb.clip_dense(x, y, s, d))
                                for d in ("x_to_y", "y_to_x"))) <= 1e-12 * both
    fb.assert_within(clip_loss(x, y, ls), both, _exact_and_bound(x, y, ls)[1], "both")
    # Swapping the inputs swaps the directions.
    fb.assert_within(clip_loss(y, x, ls, direction="x_to_y"),
                     sum(p.loss for p in fb.clip_dense(x, y, s, "y_to_x")),
                     _exact_and_bound(x, y, ls, "y_to_x")[1], "swapped")


def test_scale_is_clipped_at_max_scale_with_zero_log_scale_gradient():
    x, y = _pair(6, 4, seed=2)
    # Above the cap the scale is the constant 100 (exactly).
    s, bound = _exact_and_bound(x, y, np.float32(np.log(1000.0)))
    assert s == 100.0
    fb.assert_within(clip_loss(x, y, jnp.log(1000.0)), ref.clip_loss(x, y, 100.0), bound)
    assert float(jax.grad(clip_loss, argnums=2)(x, y, jnp.log(1000.0))) == 0.0
    assert float(jax.grad(clip_loss, argnums=2)(x, y, 1e4)) == 0.0  # no inf * 0 = NaN
    assert float(jax.grad(clip_loss, argnums=2)(x, y, jnp.log(50.0))) != 0.0
    ls500 = np.float32(np.log(500.0))
    s500, bound = _exact_and_bound(x, y, ls500, max_scale=500.0)
    fb.assert_within(clip_loss(x, y, ls500, max_scale=500.0), ref.clip_loss(x, y, s500), bound)
    # exp of the float32 log: |log 30| u from rounding the argument, C_FN u from exp itself.
    np.testing.assert_allclose(logit_scale(jnp.log(30.0)), 30.0,
                               rtol=(np.log(30.0) + fb.C_FN) * fb.U)


@jax.jit
def _value_and_grads_at_scale_100(x, y):
    """Both impls' value and gradients at log_scale log(100): one program per dtype, shared by
    every case."""
    return {impl: jax.value_and_grad(clip_loss, argnums=(0, 1, 2))(x, y, jnp.log(100.0),
                                                                    impl=impl)
            for impl in ("autodiff", "dense_vjp")}


@pytest.mark.parametrize("impl", ["autodiff", "dense_vjp"])
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
    loss, grads = _value_and_grads_at_scale_100(x, x)[impl]
    assert jnp.isfinite(loss)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)
    assert grads[0].dtype == dtype
    if case in ("identical", "all_zero"):  # every logit equal: chance level, log n exactly
        x64 = np.asarray(x, np.float64)
        fb.assert_within(loss, np.log(n), _exact_and_bound(x64, x64, np.log(100.0))[1], case)


def test_bfloat16_inputs_compute_in_float32():
    x, y = _pair(12, 16, seed=6)
    xb, yb = jnp.asarray(x, jnp.bfloat16), jnp.asarray(y, jnp.bfloat16)
    loss = clip_loss(xb, yb, jnp.log(100.0))
    assert loss.dtype == jnp.float32
    # The bfloat16 rows, upcast exactly, are the float32 problem: the same bound holds.
    x32, y32 = np.asarray(xb, np.float32), np.asarray(yb, np.float32)
    s, bound = _exact_and_bound(x32, y32, jnp.log(100.0))
    fb.assert_within(loss, ref.clip_loss(x32, y32, s), bound)


@functools.partial(jax.jit, static_argnames="direction")
def _both_impls(x, y, log_scale, direction):
    """Value and gradients of impl="autodiff" and impl="dense_vjp": one program per direction
    and dtype (a new scale reuses it)."""
    return {impl: jax.value_and_grad(clip_loss, argnums=(0, 1, 2))(x, y, log_scale,
                                                                    direction=direction,
                                                                    impl=impl)
            for impl in ("autodiff", "dense_vjp")}


@pytest.mark.parametrize("direction", ["both", "x_to_y", "y_to_x"])
@pytest.mark.parametrize("log_scale", [np.log(14.3), np.log(100.0), np.log(250.0)])
def test_dense_vjp_backward_equals_autodiff(direction, log_scale):
    x, y = _pair(37, 24, seed=7)
    x[5] = 0.0  # the zero-norm branch of the normalisation
    f = _both_impls
    with jax.enable_x64(True):  # float64: the two backward passes agree to round-off
        x64, y64, ls64 = jnp.asarray(x, jnp.float64), jnp.asarray(y, jnp.float64), jnp.float64(
            log_scale)
        both = f(x64, y64, ls64, direction=direction)
        (la, ga), (lb, gb) = both["autodiff"], both["dense_vjp"]
        np.testing.assert_allclose(lb, la, rtol=1e-12)
        for a, b in zip(ga, gb, strict=True):
            assert _rel(b, a) <= 1e-12 if np.any(np.asarray(a)) else np.all(np.asarray(b) == 0)
    # float32: each impl against the float64 result, within the derived bounds.
    ls32 = np.float32(log_scale)
    b = fb.bounds_for("clip", x, y, ls32, direction)
    with jax.enable_x64(True):
        want_loss, want = f(x64, y64, jnp.float64(b.third), direction=direction)["autodiff"]
    for impl, (loss, grads) in f(x, y, ls32, direction=direction).items():
        fb.assert_within(loss, want_loss, b.loss, impl)
        fb.assert_rows_within(grads[0], want[0], b.rows_x, f"{impl} grad_x")
        fb.assert_rows_within(grads[1], want[1], b.rows_y, f"{impl} grad_y")
        if b.scale == 100.0:  # clipped: exactly 0
            assert float(grads[2]) == 0.0
        else:
            fb.assert_within(grads[2], want[2], b.third_grad, f"{impl} grad_log_scale")


def test_dense_vjp_backward_returns_input_dtypes():
    x, y = _pair(8, 4)
    grads = jax.grad(clip_loss, argnums=(0, 1, 2))(
        jnp.asarray(x, jnp.bfloat16), jnp.asarray(y), jnp.float32(2.0), impl="dense_vjp")
    assert [g.dtype for g in grads] == [jnp.bfloat16, jnp.float32, jnp.float32]


def test_analytic_is_a_deprecated_alias_of_dense_vjp():
    x, y = _pair(9, 5, seed=3)
    grad = jax.value_and_grad(clip_loss, argnums=(0, 1, 2))
    want_loss, want = grad(x, y, jnp.float32(2.5), impl="dense_vjp", direction="x_to_y")
    with pytest.warns(DeprecationWarning, match=r"impl='analytic' is deprecated.*'dense_vjp'"):
        loss, grads = grad(x, y, jnp.float32(2.5), impl="analytic", direction="x_to_y")
    assert float(loss) == float(want_loss) and float(loss) > 0
    for g, w in zip(grads, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


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
         "max_scale must be a positive number or inf"),
    ],
)
def test_bad_input_raises_value_error(x, y, kwargs, message):
    with pytest.raises(ValueError, match=message):
        clip_loss(x, y, 1.0, **kwargs)


def test_log_scale_must_be_a_scalar():
    x, y = _pair(4, 3)
    with pytest.raises(ValueError, match=r"log_scale must be a scalar; got shape \(1,\)"):
        clip_loss(x, y, jnp.zeros((1,)))
