"""MoCo v3 (training/methods/moco_v3.py): the symmetric loss and its gradient against a slow
float64 reference, the momentum schedule, no gradient into the key encoder, the frozen patch
projection, and the train step on 1 and 8 devices, under FSDP and with K micro-batches equal in
float64 (docs/training.md, "MoCo v3", claims exactly this list)."""

import functools
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import reference_losses as ref
from contrastive_jax.errors import ConfigError
from contrastive_jax.mesh import make_mesh
from contrastive_jax.training.config import base_config
from contrastive_jax.training.methods import LossSettings, MethodContext, MoCoV3, method_for
from contrastive_jax.training.methods.moco_v3 import MoCoV3Settings, momentum_at
from contrastive_jax.training.models import ProjectionHead, architecture_block, build_model
from contrastive_jax.training.models.locked_towers import frozen_names
from contrastive_jax.training.parameter_paths import leaves_by_path
from contrastive_jax.training.step import train_step
from contrastive_jax.training.step.state_sharding import state_shardings
from contrastive_jax.training.step.train_state import create_state

TAU, B, STEPS = 0.2, 32, 10
VIT = {"name": "vit", "image_size": 8, "patch": 4, "in_channels": 1, "width": 16, "depth": 1,
       "heads": 2, "mlp_ratio": 2, "dropout": 0.1, "features": 16}


def ctr_reference(q, k, tau: float) -> float:
    """[MoCoV3] Algorithm 1's ``ctr``, row by row: ``2 tau (1/N) sum_i (lse_j s_ij - s_ii)``,
    ``s_ij = q_hat_i . k_hat_j / tau`` (docs/derivations.md §10.4)."""
    qn, kn = ref.normalize_rows(q), ref.normalize_rows(k)
    n = len(qn)
    total = 0.0
    for i in range(n):
        s = [float(np.dot(qn[i], kn[j])) / tau for j in range(n)]
        total += float(ref.logsumexp(s) - s[i])
    return 2 * tau * total / n


def loss_reference(q1, q2, k1, k2, tau: float) -> float:
    return ctr_reference(q1, k2, tau) + ctr_reference(q2, k1, tau)


def rows(n=8, d=4, seed=0):
    rng = np.random.default_rng(seed)
    q1, q2 = rng.normal(size=(2, n, d))
    return q1, q2, q2 + 0.5 * rng.normal(size=(n, d)), q1 + 0.5 * rng.normal(size=(n, d))


def context(devices=1, **loss) -> MethodContext:
    return MethodContext(loss=LossSettings(name="moco_v3", temperature=TAU, **loss),
                         mesh=make_mesh({"data": devices}, jax.devices()[:devices]),
                         input_key="image", text_key="caption", augment=None)


def objective(q1, q2, k1, k2, ctx):
    """``(loss, metrics)`` of the method's objective on these rows."""
    return MoCoV3(schedule_steps=10).objective(None, {"q1": q1, "q2": q2, "h1": q1, "h2": q2},
                                               {"k1": k1, "k2": k2}, {},
                                               {"momentum_step": jnp.int32(0)}, ctx)[:2]


def objective_loss(q1, q2, k1, k2, ctx):
    return objective(q1, q2, k1, k2, ctx)[0]


@pytest.mark.parametrize("devices,loss", [
    (1, {"impl": "tiled", "block_size": 3}), (1, {"impl": "dense_vjp"}),
    (1, {"impl": "autodiff"}), (8, {"strategy": "all_gather"}), (8, {"strategy": "ring"})])
def test_the_loss_equals_the_float64_reference(devices, loss):
    """``ctr(q1, k2) + ctr(q2, k1)`` (the method's objective) equals the row-by-row reference
    to 1e-12 for every impl and sharded strategy, and ``mi_bound`` is ``log N - L / (4 tau)``;
    pairing a query with its own view's key, the mistake the symmetry is about, is far from
    it."""
    q1, q2, k1, k2 = rows()
    with jax.enable_x64(True):
        got, metrics = objective(q1, q2, k1, k2, context(devices, **loss))
    want = loss_reference(q1, q2, k1, k2, TAU)
    np.testing.assert_allclose(float(got), want, rtol=1e-12)
    np.testing.assert_allclose(float(metrics["mi_bound"]), math.log(8) - want / (4 * TAU),
                               rtol=1e-12)
    assert abs(loss_reference(q1, q2, k2, k1, TAU) - want) > 0.1


