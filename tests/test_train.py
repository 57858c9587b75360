"""The trainer on 8 CPU devices: every config learns, data parallelism is exact, resume is exact."""

import copy
import importlib.util
import json
import sys
from pathlib import Path

import forked_command_lines
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contrastive_jax.losses.parts.temperature import logit_scale
from contrastive_jax.mesh import make_mesh
from contrastive_jax.training import evaluation, train
from contrastive_jax.training.data import train_iterator
from contrastive_jax.training.evaluation import run_evaluation
from contrastive_jax.training.evaluation.evaluators import evaluate
from contrastive_jax.training.methods import method_for
from contrastive_jax.training.run import checkpoints
from contrastive_jax.training.step import train_step
from contrastive_jax.training.step.train_state import create_state, replicated

REPO = Path(__file__).resolve().parents[1]


def load_config(spec: str):
    """``configs/NAME.py[:variant]`` -> the ConfigDict, as ``--config`` would load it."""
    path, _, arg = spec.partition(":")
    module_spec = importlib.util.spec_from_file_location("cfg", REPO / "configs" / path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(arg or None)


_COMPILED = {}


def setup(spec: str, devices: int = 8, steps: int = 12, **loss):
    """``(config, mesh, graphdef, fresh state, compiled step)``; one compile per setting."""
    config = load_config(spec)
    config.optimizer.learning_rate = 3e-3
    config.loss.update(loss)
    mesh = make_mesh({"data": devices}, jax.devices()[:devices])
    method = method_for(config)
    graphdef, state, tx = create_state(config, steps, method)
    state = jax.device_put(state, replicated(mesh, state))
    key = (spec, devices, steps, tuple(sorted(loss.items())))
    if key not in _COMPILED:
        _COMPILED[key] = train_step.compiled_step(config, mesh, graphdef, state, tx, steps, method)
    return config, mesh, graphdef, state, _COMPILED[key]


def replicated_copy(tree, mesh):
    return jax.device_put(jax.tree.map(jnp.copy, tree), replicated(mesh, tree))


@pytest.mark.parametrize("spec", [
    "simclr_mnist1d.py:quick", "moco_mnist1d.py:quick", "clip_mnist1d.py:quick",
    "clip_mnist1d.py:quick,loss=siglip", "mi_gaussian.py:quick"])
# (the ring loss inside the train step: test_data_parallel_step_equals_single_device_step)
def test_every_config_learns_on_eight_devices(spec):
    """12 steps on one batch; before each, the step counter (hence the augmentation key) and
    MoCo's key encoder and queue are reset, so the reported loss is the loss of the same
    problem each time, and it must fall."""
    config, mesh, _, state, step = setup(spec)
    assert mesh.devices.size == 8
    batch = next(train_iterator(config.data, mesh))
    fixed = replicated_copy({"step": state.step, "extra": state.extra}, mesh)
    losses = []
    for _ in range(13):
        state = state.replace(**replicated_copy(fixed, mesh))
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    assert np.all(np.isfinite(losses)) and int(state.skipped) == 0
    assert losses[-1] < losses[0] - 0.05, (spec, losses)
    # every method reports these; the InfoNCE bound only where it is one (not for SigLIP, not
    # with positives by id)
    expected = {"top1", "embedding_norm", "grad_norm", "learning_rate"}
    expected |= {"bias"} if "siglip" in spec else set()
    bound = "siglip" not in spec and not config.loss.get("positive_ids")
    for key in expected | ({"mi_bound"} if bound else set()):
        assert np.isfinite(float(metrics[key])), key
    assert bound or "mi_bound" not in metrics


def test_clamped_log_scale_and_skipped_non_finite_step():
    config, mesh, _, state, step = setup("clip_mnist1d.py:quick")
    state.params["log_scale"] = state.params["log_scale"].replace(
        jax.device_put(jnp.float32(7.0), replicated(mesh, jnp.float32(0))))
    batch = next(train_iterator(config.data, mesh))
    state, _ = step(state, batch)
    clamped = state.params["log_scale"][...]
    assert float(clamped) == pytest.approx(np.log(100.0)) and float(clamped) < np.log(100.0)
    # just below the cap, so the scale's gradient is not cut: it can come down again
    assert float(jax.grad(logit_scale)(clamped)) == pytest.approx(100.0, rel=1e-5)
    poisoned = dict(batch, signal=batch["signal"].at[0].set(jnp.nan))
    before = jax.device_get(state.params)
    state, metrics = step(state, poisoned)
    assert int(state.skipped) == 1 and int(state.step) == 2
    assert not np.isfinite(float(metrics["loss"]))
    for a, b in zip(jax.tree.leaves(jax.device_get(state.params)), jax.tree.leaves(before),
                    strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_example_gives_a_nan_loss_through_batchnorm_and_relu(bad):
    """SimCLR's CNN (BatchNorm, ReLU, mean pooling): one example all NaN (or inf) makes the
    step's loss NaN and skips the update. Without the batch check in train_step the loss came
    out finite, log(2N - 1): XLA:CPU's fused max drops NaN, so mean(relu(x)) of NaNs is 0."""
    config, mesh, _, state, step = setup("simclr_mnist1d.py:quick")
    batch = next(train_iterator(config.data, mesh))
    poisoned = dict(batch, signal=batch["signal"].at[3].set(bad))
    new, metrics = step(state, poisoned)
    assert np.isnan(float(metrics["loss"])) and int(new.skipped) == 1


def test_data_parallel_step_equals_single_device_step():
    """8 devices (ring loss, BatchNorm over the global batch) == 1 device, one step."""
    results = []
    for devices, strategy in ((1, ""), (8, "ring")):
        config, mesh, _, state, step = setup("simclr_mnist1d.py:quick", devices, steps=6,
                                             impl="tiled", strategy=strategy)
        batch = next(train_iterator(config.data, mesh))
        state, metrics = step(state, batch)
        results.append((jax.device_get(state), float(metrics["loss"])))
    (single, loss1), (multi, loss8) = results
    assert abs(loss8 - loss1) <= 1e-5 * abs(loss1)
    for key in ("params", "rest"):  # updated weights and BatchNorm statistics
        for a, b in zip(jax.tree.leaves(getattr(multi, key)),
                        jax.tree.leaves(getattr(single, key)), strict=True):
            np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6)


def test_restored_checkpoint_gives_the_identical_next_step(tmp_path):
    # MoCo has the richest state: key encoder, queue and its pointer
    config, mesh, _, state, step = setup("moco_mnist1d.py:quick")
    stream = train_iterator(config.data, mesh)
    for _ in range(2):
        state, _ = step(state, next(stream))
    manager = checkpoints.manager(tmp_path, every=1, keep=2)
    checkpoints.save(manager, 2, state, stream, force=True)
    manager.wait_until_finished()
    continued, _ = step(state, next(stream))
    continued = jax.device_get(continued)

    _, _, _, fresh, _ = setup("moco_mnist1d.py:quick")
    fresh_stream = train_iterator(config.data, mesh)
    restored, at = checkpoints.restore_latest(manager, fresh, fresh_stream)
    assert at == 2 and int(restored.step) == 2
    resumed, _ = step(restored, next(fresh_stream))
    for a, b in zip(jax.tree.leaves(jax.device_get(resumed)), jax.tree.leaves(continued),
                    strict=True):
        np.testing.assert_array_equal(a, b)  # bit-identical
    manager.close()


def test_command_line_runs_reports_and_resumes(tmp_path):
    """A run of ``python -m contrastive_jax.main`` on one device reports, logs and checkpoints;
    the same workdir resumes on 8 devices. (A misspelt flag's exit status and message:
    tests/test_reliability.py, test_user_errors_exit_2_with_one_paragraph.)"""
    run = forked_command_lines.run(  # forked: no start-up of Python and its imports
        [sys.executable, "-m", "contrastive_jax.main",
         "--config=configs/simclr_mnist1d.py:quick", f"--workdir={tmp_path}",
         "--config.total_steps=4", "--config.checkpoint_every=2"])
    assert run.returncode == 0, run.stderr[-3000:]
    assert "step      4/4 | loss" in run.stdout and "ex/s (" in run.stdout
    assert "TFLOP/s/chip | MFU n/a | ETA" in run.stdout  # the CPU: no peak to divide by
    assert "linear_probe" in run.stdout
    first = json.loads((tmp_path / "results.json").read_text())
    assert first["steps"] == 4 and first["resumed_from"] is None and first["devices"] == 1
    assert 0.1 < first["linear_probe"] <= 1 and 0.1 < first["knn"] <= 1
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if r["prefix"] == "train"] == [2, 4]
    last = [r for r in lines if r["prefix"] == "train"][-1]
    assert {"step_s", "examples_per_s", "examples_per_s_per_chip",
            "model_tflops_per_chip"} <= set(last) and "mfu" not in last
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    # the same workdir, now on 8 devices and with more steps: resumes from step 4 (evaluation,
    # which a resume may change, off: the 6-step train step is the suite's shared program)
    config = load_config("simclr_mnist1d.py:quick")
    config.total_steps = 6
    config.evaluation.enabled = False
    second = train.train_and_evaluate(config, str(tmp_path))
    assert second["resumed_from"] == 4 and second["steps"] == 6 and second["devices"] == 8
    assert max(int(p.name) for p in (tmp_path / "checkpoints").iterdir()
               if p.name.isdigit()) == 6


