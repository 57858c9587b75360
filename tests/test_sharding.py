"""Sharded losses equal the single-device loss on the concatenated batch (002 A.12.2)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contrastive_jax.communication import (
    collective_bytes,
    expected_bytes,
    ring_memory_bound,
)
from contrastive_jax.losses import clip_loss, nt_xent
from contrastive_jax.sharding import (
    STRATEGIES,
    check_divisible,
    make_mesh,
    sharded_clip_loss,
    sharded_nt_xent,
)

EXACT = ("all_gather", "ring")
N, D_IN, D = 24, 6, 8  # 24 rows: 12, 6 and 3 per device on 2, 4 and 8 devices


def _rel(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def _mesh(devices):
    return make_mesh({"data": devices}, jax.devices()[:devices])


def _batch(seed=0):
    k = jax.random.split(jax.random.key(seed), 4)
    inputs = jax.random.normal(k[0], (N, D_IN))
    views = inputs + 0.3 * jax.random.normal(k[1], (N, D_IN))
    w = jax.random.normal(k[2], (D_IN, D)) / np.sqrt(D_IN)
    return inputs.at[5].set(0.0), views, w  # a zero row: its embedding has norm 0


def _train_step_grads(loss_fn):
    """Loss and gradients w.r.t. replicated parameters (encoder, temperature) and embeddings."""
    def objective(w, third, a, b):
        return loss_fn(a @ w, b @ w, third)

    return jax.jit(jax.value_and_grad(objective, argnums=(0, 1, 2, 3)))


def _assert_close(got, want, tol=1e-5):
    (lg, gg), (lw, gw) = got, want
    assert _rel(lg, lw) <= tol, (float(lg), float(lw))
    for a, b in zip(gg, gw, strict=True):
        assert _rel(a, b) <= tol, _rel(a, b)


@pytest.mark.parametrize("devices", [2, 4, 8])
@pytest.mark.parametrize("strategy", EXACT)
def test_clip_equals_single_device(devices, strategy):
    inputs, views, w = _batch()
    mesh = _mesh(devices)
    third = jnp.log(20.0)
    want = _train_step_grads(lambda a, b, t: clip_loss(a, b, t, impl="autodiff"))(
        w, third, inputs, views)
    got = _train_step_grads(lambda a, b, t: sharded_clip_loss(
        a, b, t, mesh=mesh, strategy=strategy, block_size=4))(w, third, inputs, views)
    _assert_close(got, want)


@pytest.mark.parametrize("strategy", EXACT)
@pytest.mark.parametrize("direction", ["x_to_y", "y_to_x"])
def test_clip_one_direction_and_clip_active(strategy, direction):
    inputs, views, w = _batch(1)
    mesh = _mesh(4)
    third = jnp.log(150.0)  # above log(100): the scale is clipped and its gradient is 0
    want = _train_step_grads(lambda a, b, t: clip_loss(a, b, t, direction=direction,
                                                       impl="autodiff"))(w, third, inputs, views)
    got = _train_step_grads(lambda a, b, t: sharded_clip_loss(
        a, b, t, mesh=mesh, strategy=strategy, direction=direction, block_size=5))(
        w, third, inputs, views)
    _assert_close(got, want)
    assert float(got[1][1]) == 0.0


@pytest.mark.parametrize("devices", [2, 4, 8])
@pytest.mark.parametrize("strategy", EXACT)
def test_nt_xent_equals_single_device(devices, strategy):
    inputs, views, w = _batch(2)
    mesh = _mesh(devices)
    want = _train_step_grads(lambda a, b, t: nt_xent(a, b, t, impl="autodiff"))(
        w, 0.2, inputs, views)
    got = _train_step_grads(lambda a, b, t: sharded_nt_xent(
        a, b, t, mesh=mesh, strategy=strategy, block_size=4))(w, 0.2, inputs, views)
    _assert_close(got, want)


def _clip_terms(x, y, log_scale, rows):
    """Dense CLIP (both directions, / N) restricted to the anchors ``rows`` in each direction."""
    xh = x / jnp.linalg.norm(x, axis=1, keepdims=True)
    yh = y / jnp.linalg.norm(y, axis=1, keepdims=True)
    s = jnp.exp(log_scale) * xh @ yh.T
    row = jax.nn.logsumexp(s, axis=1) - jnp.diag(s)
    col = jax.nn.logsumexp(s, axis=0) - jnp.diag(s)
    return 0.5 * (row[rows].sum() + col[rows].sum()) / x.shape[0]


def test_no_grad_drops_exactly_the_remote_anchor_terms():
    # L = sum_k L_k, L_k = device k's anchors' terms. all_gather_no_grad gives device k the
    # gradient d L_k / d rows_k; the exact gradient is sum_m d L_m / d rows_k.
    devices = 4
    n = N // devices
    with jax.enable_x64(True):
        x = jax.random.normal(jax.random.key(3), (N, D), jnp.float64)
        y = x + 0.5 * jax.random.normal(jax.random.key(4), (N, D), jnp.float64)
        third = jnp.asarray(np.log(10.0))
        mesh = _mesh(devices)
        f = jax.jit(jax.value_and_grad(lambda a, b, t: sharded_clip_loss(
            a, b, t, mesh=mesh, strategy="all_gather_no_grad", block_size=4), argnums=(0, 1, 2)))
        loss, (gx, gy, gt) = f(x, y, third)
        exact_loss, (ex, ey, et) = jax.value_and_grad(
            lambda a, b, t: clip_loss(a, b, t, impl="autodiff"), argnums=(0, 1, 2))(x, y, third)
        assert abs(float(loss) - float(exact_loss)) < 1e-12  # the same objective value
        assert abs(float(gt) - float(et)) < 1e-12  # the scale is local to every term
        want_x, want_y = np.zeros((N, D)), np.zeros((N, D))
        for k in range(devices):
            rows = np.arange(k * n, (k + 1) * n)
            dx, dy = jax.grad(_clip_terms, argnums=(0, 1))(x, y, third, rows)
            want_x[rows], want_y[rows] = dx[rows], dy[rows]
        np.testing.assert_allclose(gx, want_x, rtol=0, atol=1e-12)
        np.testing.assert_allclose(gy, want_y, rtol=0, atol=1e-12)
        # What it drops is not small: the remote anchors' share of each row's gradient.
        assert _rel(gx, ex) > 0.1 and _rel(gy, ey) > 0.1


def test_float64_sharded_equals_dense_to_round_off():
    with jax.enable_x64(True):
        x = jax.random.normal(jax.random.key(5), (N, D), jnp.float64)
        y = jax.random.normal(jax.random.key(6), (N, D), jnp.float64)
        mesh = _mesh(8)
        cases = [  # (sharded, dense, third)
            (sharded_nt_xent, lambda a, b: nt_xent(a, b, 0.1, impl="autodiff"), 0.1),
            (sharded_clip_loss, lambda a, b: clip_loss(a, b, 3.0, impl="autodiff"), 3.0),
        ]
        for sharded, dense, third in cases:
            want = jax.value_and_grad(dense, argnums=(0, 1))(x, y)
            for strategy in EXACT:
                got = jax.jit(jax.value_and_grad(lambda a, b, f=sharded, s=strategy, t=third: f(
                    a, b, t, mesh=mesh, strategy=s, block_size=2), argnums=(0, 1)))(x, y)
                _assert_close(got, want, tol=1e-12)


def test_indivisible_batch_names_both_numbers():
    mesh = _mesh(4)
    x = jnp.ones((10, D))
    with pytest.raises(ValueError, match=r"10.*4"):
        sharded_clip_loss(x, x, 0.0, mesh=mesh)
    with pytest.raises(ValueError, match=r"10.*4"):
        sharded_nt_xent(x, x, 0.1, mesh=mesh)
    with pytest.raises(ValueError, match=r"12.*8 processes"):
        check_divisible(12, 8, "processes")


def test_bad_strategy_and_mesh():
    mesh = _mesh(2)
    x = jnp.ones((4, D))
    with pytest.raises(ValueError, match="strategy"):
        sharded_clip_loss(x, x, 0.0, mesh=mesh, strategy="gather")
    with pytest.raises(ValueError, match="'model'"):
        sharded_clip_loss(x, x, 0.0, mesh=mesh, axis="model")
    with pytest.raises(ValueError, match="divide"):
        make_mesh({"data": 3})
    assert make_mesh({"data": -1, "model": 2}).shape == {"data": 4, "model": 2}
    assert set(STRATEGIES) == {"all_gather", "all_gather_no_grad", "ring"}


def _compiled(loss, strategy, devices, rows, d, block=64):
    """The compiled train-step gradient (embeddings and temperature) of a sharded loss."""
    mesh = _mesh(devices)
    spec = jax.ShapeDtypeStruct((rows, d), jnp.float32)
    sharded = sharded_clip_loss if loss == "clip" else sharded_nt_xent
    third = jnp.float32(0.0 if loss == "clip" else 0.1)
    f = jax.grad(lambda a, b, t: sharded(a, b, t, mesh=mesh, strategy=strategy,
                                         block_size=block), argnums=(0, 1, 2))
    return jax.jit(f).lower(spec, spec, third).compile()


@pytest.mark.parametrize("loss", ["clip", "nt_xent"])
def test_communication_formula_matches_the_compiled_collectives(loss):
    devices, rows, d = 4, 64, 16
    texts = {s: _compiled(loss, s, devices, rows, d).as_text() for s in STRATEGIES}
    assert "all-gather" not in texts["ring"] and "reduce-scatter" not in texts["ring"]
    assert "collective-permute" in texts["ring"]
    assert "reduce-scatter" in texts["all_gather"]
    assert "reduce-scatter" not in texts["all_gather_no_grad"]
    for strategy, text in texts.items():
        assert collective_bytes(text, devices) == expected_bytes(loss, strategy, rows, devices, d)


@pytest.mark.parametrize("loss", ["clip", "nt_xent"])
def test_ring_memory_is_per_device_share_not_global(loss):
    # Per device, in floats: the ring's scratch holds a few copies of the device's share of the
    # rows and of the chunk in flight (RING_MEMORY in contrastive_jax.communication), whatever
    # N; the gather's holds all N rows of every gathered input: O(N d).
    devices, d, block = 4, 64, 32
    for rows in (512, 2048):
        ring = _compiled(loss, "ring", devices, rows, d, block).memory_analysis()
        bound = ring_memory_bound(loss, rows, devices, d, block)
        assert ring.temp_size_in_bytes <= bound
    gather = _compiled(loss, "all_gather", devices, rows, d, block).memory_analysis()
    assert gather.temp_size_in_bytes / 4 >= 2 * rows * d  # CLIP: x and y; NT-Xent: 2 views