def test_the_gradient_equals_finite_differences_of_the_reference():
    """jax.grad of the objective with respect to the queries equals central differences of the
    reference (float64, step 1e-6) to 1e-7 of the largest entry; the step stops the keys'
    gradient in ``targets`` (test below), not in the loss."""
    q1, q2, k1, k2 = rows(n=6, d=3, seed=1)
    with jax.enable_x64(True):
        g1, g2 = jax.grad(objective_loss, argnums=(0, 1))(q1, q2, k1, k2, context())
    h = 1e-6
    for got, which in ((g1, 0), (g2, 1)):
        want = np.zeros_like(q1)
        for idx in np.ndindex(q1.shape):
            args = [np.array(a) for a in (q1, q2)]
            args[which][idx] += h
            up = loss_reference(*args, k1, k2, TAU)
            args[which][idx] -= 2 * h
            want[idx] = (up - loss_reference(*args, k1, k2, TAU)) / (2 * h)
        assert np.abs(np.asarray(got) - want).max() <= 1e-7 * np.abs(want).max()


def test_the_momentum_schedule():
    """``m_t = 1 - (1 - m0) (cos(pi t / T) + 1) / 2``: m0 at 0, (1 + m0) / 2 at T / 2, 1 at T
    and after; ``"constant"`` stays at m0; an unknown schedule or no T says what to set."""
    with jax.enable_x64(True):
        values = [float(momentum_at(t, 100, 0.99)) for t in (0, 50, 100, 150)]
        np.testing.assert_allclose(values, [0.99, 0.995, 1.0, 1.0], rtol=0, atol=1e-15)
        np.testing.assert_allclose(float(momentum_at(25, 100, 0.99)),
                                   1 - 0.01 * (math.cos(math.pi / 4) + 1) / 2, atol=1e-15)
        assert float(momentum_at(70, 100, 0.9, "constant")) == 0.9
    with pytest.raises(ConfigError, match=r"unknown moco_v3.momentum_schedule 'linear'"):
        momentum_at(0, 100, 0.99, "linear")
    with pytest.raises(ConfigError, match=r"set config.total_steps or "
                                          r"config.moco_v3.schedule_steps"):
        momentum_at(0, 0, 0.99)


def make_config(batch_norm: bool = True, **loss) -> ml_collections.ConfigDict:
    """MoCo v3 on a tiny ViT (8x8 images, patches of 4, dropout) with its frozen patch
    projection, the 3-layer projector and 2-layer predictor with BatchNorm after every layer
    (``batch_norm=False``: none, for micro-batches, whose BatchNorm is per micro-batch by
    definition), image augmentations, SGD."""
    config = base_config()
    config.data = {"batch_size": B}
    config.input_key = "image"
    config.augment = {"kind": "image", "resized_crop": 0.4, "flip": 0.5, "noise": 0.05}
    norm = {"batch_norm": batch_norm, "out_batch_norm": batch_norm}
    config.model = {"name": "projected_encoder", "encoder": VIT, "frozen": "encoder/embed",
                    "head": {"hidden": 16, "out": 8, "layers": 3, **norm},
                    "predictor": {"hidden": 16, "out": 8, "layers": 2, **norm}}
    config.method = "moco_v3"
    config.moco_v3 = {"momentum": 0.9, "momentum_schedule": "cosine"}
    config.total_steps = STEPS
    config.loss = {"name": "moco_v3", "temperature": TAU, **loss}
    config.optimizer = {"name": "sgd", "learning_rate": 0.05, "weight_decay": 1e-3,
                        "warmup_steps": 0}
    return config


def float64(tree):
    return jax.tree.map(lambda a: a.astype(jnp.float64)
                        if jnp.issubdtype(a.dtype, jnp.floating) else a, tree)