def test_mutual_information_run_reports_the_true_value(tmp_path):
    config = load_config("mi_gaussian.py:quick,mi=6")
    results = train.train_and_evaluate(config, str(tmp_path))
    assert results["true_mutual_information"] == pytest.approx(6.0)
    bound = results["final_train_metrics"]["mi_bound"]
    assert bound <= np.log(config.data.batch_size) + 1e-6  # never above log N (derivations §15.3)


def test_evaluation_of_a_dual_encoder_is_the_same_on_one_and_eight_devices():
    """evaluate() on the CLIP config: every metric present and in its range, zero-shot from the
    class prompts through the text tower, and the same numbers whether the padded evaluation
    pass runs on 8 devices or 1 (the gathered rows are the same rows)."""
    config, mesh, graphdef, state, _ = setup("clip_mnist1d.py:quick")
    assert config.evaluation.zero_shot_prompts == "signal"
    eight = evaluate(graphdef, state, config, mesh)
    one_mesh = make_mesh({"data": 1}, jax.devices()[:1])
    one = evaluate(graphdef, jax.device_put(state, replicated(one_mesh, state)), config,
                   one_mesh)
    keys = {"linear_probe", "linear_probe_l2", "knn", "alignment", "uniformity", "zero_shot",
            *(f"{d}_r{k}" for d in ("x_to_y", "y_to_x") for k in (1, 5, 10))}
    assert set(eight) == keys
    for key in keys:
        assert eight[key] == pytest.approx(one[key], abs=1e-5), key
    for d in ("x_to_y", "y_to_x"):
        assert 0 <= eight[f"{d}_r1"] <= eight[f"{d}_r5"] <= eight[f"{d}_r10"] <= 1
    assert 0 <= eight["alignment"] <= 4 and -4.0 * 2 <= eight["uniformity"] <= 0
    assert 0 <= eight["zero_shot"] <= 1


