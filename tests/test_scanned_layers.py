"""Scanned layers (``model.<tower>.scan``): the unrolled towers' function, in one ``lax.scan``.

One seed gives the same parameters in both layouts (the scanned ones stacked, row ``i`` block
``i``); a whole CLIP train step (dropout, patch dropout, remat, exact accumulation over 2
micro-batches, FSDP over 8 devices, AdamW) gives the same loss, parameters and AdamW moments
(so the same gradients) in float64 to 1e-12, and with bfloat16 compute the same loss and
gradients to bfloat16's rounding; FSDP never splits the layer axis and splits every stacked
leaf as its block's leaf; the compiled program does not grow with depth; checkpoints restore
into the other layout bit for bit (including one written before scanned layers existed,
``fixtures/workdir_v0_2_unrolled_clip``, which the command line resumes scanned), and a
checkpoint of another depth says what to set; ``init_from`` and the converters take and give
either layout.
"""

import json
import pathlib
import shutil
import sys

import forked_command_lines
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax.errors import CheckpointError, ConfigError
from contrastive_jax.mesh import make_mesh
from contrastive_jax.training.config import base_config
from contrastive_jax.training.methods import method_for
from contrastive_jax.training.models import build_encoder, build_model, scanned_layers
from contrastive_jax.training.parameter_paths import leaves_by_path, path_name
from contrastive_jax.training.step import train_step
from contrastive_jax.training.step.state_sharding import state_shardings
from contrastive_jax.training.step.train_state import create_state

B = 16
VIT = {"name": "vit", "image_size": 8, "patch": 4, "in_channels": 1, "width": 16, "depth": 2,
       "heads": 2, "mlp_ratio": 2, "dropout": 0.2, "features": 16, "class_token": True,
       "pre_norm": True, "pool": "token", "patch_dropout": 0.5}
TEXT = {"name": "text_transformer", "vocab_size": 24, "max_tokens": 6, "width": 16, "depth": 2,
        "heads": 2, "mlp_ratio": 2, "dropout": 0.2, "features": 16, "causal": True}
FIXTURE = pathlib.Path(__file__).resolve().parent / "fixtures" / "workdir_v0_2_unrolled_clip"
REPO = pathlib.Path(__file__).resolve().parents[1]


def flat(tree) -> dict:
    return {path_name(p): np.asarray(v) for p, v in jax.tree_util.tree_leaves_with_path(tree)}


def model_config(scan: bool, **towers) -> dict:
    return {"name": "dual_encoder", "embed_dim": 8,
            "sample_encoder": {**VIT, "scan": scan, **towers.get("sample", {})},
            "text_encoder": {**TEXT, "scan": scan, **towers.get("text", {})}}


def test_one_seed_gives_the_same_parameters_in_either_layout():
    scanned = flat(nnx.state(build_model(model_config(True), nnx.Rngs(3)), nnx.Param))
    unrolled = flat(nnx.state(build_model(model_config(False), nnx.Rngs(3)), nnx.Param))
    assert scanned["sample_encoder/blocks/fc1/kernel"].shape == (2, 16, 32)
    assert unrolled["sample_encoder/blocks/1/fc1/kernel"].shape == (16, 32)
    assert scanned_layers.is_stacked("params/text_encoder/blocks/norm1/scale")
    assert not scanned_layers.is_stacked("params/text_encoder/blocks/1/norm1/scale")
    assert scanned_layers.layout_of(scanned) == {"sample_encoder/blocks": "scanned",
                                                 "text_encoder/blocks": "scanned"}
    assert scanned_layers.depths(unrolled) == scanned_layers.depths(scanned) == {
        "sample_encoder/blocks": 2, "text_encoder/blocks": 2}
    moved = scanned_layers.to_layout(unrolled, scanned)
    assert moved.keys() == scanned.keys()
    for name, value in scanned.items():  # the same draws, only stacked
        np.testing.assert_array_equal(moved[name], value, err_msg=name)
    back = scanned_layers.unrolled(scanned)
    assert back.keys() == unrolled.keys()
    assert all(np.array_equal(back[k], unrolled[k]) for k in unrolled)


def float64(tree):
    return jax.tree.map(lambda a: a.astype(jnp.float64)
                        if jnp.issubdtype(a.dtype, jnp.floating) else a, tree)


