"""The train state split over the mesh (FSDP): the same steps as replicated, 1/8 of the bytes,
checkpoints that restore onto another mesh and another sharding."""

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from test_train import load_config

from contrastive_jax.errors import ConfigError
from contrastive_jax.mesh import make_mesh
from contrastive_jax.training import train
from contrastive_jax.training.data import train_iterator
from contrastive_jax.training.methods import method_for
from contrastive_jax.training.parameter_paths import path_name
from contrastive_jax.training.run import checkpoints
from contrastive_jax.training.step import train_step
from contrastive_jax.training.step.state_sharding import (
    bytes_per_device,
    fsdp_spec,
    state_shardings,
)
from contrastive_jax.training.step.train_state import create_state, params_digest

FSDP = {"params": "fsdp", "min_size": 0}


def float64(tree):
    return jax.tree.map(lambda a: a.astype(jnp.float64)
                        if jnp.issubdtype(a.dtype, jnp.floating) else a, tree)


def test_fsdp_spec_takes_the_largest_divisible_dimension():
    assert fsdp_spec((768, 3072), "data", 8, 0) == P(None, "data")
    assert fsdp_spec((3072, 768), "data", 8, 0) == P("data", None)
    assert fsdp_spec((12, 16), "data", 8, 0) == P(None, "data")  # 12 does not divide by 8
    assert fsdp_spec((1, 196, 768), "data", 8, 0) == P(None, None, "data")  # 196 % 8 = 4
    assert fsdp_spec((7, 5), "data", 8, 0) == P()  # nothing divides: replicated
    assert fsdp_spec((), "data", 8, 0) == P()
    assert fsdp_spec((64, 64), "data", 8, 2**14) == P()  # below min_size


@pytest.mark.parametrize("spec", ["clip_mnist1d.py:quick", "moco_mnist1d.py:quick",
                                  "moco_v2_resnet50_imagenet.py:tiny"])
def test_fsdp_steps_equal_replicated_steps(spec, request):
    """Three train steps of the CLIP and MoCo configs (MoCo: SimCLR's CNN and BatchNorm head
    over the global batch as its query side, plus the momentum key encoder and the queue) in
    float64: every parameter, optimiser, BatchNorm, key-encoder and queue leaf equal to the
    replicated run's to 1e-12 relative; and the FSDP state really is split (each device holds
    1/8 of every leaf that divides, checked on the output arrays' shardings, MoCo's queue and
    key encoder included). SGD with momentum and weight decay: Adam divides by sqrt(v), so a
    leaf whose exact gradient is 0 (the attention's key bias) would move by rounding noise /
    eps in either run. The MoCo v2 ImageNet template's tiny variant too: a ResNet with
    BatchNorm over the global batch, two host-cropped views per example with the recipe's
    device augmentations, its queue and key encoder (on the mock ``imagenet2012``)."""
    config = load_config(spec)
    if config.data.name == "imagenet2012":
        config.data.data_dir = request.getfixturevalue("mock_imagenet")
        config.model.dtype = "float32"  # bfloat16 rounds the two layouts' sums differently
    config.optimizer.update({"name": "sgd", "learning_rate": 0.05, "weight_decay": 1e-3})
    mesh = make_mesh({"data": 8})
    method = method_for(config)
    with jax.enable_x64(True):
        graphdef, state, tx = create_state(config, 10, method)
        state = float64(state)
        batch = float64(next(train_iterator(config.data, mesh)))
        finals = {}
        for mode in ("replicated", "fsdp"):
            config.sharding = {**FSDP, "params": mode}
            shardings = state_shardings(config.sharding, mesh, state)
            s = jax.device_put(jax.tree.map(jnp.copy, state), shardings)
            step = train_step.compiled_step(config, mesh, graphdef, s, tx, 10, method)
            for _ in range(3):
                s, metrics = step(s, batch)
            assert int(s.skipped) == 0 and np.isfinite(float(metrics["loss"]))
            finals[mode] = s
        split = [leaf for leaf in jax.tree.leaves(finals["fsdp"].params)
                 if not leaf.sharding.is_fully_replicated]
        assert len(split) >= len(jax.tree.leaves(state.params)) // 2
        if spec.startswith("moco"):  # the key encoder and the queue are split as well
            extra = [leaf for leaf in jax.tree.leaves(finals["fsdp"].extra)
                     if not leaf.sharding.is_fully_replicated]
            assert len(extra) >= len(jax.tree.leaves(state.extra)) // 2
            split += extra
            queue = finals["fsdp"].extra["queue"]
            assert queue.shape[0] == config.moco.queue_size
            assert any(leaf is queue for leaf in extra)
        for leaf in split:
            assert leaf.addressable_shards[0].data.size * 8 == leaf.size
        moved = jax.tree.map(lambda a, b: float(np.abs(np.subtract(a, b)).max()),
                             finals["replicated"].params, state.params)
        assert max(jax.tree.leaves(moved)) > 1e-3  # the steps did something
        # each leaf to 1e-12 of its size, plus 1e-12 of the largest move (leaves whose exact
        # gradient is 0, the attention's key bias, hold rounding noise of either order)
        atol = 1e-12 * max(jax.tree.leaves(moved))
        for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(finals["fsdp"]),
                                jax.tree.leaves(finals["replicated"]), strict=True):
            if jnp.issubdtype(a.dtype, jnp.floating):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12,
                                           atol=atol, err_msg=jax.tree_util.keystr(path))
            else:
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert params_digest(finals["fsdp"]) == params_digest(
            jax.device_put(finals["fsdp"], state_shardings(None, mesh, finals["fsdp"])))