def test_simclr_pairs_are_two_views_and_identical_without_augmentation():
    """pair_embeddings of SimCLR: two augmented views (alignment > 0); with every augmentation
    at strength 0 the views are the input itself, so the pairs coincide (alignment 0)."""
    config, mesh, graphdef, state, _ = setup("simclr_mnist1d.py:quick")
    pairs = run_evaluation.pair_embeddings(graphdef, state, config, mesh, "test")
    assert pairs["x"].shape == pairs["y"].shape == (1000, 8) and pairs["label"].shape == (1000,)
    assert evaluation.alignment(pairs["x"], pairs["y"]) > 1e-3
    config = copy.deepcopy(config)
    for name in config.augment:
        if name != "kind":
            config.augment[name] = 0.0
    same = run_evaluation.pair_embeddings(graphdef, state, config, mesh, "test")
    assert evaluation.alignment(same["x"], same["y"]) == pytest.approx(0.0, abs=1e-10)


def test_positives_by_id_in_a_train_step():
    """loss.positive_ids names a batch feature: the CLIP config's caption ids make identical
    captions positives. The ids reach the loss (distinct ids give the loss without ids; the
    real ids, with duplicates, a smaller one: more positives per row), the sharded (ring) step
    equals the single-device one, and a missing feature is a ConfigError naming the features."""
    from contrastive_jax.errors import ConfigError
    from contrastive_jax.training.methods import LossSettings

    config, mesh, _graphdef, state, step = setup("clip_mnist1d.py:quick")
    assert config.loss.positive_ids == "caption_id"
    batch = next(train_iterator(config.data, mesh))
    ids = np.asarray(batch["caption_id"])
    assert len(np.unique(ids)) < len(ids)  # the batch holds identical captions
    _, metrics = step(jax.tree.map(jnp.copy, state), batch)
    distinct = dict(batch, caption_id=jax.device_put(np.arange(len(ids), dtype=ids.dtype),
                                                     batch["caption_id"].sharding))
    _, distinct_metrics = step(jax.tree.map(jnp.copy, state), distinct)
    _, _, _, state0, no_ids = setup("clip_mnist1d.py:quick", positive_ids="")
    _, plain_metrics = no_ids(state0, batch)
    assert float(distinct_metrics["loss"]) == pytest.approx(float(plain_metrics["loss"]),
                                                            rel=1e-6)
    assert float(metrics["loss"]) < float(plain_metrics["loss"]) - 1e-3
    assert float(metrics["top1"]) >= float(plain_metrics["top1"])  # ties with a twin are right
    _, _, _, state2, ring = setup("clip_mnist1d.py:quick", strategy="ring")
    _, ring_metrics = ring(state2, batch)
    assert float(ring_metrics["loss"]) == pytest.approx(float(metrics["loss"]), rel=1e-5)
    assert "mi_bound" not in metrics  # log N - L is not the bound with several positives
    assert "mi_bound" in plain_metrics
    with pytest.raises(ConfigError, match=r"'captions' is not a feature of the batch.*caption_id"):
        LossSettings(name="clip", positive_ids="captions").ids(batch)
    with pytest.raises(ValueError, match="positive_ids does not apply to moco"):
        LossSettings(name="moco", positive_ids="label")
    with pytest.raises(ValueError, match="siglip runs with impl"):
        LossSettings(name="siglip", impl="dense_vjp")
    LossSettings(name="siglip", strategy="ring", positive_ids="label")


def test_simclr_with_class_positives():
    """SimCLR with loss.positive_ids = "label" (every view of the same class is a positive,
    SupCon-style): more positives per anchor, so a smaller loss on the same batch and state;
    no MI bound is reported."""
    config, mesh, _, state, plain = setup("simclr_mnist1d.py:quick")
    _, _, _, state_ids, by_label = setup("simclr_mnist1d.py:quick", positive_ids="label")
    batch = next(train_iterator(config.data, mesh))
    _, plain_metrics = plain(jax.tree.map(jnp.copy, state), batch)
    _, metrics = by_label(state_ids, batch)
    assert float(metrics["loss"]) < float(plain_metrics["loss"]) - 1e-2
    assert float(metrics["top1"]) >= float(plain_metrics["top1"])
    assert "mi_bound" not in metrics and "mi_bound" in plain_metrics