@functools.cache
def two_steps(devices: int, batch_norm: bool = True, k: int = 1, sharding: str = "replicated",
              loss: tuple = ()):
    """The float64 states (host arrays) before, after one and after two train steps of
    :func:`make_config` on ``devices`` devices with ``k`` micro-batches and the state
    ``sharding``, and after a third step on a batch of NaN (skipped), and the momentum each of
    the two steps reported; each argument tuple is one program, compiled once per process."""
    config = make_config(batch_norm, **dict(loss))
    config.accumulation_steps = k
    config.sharding = {"params": sharding, "min_size": 0}
    mesh = make_mesh({"data": devices}, jax.devices()[:devices])
    method = method_for(config)
    with jax.enable_x64(True):
        graphdef, state, tx = create_state(config, STEPS, method)
        state = float64(state)
        s = jax.device_put(jax.tree.map(jnp.copy, state),
                           state_shardings(config.sharding, mesh, state))
        step = train_step.compiled_step(config, mesh, graphdef, s, tx, STEPS, method)
        rng = np.random.default_rng(0)
        states, reported = [jax.device_get(state)], []
        for i in range(2):
            batch = jax.device_put({"image": rng.uniform(0, 1, (B, 8, 8, 1))},
                                   NamedSharding(mesh, P("data")))
            s, metrics = step(s, batch)
            assert int(s.skipped) == 0 and np.isfinite(float(metrics["loss"])), i
            states.append(jax.device_get(s))
            reported.append(float(metrics["momentum"]))
        nan = jax.device_put({"image": np.full((B, 8, 8, 1), np.nan)},
                             NamedSharding(mesh, P("data")))
        skipped, _ = step(s, nan)  # a non-finite step: skipped, the state kept
        return [*states, jax.device_get(skipped)], reported


def assert_same_state(got, want, before):
    """Every leaf to 1e-12 of its size plus 1e-12 of the largest parameter move."""
    moves = jax.tree.map(lambda a, b: float(np.abs(np.subtract(a, b)).max()), want.params,
                         before.params)
    assert max(jax.tree.leaves(moves)) > 1e-3  # the steps did something
    atol = 1e-12 * max(jax.tree.leaves(moves))
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want),
                            strict=True):
        if np.issubdtype(np.asarray(a).dtype, np.floating):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=atol,
                                       err_msg=jax.tree_util.keystr(path))
        else:
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_key_encoder_is_the_scheduled_average_and_the_patch_projection_stays():
    """Two steps on 8 devices: after step t the key encoder is ``m_t theta_k + (1 - m_t)
    theta_q`` of the key encoder before and the updated query encoder (``theta_k`` starts as a
    copy), every leaf to 1e-14, with ``m_t`` the cosine schedule's (T = 10, m0 = 0.9; the
    reported ``momentum`` is that of the update the step makes); ``momentum_step`` counts the
    updates, and a skipped step (a NaN batch) changes neither it nor the key encoder; the patch
    projection (``model.frozen = "encoder/embed"``) is bit-identical to its
    initial value in both encoders."""
    (s0, s1, s2, s3), reported = two_steps(8)
    with jax.enable_x64(True):
        m = [float(momentum_at(t, STEPS, 0.9)) for t in (1, 2)]
    np.testing.assert_allclose(reported, m, rtol=1e-7)  # the metric is float32
    assert 0.9 < m[0] < m[1] < 1
    for key_before, new, m_t in ((s0.params, s1, m[0]), (s1.extra["key_params"], s2, m[1])):
        want = jax.tree.map(lambda k, q, m_t=m_t: m_t * k + (1 - m_t) * q, key_before,
                            new.params)
        for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(new.extra["key_params"]),
                                jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-14, atol=1e-16,
                                       err_msg=jax.tree_util.keystr(path))
    assert [int(s.extra["momentum_step"]) for s in (s0, s1, s2)] == [0, 1, 2]
    assert int(s3.skipped) == 1 and int(s3.extra["momentum_step"]) == 2  # not counted
    for a, b in zip(jax.tree.leaves(s3.extra), jax.tree.leaves(s2.extra), strict=True):
        np.testing.assert_array_equal(a, b)
    for tree in (s2.params, s2.extra["key_params"]):
        for name in ("kernel", "bias"):
            np.testing.assert_array_equal(tree["encoder"]["embed"][name],
                                          s0.params["encoder"]["embed"][name])
    moved = s2.params["encoder"]["positions"] - s0.params["encoder"]["positions"]
    assert np.abs(moved).max() > 1e-4  # the rest of the ViT trained
    # the frozen path keeps no optimiser state (set_to_zero); the rest of the encoder does
    opt_paths = list(leaves_by_path(s2.opt_state))
    assert not any("encoder/embed/" in p for p in opt_paths)
    assert any("encoder/positions" in p for p in opt_paths)