def step_config(scan: bool, dtype: str) -> ml_collections.ConfigDict:
    """Float32 (float64 in the test): remat, 2 micro-batches, FSDP; bfloat16: the plain step
    (half the program to compile; its arithmetic is the point there)."""
    config = base_config()
    config.data = {"batch_size": B}
    config.input_key, config.text_key = "image", "caption"
    config.model = {**model_config(scan), "remat": dtype == "float32", "dtype": dtype}
    config.loss = {"name": "clip"}
    config.method = "clip"
    config.accumulation_steps = 2 if dtype == "float32" else 1
    if dtype == "float32":
        config.sharding = {"params": "fsdp", "min_size": 0}  # every leaf split where it divides
    config.optimizer = {"name": "adamw", "learning_rate": 0.05, "warmup_steps": 0,
                        "weight_decay": 1e-2}
    return config


def one_step(scan: bool, dtype: str):
    """``(state before, state after, metrics)`` of one jitted train step on 8 devices (FSDP),
    float64 parameters for ``dtype="float32"`` compute, float32 with bfloat16 compute."""
    config = step_config(scan, dtype)
    mesh = make_mesh({"data": 8})
    method = method_for(config)
    graphdef, state, tx = create_state(config, 10, method)
    if dtype == "float32":
        state = float64(state)
    ctx = train_step.make_context(config, mesh, graphdef, method)
    rng = np.random.default_rng(1)
    tokens = rng.integers(1, 24, (B, 6))
    tokens[:, 4:] *= rng.integers(0, 2, (B, 1))
    batch = jax.device_put({"image": rng.uniform(0, 1, (B, 8, 8, 1)),
                            "caption": tokens.astype(np.int32)}, NamedSharding(mesh, P("data")))
    state = jax.device_put(state, state_shardings(config.sharding, mesh, state))
    step = jax.jit(lambda s, b: train_step.train_step(
        s, b, graphdef=graphdef, tx=tx, method=method, ctx=ctx,
        accumulation_steps=config.accumulation_steps))
    new, metrics = step(state, batch)
    return state, new, jax.device_get(metrics)


def relative(got: dict, want: dict) -> float:
    """The largest ``|got - want| / max |want|`` over the leaves (each against its own scale,
    or 1e-3 of the tree's for a leaf near zero)."""
    scale = max(float(np.abs(w).max()) for w in want.values())
    return max(float(np.abs(np.subtract(got[k], w, dtype=np.float64)).max())
               / max(float(np.abs(w).max()), 1e-3 * scale) for k, w in want.items())


def test_scanned_train_step_equals_unrolled_in_float64():
    """Dropout drawn (the masks fold in each block's index), remat inside the scan, K = 2
    exact micro-batches, FSDP on 8 devices, AdamW: the loss, the updated parameters and both
    AdamW moments (``mu = (1 - b1) g``: the gradients) equal leaf by leaf to 1e-12.

    The attention's key biases are compared by their gradient only: it is zero by symmetry
    (``q . b_k`` shifts every logit of a query's row, which the softmax ignores), so both
    layouts hold rounding noise there, which AdamW's ``g / sqrt(g^2)`` turns into an update
    of either sign."""
    with jax.enable_x64(True):
        before, scanned, m_scanned = one_step(True, "float32")
        _, unrolled, m_unrolled = one_step(False, "float32")
        got = flat((scanned.params, scanned.opt_state))
        want = scanned_layers.to_layout(flat((unrolled.params, unrolled.opt_state)), got)
    assert got.keys() == want.keys()
    assert all(v.dtype == np.float64 for k, v in got.items() if "count" not in k)
    moved = flat(jax.tree.map(lambda a, b: a - b, scanned.params, before.params))
    assert min(float(np.abs(v).max()) for v in moved.values()) > 0  # every leaf moved
    mu = {k: v for k, v in got.items() if "/mu/" in k}
    scale = max(float(np.abs(v).max()) for v in mu.values())
    key_bias = [k for k in got if k.endswith("attention/key/bias")]
    assert len(key_bias) == 6  # params, mu, nu of both towers
    for k in key_bias:
        if "/mu/" in k:  # zero up to rounding, in both layouts
            assert max(np.abs(got[k]).max(), np.abs(want[k]).max()) <= 1e-12 * scale
    assert relative({k: got[k] for k in got if k not in key_bias},
                    {k: want[k] for k in want if k not in key_bias}) <= 1e-12
    np.testing.assert_allclose(m_scanned["loss"], m_unrolled["loss"], rtol=1e-12)
    np.testing.assert_allclose(m_scanned["grad_norm"], m_unrolled["grad_norm"], rtol=1e-12)


