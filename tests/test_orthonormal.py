"""The orthonormal case on every loss path: a tiny loss keeps its relative precision in float32.

N = 8 pairs with ``x_i = y_i = e_i`` and scale ``1 / 0.07``: every cosine is exactly 0 or 1 (each
product and sum is exact, and ``k e_i / k = e_i`` exactly), so each row's loss is
``log(1 + 7 e^{-s})`` = 4.374115090e-6 at ``s = 1 / 0.07``, formed by a cancellation-free
evaluation or lost entirely (``lse - z_pos`` returns 0 in float32). Every path must return it to
float32's bound (tests/float32_bounds.py, with the cosines exact: only the scale's rounding and
the evaluation remain) and to 1e-5 relative of the value at ``s = 1 / 0.07`` exactly. The
gradients of the dense, dense_vjp, tiled and sharded losses are held to the same bounds.
"""

import jax
import jax.numpy as jnp
import mpmath
import numpy as np
import pytest

import float32_bounds as fb
from contrastive_jax.losses import clip_loss, info_nce, moco_infonce, nt_xent
from contrastive_jax.losses.sharded import STRATEGIES, sharded_clip_loss, sharded_nt_xent
from contrastive_jax.losses.siglip import siglip_loss
from contrastive_jax.mesh import make_mesh

mpmath.mp.dps = 40
N = 8
TAU = 0.07
EXPECTED = 4.374115090e-6  # log(1 + 7 e^{-1/0.07}), the stated value
ROWS = np.eye(N, dtype=np.float32) * np.arange(1, N + 1, dtype=np.float32)[:, None]  # k e_k
LOG_SCALE = np.float32(np.log(1.0 / TAU))


def _exact(negatives: int, scale: float) -> float:
    """``log(1 + K e^{-s})`` in 40 digits."""
    return float(mpmath.log1p(negatives * mpmath.exp(-mpmath.mpf(scale))))


def test_the_stated_value():
    assert abs(_exact(7, 1.0 / TAU) - EXPECTED) <= 1e-9 * EXPECTED


def _check(got, negatives, scale, scale_roundings, what):
    """Within the float32 bound of the exact loss at ``scale``, and 1e-5 of the stated value
    (of its analogue with ``negatives`` negatives)."""
    exact = _exact(negatives, scale)
    part = fb.dense_info_nce(np.where(np.eye(negatives + 1, dtype=bool), scale, 0.0),
                             np.arange(negatives + 1), 1.0 / (negatives + 1))
    bound = fb.loss_bound(part, fb.logit_error(scale, scale, None,
                                               scale_roundings=scale_roundings))
    fb.assert_within(got, exact, bound, what)
    stated = _exact(negatives, 1.0 / TAU)
    assert abs(float(got) - stated) <= 1e-5 * stated, (what, float(got), stated)


@pytest.mark.parametrize("impl", ["tiled", "dense_vjp", "autodiff"])
@pytest.mark.parametrize("direction", ["both", "x_to_y", "y_to_x"])
def test_clip_loss(impl, direction):
    scale, roundings = fb.scale_of("clip", LOG_SCALE)
    got = clip_loss(ROWS, ROWS, LOG_SCALE, impl=impl, direction=direction)
    _check(got, N - 1, scale, roundings, f"clip {impl} {direction}")


def _x64_grads(fn, *args):
    with jax.enable_x64(True):
        return jax.jit(jax.value_and_grad(fn, argnums=(0, 1, 2)))(
            *(jnp.asarray(a, jnp.float64) for a in args))


# jitted: eagerly, the tiled loops are an op-by-op walk
_clip_grads = jax.jit(jax.value_and_grad(clip_loss, argnums=(0, 1, 2)), static_argnames="impl")
_nt_xent_grads = jax.jit(jax.value_and_grad(nt_xent, argnums=(0, 1, 2)), static_argnames="impl")


@pytest.mark.parametrize("impl", ["tiled", "dense_vjp"])
def test_clip_gradients(impl):
    b = fb.bounds_for("clip", ROWS, ROWS, LOG_SCALE)
    _, want = _x64_grads(lambda x, y, t: clip_loss(x, y, t, impl="autodiff"), ROWS, ROWS,
                         b.third)
    _, got = _clip_grads(ROWS, ROWS, LOG_SCALE, impl=impl)
    fb.assert_rows_within(got[0], want[0], b.rows_x, "grad_x")
    fb.assert_rows_within(got[1], want[1], b.rows_y, "grad_y")
    fb.assert_within(got[2], want[2], b.third_grad, "grad_log_scale")
    # Relative precision of the tiny gradients too: 1 - p_pos = 7 e^-s / (1 + 7 e^-s).
    assert abs(float(got[2]) - float(want[2])) <= 1e-5 * abs(float(want[2]))


