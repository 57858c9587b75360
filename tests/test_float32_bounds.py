"""The float32 bounds of ``float32_bounds.py``: sound on the tests' data, and strict enough.

Sound: step 1 of the derivation (the cosine bound) holds on random rows of every length the
tests use. Strict: every deliberately wrong loss below lands outside the bound at the points
the loss tests check, so a test using the bound can fail.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import float32_bounds as fb
from contrastive_jax.losses import l2_normalize
from contrastive_jax.losses.parts.similarity import similarities


@pytest.mark.parametrize("dim", [1, 2, 8, 12, 24, 64, 512])
def test_cosine_bound_holds(dim):
    rng = np.random.default_rng(dim)
    x = rng.normal(size=(128, dim)).astype(np.float32)
    y = rng.normal(size=(128, dim)).astype(np.float32)
    got = np.asarray(similarities(l2_normalize(jnp.asarray(x)), l2_normalize(jnp.asarray(y))))
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    exact = (x64 / np.linalg.norm(x64, axis=1, keepdims=True)) @ (
        y64 / np.linalg.norm(y64, axis=1, keepdims=True)).T
    assert np.max(np.abs(got - exact)) <= fb.cosine_error(dim)


def _clip_loss64(x_hat, y_hat, scale, drop_hardest=False, keep_positive=False):
    """Float64 CLIP with optional bugs: each row's (column's) hardest negative dropped; the
    positive also counted as a negative."""
    z = scale * x_hat @ y_hat.T
    n = z.shape[0]
    total = 0.0
    for logits in (z, z.T):
        neg = ~np.eye(n, dtype=bool)
        if drop_hardest:
            neg[np.arange(n), np.argmax(np.where(neg, logits, -np.inf), axis=1)] = False
        if keep_positive:
            neg |= np.eye(n, dtype=bool)
        terms = np.where(neg, np.exp(logits - np.diag(logits)[:, None]), 0.0)
        total += 0.5 * np.mean(np.logaddexp(0.0, np.log(np.sum(terms, axis=1))))
    return total


@pytest.mark.parametrize("n, d, scale", list(itertools.product(
    [3, 17, 64, 256], [8, 24, 64], [1.0, 14.3, 100.0])))
def test_wrong_losses_fail_the_bound(n, d, scale):
    # Paired rows (y = x + noise), as in the tiled and sharded tests: positives matter.
    rng = np.random.default_rng(n + d)
    x = rng.normal(size=(n, d))
    x, y = x.astype(np.float32), (x + 0.5 * rng.normal(size=(n, d))).astype(np.float32)
    parts = fb.clip_dense(x, y, scale)
    exact = sum(p.loss for p in parts)
    if exact < 1e3 * fb.TINY:  # below float32's normal range no relative precision is promised
        return
    bound = fb.loss_bound(parts, fb.logit_error(scale, max(p.max_logit for p in parts), d))
    x_hat, _ = fb._normalise(x)
    y_hat, _ = fb._normalise(y)
    assert abs(_clip_loss64(x_hat, y_hat, scale) - exact) <= 1e-12 * exact  # the harness
    wrong = {
        "hardest negative dropped": _clip_loss64(x_hat, y_hat, scale, drop_hardest=True),
        "positive among the negatives": _clip_loss64(x_hat, y_hat, scale, keep_positive=True),
        "scale off by 1e-3": _clip_loss64(x_hat, y_hat, scale * (1 + 1e-3)),
    }
    for what, value in wrong.items():
        assert abs(value - exact) > bound, (what, abs(value - exact), bound)
    # One float32 ulp of the scale moves each logit by less than float32's own rounding of
    # s * c (see float32_bounds), so only the float64 tests (tolerance 1e-12) can see it: they do.
    s32 = np.float32(scale)
    ulp = _clip_loss64(x_hat, y_hat, float(np.nextafter(s32, np.float32(np.inf))))
    assert abs(ulp - _clip_loss64(x_hat, y_hat, float(s32))) > 1e-12 * exact


def test_bound_is_a_small_multiple_of_the_rounding_of_one_logit():
    # Step 4's closing remark, on the data of the failing case of a fresh clone (N = 2, d = 8,
    # scale 100): the relative bound is ~2 Delta_z, a few hundred u at scale 100.
    rng = np.random.default_rng(10)
    x = rng.normal(size=(2, 8)).astype(np.float32)
    y = rng.normal(size=(2, 8)).astype(np.float32)
    parts = fb.clip_dense(x, y, 100.0)
    delta_z = fb.logit_error(100.0, max(p.max_logit for p in parts), 8)
    rel = fb.loss_bound(parts, delta_z) / sum(p.loss for p in parts)
    assert 1e-5 < rel < 3 * delta_z


def test_gradient_bounds_cover_float32_and_reject_a_wrong_scale():
    from contrastive_jax.losses import clip_loss

    rng = np.random.default_rng(3)
    x = rng.normal(size=(12, 16)).astype(np.float32)
    y = rng.normal(size=(12, 16)).astype(np.float32)
    log_scale = np.float32(np.log(30.0))
    b = fb.bounds_for("clip", x, y, log_scale)
    with jax.enable_x64(True):
        x64, y64 = jnp.asarray(x, jnp.float64), jnp.asarray(y, jnp.float64)
        want = jax.grad(clip_loss, argnums=(0, 1, 2))(x64, y64, jnp.float64(b.third),
                                                      impl="autodiff")
        wrong = jax.grad(clip_loss, argnums=(0, 1, 2))(
            x64, y64, jnp.float64(b.third + np.log1p(1e-3)), impl="autodiff")
    got = jax.grad(clip_loss, argnums=(0, 1, 2))(x, y, log_scale, impl="tiled")
    fb.assert_rows_within(got[0], want[0], b.rows_x, "grad_x")
    fb.assert_rows_within(got[1], want[1], b.rows_y, "grad_y")
    fb.assert_within(got[2], want[2], b.third_grad, "grad_log_scale")
    assert not fb.within(wrong[0], want[0], float(np.linalg.norm(b.rows_x)))
    assert not fb.within(wrong[1], want[1], float(np.linalg.norm(b.rows_y)))
    assert not fb.within(wrong[2], want[2], b.third_grad)