def test_scanned_train_step_equals_unrolled_in_bfloat16_to_its_rounding():
    """The step with bfloat16 compute (float32 parameters; dropout drawn, no remat,
    accumulation or FSDP: the float64 test above has them): the loss and gradient norm to
    2e-2, every gradient (AdamW's ``mu``) to 5e-2 of the largest: bfloat16's 8-bit mantissa,
    not a different function."""
    _, scanned, m_scanned = one_step(True, "bfloat16")
    _, unrolled, m_unrolled = one_step(False, "bfloat16")
    got = {k: v for k, v in flat(scanned.opt_state).items() if "/mu/" in k}
    want = scanned_layers.to_layout(
        {k: v for k, v in flat(unrolled.opt_state).items() if "/mu/" in k}, got)
    scale = max(float(np.abs(v).max()) for v in want.values())
    assert max(float(np.abs(got[k] - want[k]).max()) for k in want) <= 5e-2 * scale
    np.testing.assert_allclose(m_scanned["loss"], m_unrolled["loss"], rtol=2e-2)
    np.testing.assert_allclose(m_scanned["grad_norm"], m_unrolled["grad_norm"], rtol=2e-2)


def test_fsdp_splits_stacked_leaves_as_their_blocks_never_on_the_layer_axis():
    mesh = make_mesh({"data": 8})
    shardings = {}
    for scan in (True, False):
        config = step_config(scan, "float32")
        shapes = jax.eval_shape(lambda config=config: create_state(
            config, 10, method_for(config))[1])
        shardings[scan] = {path_name(p): s.spec for p, s in jax.tree_util.tree_leaves_with_path(
            state_shardings(config.sharding, mesh, shapes))}
    stacked = {k: v for k, v in shardings[True].items() if scanned_layers.is_stacked(k)}
    assert len(stacked) > 20
    assert all(len(spec) == 0 or spec[0] is None for spec in stacked.values())
    for name, spec in stacked.items():  # as the unrolled layout splits each block's leaf
        stack, _, leaf = name.rpartition("blocks/")
        per_block = shardings[False][f"{stack}blocks/0/{leaf}"]
        assert tuple(spec)[1:] == tuple(per_block) + (None,) * (len(spec) - 1 - len(per_block))
    assert any("data" in tuple(spec) for spec in stacked.values())


def hlo_lines(depth: int, scan: bool) -> int:
    """Optimised HLO lines of the gradient of a small remat'd ViT."""
    model = build_encoder({**VIT, "depth": depth, "scan": scan, "dropout": 0.0,
                           "patch_dropout": 0.0}, nnx.Rngs(0),
                          remat_policy="nothing_saveable")
    graphdef, state = nnx.split(model)

    def loss(state, x):
        return nnx.merge(graphdef, state)(x, train=True).sum()

    x = jax.ShapeDtypeStruct((2, 8, 8, 1), jnp.float32)
    return len(jax.jit(jax.grad(loss)).lower(state, x).compile().as_text().splitlines())


def test_the_scanned_program_does_not_grow_with_depth():
    """Depth 2 and 6 (a scan of one block XLA may simplify into another program, so depth 1
    is not compared; in one suite run its line count differed by 2.2%): the scanned program
    stays within 2% (here equal), the unrolled one more than doubles."""
    scanned = [hlo_lines(d, True) for d in (2, 6)]
    unrolled = [hlo_lines(d, False) for d in (2, 6)]
    assert abs(scanned[1] - scanned[0]) <= 0.02 * scanned[0], scanned
    assert unrolled[1] > 2 * unrolled[0], unrolled


def test_a_tower_without_blocks_refuses_scan_and_scan_must_be_a_bool():
    with pytest.raises(ConfigError, match="encoder 'resnet' has no Transformer blocks to scan; "
                                          "remove its 'scan' setting"):
        build_encoder({"name": "resnet", "in_channels": 1, "widths": (4,), "scan": True},
                      nnx.Rngs(0))
    with pytest.raises(ConfigError, match=r"scan must be True .* or False"):
        build_encoder({**TEXT, "scan": "yes"}, nnx.Rngs(0))


# ------------------------------------------------------------------------------ checkpoints
def fixture_config(**overrides) -> ml_collections.ConfigDict:
    from test_train import load_config

    config = load_config("clip_mnist1d.py:quick")
    config.total_steps, config.checkpoint_every = 6, 3
    config.evaluation.enabled = False
    config.model.text_encoder.depth = 2
    for key, value in overrides.items():
        config.model.text_encoder[key] = value
    return config