@pytest.mark.parametrize("impl", ["tiled", "dense_vjp", "autodiff"])
def test_nt_xent(impl):
    # Views z1 = z2 = e_i: each anchor's partner has cosine 1, its 2N - 2 negatives 0.
    scale, roundings = fb.scale_of("nt_xent", TAU)
    got = nt_xent(ROWS, ROWS, TAU, impl=impl)
    _check(got, 2 * N - 2, scale, roundings, f"nt_xent {impl}")


@pytest.mark.parametrize("impl", ["tiled", "dense_vjp"])
def test_nt_xent_gradients(impl):
    b = fb.bounds_for("nt_xent", ROWS, ROWS, np.float32(TAU))
    _, want = _x64_grads(lambda x, y, t: nt_xent(x, y, t, impl="autodiff"), ROWS, ROWS, b.third)
    _, got = _nt_xent_grads(ROWS, ROWS, np.float32(TAU), impl=impl)
    fb.assert_rows_within(got[0], want[0], b.rows_x, "grad_z1")
    fb.assert_rows_within(got[1], want[1], b.rows_y, "grad_z2")
    fb.assert_within(got[2], want[2], b.third_grad, "grad_tau")
    assert abs(float(got[2]) - float(want[2])) <= 1e-5 * abs(float(want[2]))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_sharded(strategy):
    mesh = make_mesh({"data": 8}, jax.devices()[:8])  # 2 and 4 devices: test_engine.py
    clip = lambda x, y, t: sharded_clip_loss(x, y, t, mesh=mesh, strategy=strategy,  # noqa: E731
                                             block_size=2)

    exact = strategy != "all_gather_no_grad"  # its gradient is another one, not checked here

    @jax.jit
    def every(x, y, log_scale, tau):  # both losses and the clip gradients: one program
        return (clip(x, y, log_scale), sharded_nt_xent(x, y, tau, mesh=mesh, strategy=strategy,
                                                       block_size=2),
                jax.value_and_grad(clip, argnums=(0, 1, 2))(x, y, log_scale) if exact else
                (None, None))

    clip_value, nt_xent_value, (_, got_grads) = every(ROWS, ROWS, LOG_SCALE, np.float32(TAU))
    scale, roundings = fb.scale_of("clip", LOG_SCALE)
    _check(clip_value, N - 1, scale, roundings, f"sharded clip {strategy}")
    scale, roundings = fb.scale_of("nt_xent", TAU)
    _check(nt_xent_value, 2 * N - 2, scale, roundings, f"sharded nt_xent {strategy}")
    if exact:  # the exact gradients, on the mesh
        b = fb.bounds_for("clip", ROWS, ROWS, LOG_SCALE)
        _, want = _x64_grads(lambda x, y, t: clip_loss(x, y, t, impl="autodiff"), ROWS, ROWS,
                             b.third)
        fb.assert_rows_within(got_grads[0], want[0], b.rows_x, "grad_x")
        fb.assert_within(got_grads[2], want[2], b.third_grad, "grad_log_scale")


def test_info_nce():
    scale = np.float32(1.0 / TAU)
    logits = np.eye(N, dtype=np.float32) * scale  # given exactly: no rounding of the scale
    _check(info_nce(logits, jnp.arange(N)), N - 1, float(scale), 0.0, "info_nce")


def test_moco():
    # Queries and keys e_0..e_7 in 16 dimensions, the queue e_8..e_14: 7 orthogonal negatives.
    q = np.eye(N, 2 * N, dtype=np.float32)
    queue = np.eye(2 * N, dtype=np.float32)[N:2 * N - 1]
    scale, roundings = fb.scale_of("moco", TAU)
    _check(moco_infonce(q, q, queue, TAU), N - 1, scale, roundings, "moco")


def test_siglip():
    # (1/N) [N softplus(-(s + b)) + N (N - 1) softplus(b)] at SigLIP's initial bias -10.
    bias = -10.0
    scale, roundings = fb.scale_of("clip", LOG_SCALE)
    exact, bound = fb.siglip_bound(ROWS, ROWS, scale, bias,
                                   fb.logit_error(scale, scale, None, scale_roundings=roundings))
    s = mpmath.mpf(scale)
    check = mpmath.log1p(mpmath.exp(-(s + bias))) + (N - 1) * mpmath.log1p(mpmath.exp(bias))
    assert abs(float(check) - exact) <= 1e-12 * exact
    got = siglip_loss(ROWS, ROWS, LOG_SCALE, np.float32(bias))
    fb.assert_within(got, exact, bound, "siglip")
    s = mpmath.mpf(1.0 / TAU)
    stated = float(mpmath.log1p(mpmath.exp(-(s + bias))) + (N - 1) * mpmath.log1p(
        mpmath.exp(bias)))
    assert abs(float(got) - stated) <= 1e-5 * stated
