"""Locked towers (model.frozen): unchanged bit for bit, no optimiser state, no backward pass
through them, and the trained tower's gradient equal to the unfrozen computation's."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_accumulation import TEXT, B, assert_same_gradients, float64, make_batch
from test_train import load_config

from contrastive_jax.errors import ConfigError
from contrastive_jax.losses import clip_loss
from contrastive_jax.mesh import make_mesh
from contrastive_jax.training.data import train_iterator
from contrastive_jax.training.methods import method_for
from contrastive_jax.training.methods.base import example_keys
from contrastive_jax.training.models.dropout import fold_each
from contrastive_jax.training.parameter_paths import path_name
from contrastive_jax.training.step import train_step
from contrastive_jax.training.step.accumulation import step_gradients
from contrastive_jax.training.step.state_sharding import state_shardings
from contrastive_jax.training.step.train_state import create_state


def leaves_by_path(tree) -> dict[str, np.ndarray]:
    return {path_name(p): np.asarray(leaf) for p, leaf in
            jax.tree_util.tree_leaves_with_path(tree)}


def lit_config(frozen="sample_encoder", **sharding):
    """The quick CLIP config (signal CNN with BatchNorm, Transformer text tower), without
    augmentations (they run before the towers: a part of each step to compile that the frozen
    tower's claims do not depend on)."""
    config = load_config("clip_mnist1d.py:quick")
    config.augment = None
    config.model.frozen = frozen
    config.optimizer.update({"weight_decay": 0.1, "learning_rate": 1e-2})
    config.sharding.update(sharding)
    return config


CASES = {  # frozen parameters, sharding, K; the replicated run also freezes the log-scale
    "replicated": (("sample_encoder", "log_scale"), (), 1),
    "fsdp": ("sample_encoder", (("params", "fsdp"), ("min_size", 0)), 2),
}


def is_frozen(path: str, frozen: str | tuple) -> bool:
    """Whether a leaf path (of the parameters or the optimiser state) lies under ``frozen``."""
    return bool(set(path.split("/")) & set((frozen,) if isinstance(frozen, str) else frozen))


@functools.cache
def three_steps(case: str) -> dict:
    """Three steps of ``lit_config`` for ``CASES[case]`` (a frozen log-scale set to log 100,
    above the clamp's cap, as a converted CLIP's): the paths of the optimiser state and of the
    trainable parameters, the parameters and other state (leaves by path) before and after, the
    last step's metrics and state; run once per process (two tests read the replicated run)."""
    frozen, sharding, k = CASES[case]
    config = lit_config(frozen, **dict(sharding))
    config.accumulation_steps = k
    mesh = make_mesh({"data": 8})
    method = method_for(config)
    graphdef, state, tx = create_state(config, 10, method)
    if "log_scale" in frozen:
        state = state.replace(params=jax.tree_util.tree_map_with_path(
            lambda p, a: jnp.full_like(a, np.log(100.0)) if path_name(p) == "log_scale" else a,
            state.params))
    run = {"opt_paths": list(leaves_by_path(state.opt_state)),
           "trainable": [p for p in leaves_by_path(state.params) if not is_frozen(p, frozen)]}
    state = jax.device_put(state, state_shardings(config.sharding, mesh, state))
    step = train_step.compiled_step(config, mesh, graphdef, state, tx, 10, method)
    run["before"], run["rest_before"] = leaves_by_path(state.params), leaves_by_path(state.rest)
    new = state  # donated to the step
    batches = train_iterator(config.data, mesh)
    for _ in range(3):
        new, metrics = step(new, next(batches))
    run.update(new=new, metrics=metrics, after=leaves_by_path(new.params),
               rest_after=leaves_by_path(new.rest))
    return run


@pytest.mark.parametrize("case", list(CASES))
def test_frozen_tower_is_bit_identical_and_has_no_optimizer_state(case):
    """Three steps (replicated with K = 1; FSDP with 2 micro-batches): the signal tower's
    parameters and BatchNorm statistics are bit-identical to the start, everything else moved
    (the replicated run also freezes the log-scale); the optimiser state has no leaf under
    the frozen parameters, and exactly 2 per trainable leaf (Adam's mu and nu) plus the
    counts."""
    frozen = CASES[case][0]
    run = three_steps(case)
    assert any(p.startswith("sample_encoder") for p in run["before"])
    assert not [p for p in run["opt_paths"] if is_frozen(p, frozen)]
    arrays = [p for p in run["opt_paths"] if not p.endswith("count")]
    assert len(arrays) == 2 * len(run["trainable"])
    assert int(run["new"].skipped) == 0 and np.isfinite(float(run["metrics"]["loss"]))
    for path, value in run["before"].items():
        if path in run["trainable"]:
            assert not np.array_equal(run["after"][path], value), path  # it trained
        else:
            assert is_frozen(path, frozen), path
            assert run["after"][path].tobytes() == value.tobytes(), path
    assert any(p.startswith("sample_encoder/norms") for p in run["rest_before"])
    for path, value in run["rest_before"].items():  # BatchNorm statistics of the frozen tower
        assert run["rest_after"][path].tobytes() == value.tobytes(), path
    if case == "fsdp":  # the frozen tower's leaves are split under FSDP too
        conv = run["new"].params["sample_encoder"]["convs"][1]["kernel"]
        assert not conv.sharding.is_fully_replicated


def test_unfrozen_tower_batch_norm_statistics_move():
    """Control for the test above: without model.frozen the same steps change the signal
    tower's parameters and its BatchNorm statistics (two steps)."""
    config = lit_config(frozen="")
    mesh = make_mesh({"data": 8})
    method = method_for(config)
    graphdef, state, tx = create_state(config, 10, method)
    assert any("sample_encoder" in p for p in leaves_by_path(state.opt_state))
    # placed as the step returns it: the second step does not compile again
    state = jax.device_put(state, state_shardings(config.sharding, mesh, state))
    step = train_step.compiled_step(config, mesh, graphdef, state, tx, 10, method)
    params, rest = leaves_by_path(state.params), leaves_by_path(state.rest)
    batches = train_iterator(config.data, mesh)
    new, _ = step(state, next(batches))
    new, _ = step(new, next(batches))  # (the first step's learning rate is 0: warmup)
    mean = "sample_encoder/norms/0/mean"
    assert not np.array_equal(leaves_by_path(new.rest)[mean], rest[mean])
    kernel = "sample_encoder/convs/0/kernel"
    assert not np.array_equal(leaves_by_path(new.params)[kernel], params[kernel])


MLP = {"name": "mlp", "in_features": 8, "hidden": 16, "depth": 2, "features": 16}


def gradient_setup(sample_encoder, frozen, devices=8):
    config = load_config("clip_mnist1d.py:quick")
    config.data = {"batch_size": B}
    config.input_key, config.text_key, config.augment = "signal", "caption", None
    config.model.sample_encoder = sample_encoder
    config.model.text_encoder = TEXT  # dropout 0.2: the per-example dropout keys matter
    config.model.frozen = frozen
    config.loss = {"name": "clip", "impl": "autodiff"}
    mesh = make_mesh({"data": devices}, jax.devices()[:devices])
    method = method_for(config)
    graphdef, state, _ = create_state(config, 10, method)
    return config, mesh, method, graphdef, float64(state)


def signal_batch(shape):
    batch = make_batch()
    batch["signal"] = np.random.default_rng(3).normal(size=(B, *shape))
    return batch


@pytest.mark.parametrize("k", [1, 4])
def test_trained_tower_gradient_equals_the_unfrozen_gradient(k):
    """MLP signal tower (no BatchNorm, no dropout: training and inference mode agree): with
    the signal tower frozen, the gradient of every other parameter equals the unfrozen run's
    to 1e-12 in float64 (K = 1 and 4 micro-batches, 8 devices); the frozen tower's entries are
    exactly zero while the unfrozen run's are not."""
    with jax.enable_x64(True):
        batch, keys = signal_batch((8,)), jax.random.split(jax.random.key(5), B)
        grads = {}
        for frozen in ("", "sample_encoder"):
            config, mesh, method, graphdef, state = gradient_setup(MLP, frozen)
            ctx = train_step.make_context(config, mesh, graphdef, method)
            fn = jax.jit(lambda p, r, b, kk, ctx=ctx, m=method, g=graphdef: step_gradients(
                p, r, b, kk, {}, graphdef=g, method=m, ctx=ctx, accumulation_steps=k)[:2])
            grads[frozen] = fn(state.params, state.rest, batch, keys)
        loss, got = grads["sample_encoder"]
        want_loss, want = grads[""]
        frozen_part = got["sample_encoder"]
        assert all(float(np.abs(g).max()) == 0.0 for g in jax.tree.leaves(frozen_part))
        assert max(float(np.abs(g).max()) for g in jax.tree.leaves(
            want["sample_encoder"])) > 1e-6
        trained = {key: got[key] for key in got if key != "sample_encoder"}
        reference = {key: want[key] for key in want if key != "sample_encoder"}
        assert_same_gradients((loss, trained), (want_loss, reference))


def test_frozen_batch_norm_tower_runs_in_inference_mode():
    """Signal CNN with BatchNorm, frozen: the step's loss and gradients equal the plain
    single-device computation in which the signal tower runs in inference mode (running
    averages) and the text tower trains (dropout on), differentiated with respect to every
    parameter; to 1e-12 in float64."""
    cnn = {"name": "signal_cnn", "length": 40, "channels": (8, 8), "kernel_sizes": (5, 3),
           "strides": (1, 2), "features": 16}
    with jax.enable_x64(True):
        config, mesh, method, graphdef, state = gradient_setup(cnn, "sample_encoder")
        rest = jax.tree.map(lambda a: a + 0.3, state.rest)  # statistics away from 0 and 1
        batch, keys = signal_batch((40, 1)), jax.random.split(jax.random.key(5), B)
        ctx = train_step.make_context(config, mesh, graphdef, method)
        loss, grads, _, _, new_rest, _ = jax.jit(lambda p, r, b, kk: step_gradients(
            p, r, b, kk, {}, graphdef=graphdef, method=method, ctx=ctx))(
            state.params, rest, batch, keys)

        def plain(params):
            model = nnx.merge(graphdef, params, rest, copy=True)
            dropout = fold_each(example_keys(keys)[1], 1)
            x = model.embed_samples(jnp.asarray(batch["signal"]), train=False)
            y = model.embed_texts(jnp.asarray(batch["caption"]), train=True,
                                  dropout_keys=dropout)
            return clip_loss(x, y, model.log_scale[...], impl="autodiff")

        want_loss, want = jax.jit(jax.value_and_grad(plain))(state.params)  # one program
        trained = {key: grads[key] for key in grads if key != "sample_encoder"}
        reference = {key: want[key] for key in want if key != "sample_encoder"}
        assert_same_gradients((loss, trained), (want_loss, reference))
        for a, b in zip(jax.tree.leaves(new_rest), jax.tree.leaves(rest), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def count_convolutions(frozen):
    cnn = {"name": "signal_cnn", "length": 40, "channels": (8, 8, 8), "kernel_sizes": (5, 3, 3),
           "strides": (1, 1, 1), "features": 16}
    config, mesh, method, graphdef, state = gradient_setup(cnn, frozen, devices=1)
    ctx = train_step.make_context(config, mesh, graphdef, method)
    batch, keys = signal_batch((40, 1)), jax.random.split(jax.random.key(5), B)
    jaxpr = jax.make_jaxpr(lambda p: step_gradients(
        p, state.rest, batch, keys, {}, graphdef=graphdef, method=method, ctx=ctx)[1])(
        state.params)
    return str(jaxpr).count("conv_general_dilated")


def test_no_backward_pass_through_the_frozen_tower():
    """The gradient program of a frozen 3-layer signal CNN holds its 3 forward convolutions
    only; the unfrozen one also holds their backward convolutions."""
    with jax.enable_x64(True):
        assert count_convolutions("sample_encoder") == 3
        assert count_convolutions("") > 3


def test_bad_frozen_settings_say_what_to_change():
    config = lit_config(frozen="image_encoder")
    with pytest.raises(ConfigError, match=r"does not have.*'sample_encoder'"):
        create_state(config, 10, method_for(config))
    config = lit_config(frozen=("sample_encoder", "text_encoder", "sample_proj", "text_proj",
                                "log_scale"))
    with pytest.raises(ConfigError, match="freezes every parameter"):
        create_state(config, 10, method_for(config))
    config = lit_config(frozen=3)
    with pytest.raises(ConfigError, match="a name or a tuple of names"):
        create_state(config, 10, method_for(config))
    config = load_config("simclr_mnist1d.py:quick")
    config.model.frozen = "encoder"
    with pytest.raises(ConfigError, match="applies to dual encoders"):
        create_state(config, 10, method_for(config))


def test_frozen_log_scale_above_the_cap_is_not_clamped():
    """A frozen log-scale (e.g. a converted CLIP's log 100) stays as it is: the clamp applies
    to trained parameters only (the replicated run of the first test, three steps)."""
    run = three_steps("replicated")
    assert run["before"]["log_scale"].tobytes() == np.asarray(np.float32(np.log(100.0))).tobytes()
    assert run["after"]["log_scale"].tobytes() == run["before"]["log_scale"].tobytes()