def test_one_device_equals_eight_devices():
    """The whole state after two steps (parameters, SGD state, the BatchNorm statistics of the
    projector and predictor, the key encoder and its statistics) on 1 device equals 8 devices
    to 1e-12 in float64: the BatchNorm is over the global batch either way (as SimCLR's global
    BN, docs/derivations.md §9.6) and the keys are the global batch's."""
    assert_same_state(two_steps(1)[0][2], two_steps(8)[0][2], two_steps(8)[0][0])


def test_fsdp_with_the_ring_equals_the_replicated_step():
    """FSDP (every leaf split over 8 devices where it divides, the key encoder included) with
    the ring strategy for ``ctr`` equals the replicated step with the single-device loss, the
    whole state after two steps to 1e-12 in float64."""
    (_, _, fsdp, _), _ = two_steps(8, sharding="fsdp", loss=(("strategy", "ring"),))
    assert_same_state(fsdp, two_steps(8)[0][2], two_steps(8)[0][0])


def test_micro_batches_equal_one_batch():
    """``accumulation_steps = 4`` (micro-batches of 8, one row per device each) with the
    all-gather strategy equals one batch of 32, the whole state after two steps to 1e-12 in
    float64; without BatchNorm, whose statistics are per micro-batch by definition
    (training/step/accumulation.py)."""
    (s0, _, one, _), _ = two_steps(8, batch_norm=False)
    (_, _, four, _), _ = two_steps(8, batch_norm=False, k=4, loss=(("strategy", "all_gather"),))
    assert_same_state(four, one, s0)


def test_no_gradient_reaches_the_key_encoder():
    """The gradient of the loss with respect to the key encoder's parameters is exactly 0
    while the loss depends on them (moving them changes it) and the query encoder's is not."""
    config = make_config()
    mesh = make_mesh({"data": 1}, jax.devices()[:1])
    method = method_for(config)
    graphdef, state, _ = create_state(config, STEPS, method)
    ctx = train_step.make_context(config, mesh, graphdef, method)
    batch = {"image": np.random.default_rng(1).uniform(0, 1, (B, 8, 8, 1)).astype(np.float32)}
    keys = jax.random.split(jax.random.key(3), B)

    @jax.jit
    def loss_and_grads(params, key_params):
        def loss(p, kp):
            model = nnx.merge(graphdef, p, state.rest, copy=True)
            return method.loss(model, batch, keys, {**state.extra, "key_params": kp}, ctx)[0]
        return jax.value_and_grad(loss, argnums=(0, 1))(params, key_params)

    value, (g_query, g_key) = loss_and_grads(state.params, state.extra["key_params"])
    assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(g_key))
    assert float(jnp.abs(g_query["head"]["out"]["kernel"]).max()) > 1e-4
    shifted = jax.tree.map(lambda a: a * 1.1, state.extra["key_params"])
    assert abs(float(loss_and_grads(state.params, shifted)[0]) - float(value)) > 1e-4