def restored(config, workdir) -> tuple:
    from contrastive_jax.training import train
    from contrastive_jax.training.run import checkpoints

    run, template = train.prepare_run(config, workdir)
    manager = checkpoints.manager(workdir, every=3, keep=5)
    try:
        return checkpoints.restore_latest(manager, template, run.stream)
    finally:
        manager.close()


def test_an_unrolled_checkpoint_restores_into_the_scanned_layout_and_back(tmp_path):
    """The fixture (written before scanned layers) restored into today's default (scanned)
    and into scan=False: the same arrays, stacked; saved again scanned, it restores unrolled
    bit for bit."""
    from contrastive_jax.training.run import checkpoints

    workdir = tmp_path / "run"
    shutil.copytree(FIXTURE, workdir, ignore=shutil.ignore_patterns("expected.json"))
    scanned, step = restored(fixture_config(), workdir)
    unrolled, _ = restored(fixture_config(scan=False), workdir)
    assert step == 3
    s, u = flat(scanned), flat(unrolled)
    assert "params/text_encoder/blocks/fc1/kernel" in s and \
        "params/text_encoder/blocks/1/fc1/kernel" in u
    moved = scanned_layers.to_layout(u, s)
    assert moved.keys() == s.keys()
    assert all(np.array_equal(moved[k], s[k]) for k in s)
    again = tmp_path / "scanned"
    manager = checkpoints.manager(again, every=1, keep=2)
    from contrastive_jax.training import train

    run, _ = train.prepare_run(fixture_config(), again)
    checkpoints.save(manager, 3, scanned, run.stream, force=True)
    manager.wait_until_finished()
    manager.close()
    back, _ = restored(fixture_config(scan=False), again)
    assert all(np.array_equal(v, u[k]) for k, v in flat(back).items())
    with pytest.raises(CheckpointError, match=r"hold 2 Transformer blocks in "
                       r"text_encoder/blocks but this config builds 3: set "
                       r"model.text_encoder.depth = 2"):
        restored(fixture_config(depth=3), workdir)


def test_a_template_placed_by_device_put_restores_the_other_layout_and_nothing_sound_is_set_aside(
        tmp_path, monkeypatch):
    """restore_latest is a library function: a template placed with a plain
    ``jax.device_put`` (one device, not the trainer's named shardings) takes the unrolled
    fixture into the scanned layout, the same arrays as the trainer's template gets (it raised
    inside the restore, and a second, older checkpoint would have been resumed with the sound
    one moved aside as damaged). And a sound checkpoint whose restore into the template fails
    for any reason is never moved aside: with an older one restorable, the restore stops
    naming it, nothing moved."""
    from contrastive_jax.training import train
    from contrastive_jax.training.run import checkpoints

    workdir = tmp_path / "run"
    shutil.copytree(FIXTURE, workdir, ignore=shutil.ignore_patterns("expected.json"))
    sharded, _ = restored(fixture_config(), workdir)
    run, template = train.prepare_run(fixture_config(), workdir)
    placed = jax.device_put(jax.device_get(template))  # one device, no NamedSharding
    manager = checkpoints.manager(workdir, every=1, keep=5)
    state, step = checkpoints.restore_latest(manager, placed, run.stream)
    assert step == 3
    assert all(np.array_equal(v, flat(sharded)[k]) for k, v in flat(state).items())
    checkpoints.save(manager, 5, state, run.stream, force=True)  # a newer one, sound
    manager.wait_until_finished()
    real_restore = manager.restore

    def failing_restore(step, *args, **kwargs):
        if step == 5:
            raise RuntimeError("the template does not fit")
        return real_restore(step, *args, **kwargs)

    monkeypatch.setattr(manager, "restore", failing_restore)
    with pytest.raises(CheckpointError, match=r"checkpoint 5 in .* reads and matches its "
                       r"checksums, but restoring it into this run's state failed "
                       r"\(RuntimeError: the template does not fit\); nothing was moved"):
        checkpoints.restore_latest(manager, placed, run.stream, warn=lambda _: None)
    manager.close()
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["3", "5"]
    assert not (workdir / checkpoints.SET_ASIDE).exists()