def test_fsdp_holds_an_eighth_of_the_state_per_device():
    """Parameters + optimiser state of the CLIP config's dual encoder: per-device bytes under
    FSDP at most 1/8 of replicated plus the leaves left whole (under 5% of it), from the
    shardings, and what device 0 really holds once placed agrees."""
    config = load_config("clip_mnist1d.py")
    mesh = make_mesh({"data": 8})
    _, state, _ = create_state(config, 1000, method_for(config))
    part = {"params": state.params, "opt_state": state.opt_state}
    replicated = bytes_per_device(part, state_shardings(None, mesh, part))
    config.sharding = {"params": "fsdp", "min_size": 256}
    shardings = state_shardings(config.sharding, mesh, part)
    fsdp = bytes_per_device(part, shardings)
    small = sum(leaf.nbytes for leaf, s in zip(jax.tree.leaves(part), jax.tree.leaves(shardings),
                                               strict=True) if s.is_fully_replicated)
    assert fsdp <= replicated / 8 + small
    assert small < 0.05 * replicated  # the split leaves are nearly all of it
    placed = jax.device_put(part, shardings)
    on_device_0 = sum(shard.data.nbytes for leaf in jax.tree.leaves(placed)
                      for shard in leaf.addressable_shards if shard.device == mesh.devices.flat[0])
    assert on_device_0 == fsdp


def test_rules_override_the_default_and_bad_settings_say_what_to_change():
    config = load_config("clip_mnist1d.py:quick")
    mesh = make_mesh({"data": 8})
    _, state, _ = create_state(config, 10, method_for(config))
    rules = {"params": "fsdp", "min_size": 0,
             "rules": ((r"text_encoder/.*kernel$", "replicated"),
                       (r"^params/sample_encoder/out/kernel$", (None, "data")))}
    shardings = state_shardings(rules, mesh, state)
    flat = {path_name(p): s for p, s in jax.tree_util.tree_leaves_with_path(shardings)}
    text = [s for k, s in flat.items() if "text_encoder" in k and k.endswith("kernel")]
    assert len(text) >= 6 and all(s.is_fully_replicated for s in text)  # params, mu, nu
    assert flat["params/sample_encoder/out/kernel"].spec == P(None, "data")
    mu = [s for k, s in flat.items() if k.endswith("mu/sample_encoder/out/kernel")]
    assert len(mu) == 1 and mu[0].spec == P("data", None)  # the default: largest dimension
    for bad, message in [({"params": "zero3"}, "sharding.params"),
                         ({"param": "fsdp"}, "unknown settings"),
                         ({"params": "fsdp", "fsdp_axis": "model"}, "not an axis"),
                         ({"rules": (("(", "fsdp"),)}, "bad regex"),
                         ({"rules": (("log_scale", ("data",)),)}, "one per dimension")]:
        with pytest.raises(ConfigError, match=message):
            state_shardings(bad, mesh, state)


def test_a_checkpoint_restores_onto_another_mesh_and_sharding(tmp_path):
    """Saved under FSDP on 8 devices, restored replicated on 4 and FSDP on 4 (and the
    replicated one back under FSDP on 8): the same numbers, in the target's shardings."""
    config = load_config("clip_mnist1d.py:quick")
    _, state, _ = create_state(config, 10, method_for(config))
    state = state.replace(params=jax.tree.map(lambda a: a + 0.5, state.params))
    eight, four = make_mesh({"data": 8}), make_mesh({"data": 4}, jax.devices()[:4])
    saved = jax.device_put(state, state_shardings(FSDP, eight, state))
    want = jax.device_get(saved)
    stream = train_iterator(config.data, eight)
    mgr = checkpoints.manager(tmp_path, every=1, keep=3)
    checkpoints.save(mgr, 1, saved, stream, force=True)
    mgr.wait_until_finished()
    for mesh, sharding in [(four, None), (four, FSDP), (eight, None)]:
        template = jax.device_put(state, state_shardings(sharding, mesh, state))
        restored, step = checkpoints.restore_latest(mgr, template, stream)
        assert step == 1
        for got, target, value in zip(jax.tree.leaves(restored), jax.tree.leaves(template),
                                      jax.tree.leaves(want), strict=True):
            assert got.sharding == target.sharding
            np.testing.assert_array_equal(np.asarray(got), value)
    mgr.close()
    assert isinstance(ocp.CheckpointManager, type)


def test_the_trainer_resumes_a_replicated_run_under_fsdp(tmp_path):
    """The uninterrupted replicated 6-step SimCLR quick run (tests/trained_workdirs.py, trained
    once per process) with its step-6 checkpoint removed, resumed from step 3 under FSDP (a
    sharding change is allowed on resume, not a config change to accept), ends where the
    uninterrupted run ends (float32: rounding only)."""
    import json
    import shutil

    from trained_workdirs import simclr_quick_config, simclr_quick_workdir

    workdir = simclr_quick_workdir(tmp_path / "split")
    whole = json.loads((workdir / "results.json").read_text())
    shutil.rmtree(workdir / "checkpoints" / "6")
    config = simclr_quick_config()
    config.sharding = FSDP
    resumed = train.train_and_evaluate(config, str(workdir))
    assert resumed["resumed_from"] == 3 and resumed["steps"] == 6
    np.testing.assert_allclose(resumed["final_train_metrics"]["loss"],
                               whole["final_train_metrics"]["loss"], rtol=1e-4)
    sharded = NamedSharding(make_mesh({"data": 8}), P("data"))
    assert sharded.num_devices == 8