def test_settings_say_what_to_change():
    config = make_config()
    method = method_for(config)
    assert isinstance(method, MoCoV3) and method.schedule_steps == STEPS
    assert method.momentum == 0.9 and method.momentum_schedule == "cosine"
    config.moco_v3.schedule_steps = 5
    assert method_for(config).schedule_steps == 5
    config.moco_v3.momentum_schedule = "constant"
    config.moco_v3.schedule_steps, config.total_steps = 0, 0
    assert method_for(config).momentum_schedule == "constant"
    cases = [({"momentum": 1.5}, r"moco_v3.momentum must be a number in \[0, 1\]"),
             ({"momentum": -0.1}, r"moco_v3.momentum must be a number in \[0, 1\]"),
             ({"momentum_schedule": "step"}, "unknown moco_v3.momentum_schedule 'step'; "
                                             "valid: \\['cosine', 'constant'\\]"),
             ({"schedule_steps": -1}, "moco_v3.schedule_steps must be an int >= 0"),
             ({"queue_size": 4}, r"unknown moco_v3 settings \['queue_size'\]")]
    for block, match in cases:
        with pytest.raises(ConfigError, match=match):
            MoCoV3Settings.from_block(block)
    bad = make_config()
    bad.model.predictor = {}
    with pytest.raises(ConfigError, match=r"set model.name = 'projected_encoder' and "
                                          r"model.predictor"):
        method_for(bad)
    bad = make_config()
    bad.model.learn_temperature = True
    with pytest.raises(ConfigError, match=r"set model.learn_temperature = False"):
        method_for(bad)
    bad = make_config(positive_ids="label")
    with pytest.raises(ConfigError, match=r"loss.positive_ids and loss.direction do not apply"):
        method_for(bad)
    bad = make_config()
    bad.total_steps = 0  # a run of num_epochs: its length is not the method's to know
    with pytest.raises(ConfigError, match=r"set config.total_steps or "
                                          r"config.moco_v3.schedule_steps"):
        method_for(bad)


def test_the_heads_end_in_a_batch_norm_without_scale_and_offset():
    """``out_batch_norm``: in training each output feature is normalised over the batch,
    ``(y - mean) / sqrt(var + 1e-5)`` of the last Linear's output, no scale or offset is
    learned and that Linear has no bias; ``predict`` runs the predictor on the projection, and
    a model without one says what to set."""
    block = architecture_block(make_config().model)
    model = build_model(block, nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)
    assert set(params["head"]["out"]) == {"kernel"} and "out_norm" not in params["head"]
    assert set(params["predictor"]["out"]) == {"kernel"}
    x = np.random.default_rng(2).uniform(0, 1, (B, 8, 8, 1)).astype(np.float32)
    z, h = model(x, train=True, dropout_keys=jax.random.split(jax.random.key(0), B))
    q = model.predict(z, train=True)
    for out, head, into in ((z, model.head, h), (q, model.predictor, z)):
        y = into
        for linear, norm in zip(head.hidden, head.norms, strict=True):
            y = nnx.relu(norm(linear(y), use_running_average=False))
        y = np.asarray(head.out(y), np.float64)
        want = (y - y.mean(0)) / np.sqrt(y.var(0) + 1e-5)
        np.testing.assert_allclose(out, want, atol=2e-5)
        np.testing.assert_allclose(np.mean(out, 0), 0, atol=1e-5)
    plain = build_model({**block, "predictor": {}}, nnx.Rngs(0))
    with pytest.raises(ConfigError, match=r"set model.predictor"):
        plain.predict(z, train=True)
    with pytest.raises(ConfigError, match=r"model.predictor: unknown settings \['width'\]"):
        build_model({**block, "predictor": {"width": 4}}, nnx.Rngs(0))
    assert ProjectionHead(4, 8, 2, out_batch_norm=True, rngs=nnx.Rngs(0)).out_norm is not None


def test_model_frozen_names_a_path_below_the_top_level():
    """``model.frozen`` takes paths (``"encoder/embed"``) in a projected encoder; a whole
    tower there, or a path the model lacks, says what to write."""
    assert frozen_names({"name": "projected_encoder", "frozen": "encoder/embed"}) == (
        "encoder/embed",)
    with pytest.raises(ConfigError, match=r"model.frozen = \['encoder'\] locks whole towers"):
        frozen_names({"name": "projected_encoder", "frozen": ("encoder", "encoder/embed")})
    with pytest.raises(ConfigError, match="paths below them"):
        frozen_names({"name": "projected_encoder", "frozen": "encoder//embed"})
    config = make_config()
    config.model.frozen = "encoder/patches"
    with pytest.raises(ConfigError, match=r"model.frozen names \['encoder/patches'\]"):
        create_state(config, STEPS, method_for(config))