def test_the_unrolled_fixture_resumes_scanned(tmp_path):
    """Resumed by today's command line in today's default layout (scanned: the checkpoint's
    unrolled blocks moved into it), the run ends at the loss the uninterrupted run of 0.2.0
    ended at, to float32 rounding (today's attention kernel, jax.nn's, and the scan round
    differently from 0.2.0's einsums, so the digest is not compared; the restore itself is
    exact: the test above)."""
    expected = json.loads((FIXTURE / "expected.json").read_text())
    workdir = tmp_path / "run"
    shutil.copytree(FIXTURE, workdir, ignore=shutil.ignore_patterns("expected.json"))
    command = [sys.executable, "-m", "contrastive_jax.main",
               "--config=configs/clip_mnist1d.py:quick", f"--workdir={workdir}",
               "--config.total_steps=6", "--config.checkpoint_every=3",
               "--config.evaluation.enabled=False", "--config.model.text_encoder.depth=2"]
    out = forked_command_lines.run(command)  # forked: no start-up of Python and its imports
    assert out.returncode == 0, out.stdout + out.stderr
    assert "resumed from step 3" in out.stdout
    results = json.loads((workdir / "results.json").read_text())
    assert results["resumed_from"] == 3
    np.testing.assert_allclose(results["final_train_metrics"]["loss"], expected["final_loss"],
                               rtol=1e-5)


def test_a_converted_directory_of_either_layout_loads_into_either_and_exports_the_same(
        tmp_path):
    """The open_clip fixture converted (today: scanned) and the same parameters saved in the
    unrolled layout, as a directory converted before scanned layers holds them (its model
    with patch dropout): each loads (``load_converted``) in its own model's layout,
    initialises a model of the other layout (``model.init_from``) with the same numbers, and
    exports to open_clip's state dict bit for bit."""
    from safetensors.numpy import load_file

    from contrastive_jax.training.models.converters import (
        clip_import,
        converted_directory,
        pretrained_source,
    )
    from contrastive_jax.training.models.converters.open_clip import export_files, tensor_layouts
    from contrastive_jax.training.run import init_from

    source = pathlib.Path(__file__).resolve().parent / "fixtures" / \
        "open_clip_tiny_quickgelu.safetensors"
    block, params = clip_import.convert_checkpoint(source, quick_gelu=True, vision_heads=2,
                                                   text_heads=2)
    unrolled_block = {**block, **{t: {**block[t], "scan": False}
                                  for t in ("sample_encoder", "text_encoder")}}
    # training-only settings travel with a block and change nothing here (FLIP's patch
    # dropout: a masked pre-training run's workdir initialises an unmasked model and back)
    unrolled_block["sample_encoder"]["patch_dropout"] = 0.5
    unrolled = tensor_layouts.in_model_layout(unrolled_block, params)
    assert 1 in unrolled["text_encoder"]["blocks"]
    assert leaves_by_path(params)["text_encoder/blocks/fc1/kernel"].shape[0] == 2
    for name, b, p in (("scanned", block, params), ("unrolled", unrolled_block, unrolled)):
        converted_directory.save_converted(tmp_path / name, b, p)
        loaded_block, loaded = pretrained_source.load_converted(tmp_path / name)
        assert leaves_by_path(loaded).keys() == \
            leaves_by_path(p).keys()
        export_files.export(tmp_path / f"{name}_open_clip", loaded_block, loaded)
        exported = load_file(tmp_path / f"{name}_open_clip" / "open_clip_model.safetensors")
        original = load_file(source)
        assert exported.keys() == original.keys()
        assert all(exported[k].tobytes() == original[k].tobytes() for k in original)
    for target, other in ((block, "unrolled"), (unrolled_block, "scanned")):
        _, fresh, rest = nnx.split(build_model(target, nnx.Rngs(0)), nnx.Param, ...)
        got, _, lines = init_from.load_into(fresh, rest, target,
                                            {"path": str(tmp_path / other)})
        want = leaves_by_path(params if target is block else unrolled)
        got = flat(got)
        assert got.keys() == want.keys() and lines
        assert all(np.array_equal(got[k], want[k]) for k in want)


def test_under_fsdp_the_scanned_step_keeps_the_batch_split():
    """The pod template's step (FSDP, remat, bf16) at depth 2, 8 devices, batch 64: the
    scanned step's temporaries are no more than the unrolled step's. Without the sharding
    constraint on the scan's carry (``batch_sharded``) XLA took the stacked parameters'
    split into the loop and replicated the batch: 2.3x here, 37x on 128 chips."""
    from test_train import load_config

    from contrastive_jax.plan import plan, planned

    mesh = make_mesh({"data": 8})
    temporaries = {}
    for scan in (True, False):
        config = load_config("clip_vit_b16_pod.py:tokenizer=x")
        config.data.batch_size = 64
        for tower in (config.model.sample_encoder, config.model.text_encoder):
            tower.update({"depth": 2, "scan": scan})
        temporaries[scan] = plan(planned(config, mesh)).temporaries
    assert temporaries[True] <= temporaries[False], temporaries
