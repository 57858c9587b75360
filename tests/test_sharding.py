"""Sharded losses equal the single-device loss on the concatenated batch (docs/derivations.md
§14)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import float32_bounds as fb
from contrastive_jax.losses import clip_loss, nt_xent
from contrastive_jax.losses.sharded import (
    STRATEGIES,
    sharded_clip_loss,
    sharded_nt_xent,
    sharded_siglip_loss,
)
from contrastive_jax.mesh import check_divisible, make_mesh
from traffic import collective_bytes, expected_bytes, ring_memory_bound

EXACT = ("all_gather", "ring")
N, D_IN, D = 24, 6, 8  # 24 rows: 12, 6 and 3 per device on 2, 4 and 8 devices


def _rel(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def _mesh(devices):
    return make_mesh({"data": devices}, jax.devices()[:devices])


@functools.cache
def _batch(seed=0):
    """Inputs, views and an encoder of small dyadic numbers: ``inputs @ w`` is exact in float32,
    so the embeddings the losses see are the float64 ones and the float32 bounds apply."""
    rng = np.random.default_rng(seed)
    inputs = rng.integers(-4, 5, size=(N, D_IN)).astype(np.float32)
    views = inputs + rng.integers(-1, 2, size=(N, D_IN)).astype(np.float32)
    w = rng.integers(-3, 4, size=(D_IN, D)).astype(np.float32) / 4
    inputs[5] = 0.0  # a zero row: its embedding has norm 0
    return jnp.asarray(inputs), jnp.asarray(views), jnp.asarray(w)


def _train_step_grads(loss_fn):
    """Loss and gradients w.r.t. replicated parameters (encoder, temperature) and inputs."""
    def objective(w, third, a, b):
        return loss_fn(a @ w, b @ w, third)

    return jax.jit(jax.value_and_grad(objective, argnums=(0, 1, 2, 3)))


@functools.cache
def _float64_reference(kind, seed, third, direction):
    """The float64 train step (loss; encoder, scale, input gradients) of the single-device
    ``kind`` loss on ``_batch(seed)`` at ``third`` (its float32 value, as in the bounds), and the
    embedding gradients: one program."""
    inputs, views, w = (np.asarray(v, np.float64) for v in _batch(seed))
    x, y = inputs @ w, views @ w
    dense = _dense(kind, direction)
    with jax.enable_x64(True):
        def both(w, t, a, b, x, y):
            return (jax.value_and_grad(lambda w, t, a, b: dense(a @ w, b @ w, t),
                                       argnums=(0, 1, 2, 3))(w, t, a, b),
                    jax.grad(lambda a, c: dense(a, c, t), argnums=(0, 1))(x, y))
        (want_loss, grads), (gx, gy) = jax.jit(both)(
            jnp.asarray(w), jnp.float64(third), jnp.asarray(inputs), jnp.asarray(views),
            jnp.asarray(x), jnp.asarray(y))
        return want_loss, grads, gx, gy


def _dense(kind, direction="both"):
    if kind == "clip":
        return lambda a, b, t: clip_loss(a, b, t, direction=direction, impl="autodiff")
    return lambda a, b, t: nt_xent(a, b, t, impl="autodiff")


def _assert_float32(kind, got, third, seed, direction="both"):
    """``got`` (a float32 train-step result on ``_batch(seed)``) within the float32 bounds of
    the single-device loss evaluated in float64 on the same batch."""
    batch = _batch(seed)
    inputs, views, w = (np.asarray(v, np.float64) for v in batch)
    x, y = inputs @ w, views @ w
    assert np.array_equal(np.asarray(batch[0] @ batch[2], np.float64), x)  # exact in float32
    b = fb.bounds_for(kind, x, y, third, direction)
    want_loss, (gw, gt, ga, gb), gx, gy = _float64_reference(kind, seed, float(b.third),
                                                             direction)
    bw, ba, bb = fb.encoder_grad_bounds(inputs, views, w, gx, gy, b.rows_x, b.rows_y)
    loss, (w_grad, t_grad, a_grad, b_grad) = got
    fb.assert_within(loss, want_loss, b.loss, "loss")
    fb.assert_within(w_grad, gw, bw, "encoder gradient")
    fb.assert_within(a_grad, ga, ba, "first input gradient")
    fb.assert_within(b_grad, gb, bb, "second input gradient")
    if kind == "clip" and b.scale == 100.0:
        assert float(t_grad) == 0.0  # clipped
    else:
        fb.assert_within(t_grad, gt, b.third_grad, "scale gradient")


def _train_steps(losses, third, batch):
    """The float32 train step (``_train_step_grads``) of every loss: one program."""
    steps = [_train_step_grads(loss) for loss in losses]
    return jax.jit(lambda w, t, a, b: [f(w, t, a, b) for f in steps])(batch[2], third, *batch[:2])


def _assert_close(got, want, tol=1e-5):
    (lg, gg), (lw, gw) = got, want
    assert _rel(lg, lw) <= tol, (float(lg), float(lw))
    for a, b in zip(gg, gw, strict=True):
        assert _rel(a, b) <= tol, _rel(a, b)


@pytest.mark.parametrize("devices", [2, 4, 8])
def test_clip_equals_single_device(devices):
    # The dense loss and both exact strategies: one program.
    batch = _batch()
    mesh = _mesh(devices)
    third = jnp.float32(np.log(20.0))
    losses = [_dense("clip")] + [
        lambda a, b, t, s=strategy: sharded_clip_loss(a, b, t, mesh=mesh, strategy=s,
                                                      block_size=4) for strategy in EXACT]
    for got in _train_steps(losses, third, batch):
        _assert_float32("clip", got, third, 0)


@pytest.mark.parametrize("direction", ["x_to_y", "y_to_x"])
def test_clip_one_direction_and_clip_active(direction):
    batch = _batch(1)
    mesh = _mesh(4)
    third = jnp.float32(np.log(150.0))  # above log(100): the scale is clipped, its gradient 0
    losses = [lambda a, b, t, s=strategy: sharded_clip_loss(
        a, b, t, mesh=mesh, strategy=s, direction=direction, block_size=5) for strategy in EXACT]
    for got in _train_steps(losses, third, batch):  # both exact strategies: one program
        _assert_float32("clip", got, third, 1, direction)
        assert float(got[1][1]) == 0.0


@pytest.mark.parametrize("devices", [2, 4, 8])
def test_nt_xent_equals_single_device(devices):
    # The dense loss and both exact strategies: one program.
    batch = _batch(2)
    mesh = _mesh(devices)
    third = jnp.float32(0.2)
    losses = [_dense("nt_xent")] + [
        lambda a, b, t, s=strategy: sharded_nt_xent(a, b, t, mesh=mesh, strategy=s,
                                                    block_size=4) for strategy in EXACT]
    for got in _train_steps(losses, third, batch):
        _assert_float32("nt_xent", got, third, 2)


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

        def every(x, y, third):  # the sharded, the exact and each device's terms: one program
            no_grad = jax.value_and_grad(lambda a, b, t: sharded_clip_loss(
                a, b, t, mesh=mesh, strategy="all_gather_no_grad", block_size=4),
                argnums=(0, 1, 2))(x, y, third)
            exact = jax.value_and_grad(lambda a, b, t: clip_loss(a, b, t, impl="autodiff"),
                                       argnums=(0, 1, 2))(x, y, third)
            terms = [jax.grad(_clip_terms, argnums=(0, 1))(x, y, third,
                                                           np.arange(k * n, (k + 1) * n))
                     for k in range(devices)]
            return no_grad, exact, terms

        (loss, (gx, gy, gt)), (exact_loss, (ex, ey, et)), terms = jax.jit(every)(x, y, third)
        assert abs(float(loss) - float(exact_loss)) < 1e-12  # the same objective value
        assert abs(float(gt) - float(et)) < 1e-12  # the scale is local to every term
        want_x, want_y = np.zeros((N, D)), np.zeros((N, D))
        for k, (dx, dy) in enumerate(terms):
            rows = np.arange(k * n, (k + 1) * n)
            want_x[rows], want_y[rows] = np.asarray(dx)[rows], np.asarray(dy)[rows]
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

        def every(x, y):  # each dense loss and both exact strategies of it: one program
            return [(jax.value_and_grad(dense, argnums=(0, 1))(x, y),
                     [jax.value_and_grad(lambda a, b, f=sharded, s=strategy, t=third: f(
                         a, b, t, mesh=mesh, strategy=s, block_size=2), argnums=(0, 1))(x, y)
                      for strategy in EXACT]) for sharded, dense, third in cases]

        for want, got_by_strategy in jax.jit(every)(x, y):
            for got in got_by_strategy:
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


@functools.cache
def _compiled(loss, strategy, devices, rows, d, block, direction="both"):
    """The compiled train-step value and gradient (embeddings and scale) of a sharded loss;
    cached: the traffic and memory tests share the programs of the same settings."""
    mesh = _mesh(devices)
    spec = jax.ShapeDtypeStruct((rows, d), jnp.float32)
    scalar = jax.ShapeDtypeStruct((), jnp.float32)
    if loss == "clip":
        def fn(a, b, t):
            return sharded_clip_loss(a, b, t, mesh=mesh, strategy=strategy, block_size=block,
                                     direction=direction)
    elif loss == "nt_xent":
        def fn(a, b, t):
            return sharded_nt_xent(a, b, t, mesh=mesh, strategy=strategy, block_size=block)
    else:
        def fn(a, b, t):
            return sharded_siglip_loss(a, b, t, -2.0, mesh=mesh, strategy=strategy,
                                       block_size=block)
    f = jax.value_and_grad(fn, argnums=(0, 1, 2))
    return jax.jit(f).lower(spec, spec, scalar).compile()


@pytest.mark.parametrize("loss, direction", [("clip", "both"), ("clip", "x_to_y"),
                                             ("clip", "y_to_x"), ("nt_xent", "both"),
                                             ("siglip", "both")])
def test_communication_formula_matches_the_compiled_collectives(loss, direction):
    devices, rows, d, block = 4, 2048, 64, 32  # the settings of the memory test below
    strategies = [s for s in STRATEGIES if not (loss == "siglip" and s == "all_gather_no_grad")]
    texts = {s: _compiled(loss, s, devices, rows, d, block, direction).as_text()
             for s in strategies}
    assert "all-gather" not in texts["ring"] and "reduce-scatter" not in texts["ring"]
    assert "collective-permute" in texts["ring"]
    assert "reduce-scatter" in texts["all_gather"]
    assert "reduce-scatter" not in texts.get("all_gather_no_grad", "")
    for strategy, text in texts.items():
        assert collective_bytes(text, devices) == expected_bytes(loss, strategy, rows, devices, d,
                                                                 direction), strategy


@pytest.mark.parametrize("loss", ["clip", "nt_xent", "siglip"])
def test_ring_memory_is_per_device_share_not_global(loss):
    # Per device, in floats: the ring's scratch holds a few copies of the device's share of the
    # rows and of the chunk in flight (ring_memory_bound in benchmarks/traffic.py),
    # whatever N; the gather's holds all N rows of every gathered input: O(N d).
    devices, d, block = 4, 64, 32
    for rows in (512, 2048):
        ring = _compiled(loss, "ring", devices, rows, d, block, "both").memory_analysis()
        bound = ring_memory_bound(loss, rows, devices, d, block)
        assert ring.temp_size_in_bytes <= bound
    gather = _compiled(loss, "all_gather", devices, rows, d, block, "both").memory_analysis()
    views = 2 if loss == "nt_xent" else 1
    assert gather.temp_size_in_bytes / 4 >= views * rows * d  # every gathered row


def test_an_eager_call_is_one_cached_program():
    """The global-array wrappers are jitted: calling one eagerly compiles one program per
    shapes and settings (a new temperature value reuses it), not an op-by-op walk of the
    tile loops."""
    from contrastive_jax.losses import sharded

    mesh = make_mesh({"data": 4}, jax.devices()[:4])
    x = jnp.eye(8)[::-1] * 3.0
    before = sharded._over_mesh._cache_size()
    first = sharded_clip_loss(x, x, 1.0, mesh=mesh, strategy="ring", block_size=3)
    second = sharded_clip_loss(x, x, 2.0, mesh=mesh, strategy="ring", block_size=3)
    assert sharded._over_mesh._cache_size() == before + 1
    assert float(second) < float(first)  # the scale did change: e^2 vs e^1 on orthogonal rows
    sharded_clip_loss(x, x, 1.0, mesh=mesh, strategy="ring", block_size=2)
    assert sharded._over_mesh._cache_size() == before + 2
