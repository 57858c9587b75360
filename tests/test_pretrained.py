"""model.init_from: exact loads from a converted directory and from a trainer workdir, clear
errors for mismatches, and a run initialised from a converted directory that checkpoints,
resumes (without reading init_from again) and ends where an uninterrupted run ends."""

import json
import pathlib
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from test_train import load_config
from trained_workdirs import simclr_quick_config, simclr_quick_workdir

from contrastive_jax.errors import ConfigError
from contrastive_jax.mesh import make_mesh
from contrastive_jax.training.data import train_iterator
from contrastive_jax.training.methods import method_for
from contrastive_jax.training.models import build_model
from contrastive_jax.training.parameter_paths import path_name
from contrastive_jax.training.run import checkpoints
from contrastive_jax.training.run.init_from import load_into
from contrastive_jax.training.step.train_state import create_state
from contrastive_jax.training.train import train_and_evaluate


def by_path(tree) -> dict[str, np.ndarray]:
    return {path_name(p): np.asarray(leaf) for p, leaf in
            jax.tree_util.tree_leaves_with_path(tree)}


def assert_bit_identical(got: dict, want: dict):
    assert sorted(got) == sorted(want)
    for path in want:
        assert got[path].dtype == want[path].dtype, path
        assert got[path].tobytes() == want[path].tobytes(), path


def write_converted(out, model_config: dict, seed: int) -> dict[str, np.ndarray]:
    """The interface of the converters: OUT/model.json and OUT/params (StandardCheckpointer of
    nnx.to_pure_dict of the nnx.Param state); returns the saved leaves by path."""
    model = build_model(model_config, nnx.Rngs(seed))
    params = nnx.split(model, nnx.Param, ...)[1]
    out.mkdir(parents=True, exist_ok=True)
    (out / "model.json").write_text(json.dumps(model_config))
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(out / "params", nnx.to_pure_dict(params))
    checkpointer.wait_until_finished()
    return by_path(params)


def clip_quick():
    config = load_config("clip_mnist1d.py:quick")
    config.evaluation.enabled = False
    return config


def fresh(config, seed=1):
    config.seed = seed
    return create_state(config, 10, method_for(config))


def test_a_converted_directory_loads_bit_identically(tmp_path):
    """The whole model from a converted directory (another seed's parameters): every leaf
    bit-identical to the saved one; the BatchNorm statistics are not in it, so a target with
    BatchNorm is refused; a sub-tree (the text tower) loads alone."""
    config = clip_quick()
    saved = write_converted(tmp_path / "clip", config.model.to_dict(), seed=7)
    _, state, _ = fresh(config)
    with pytest.raises(ConfigError, match="BatchNorm"):  # the signal CNN has BatchNorm
        load_into(state.params, state.rest, config.model, {"path": str(tmp_path / "clip")})
    config.model.sample_encoder = {"name": "mlp", "in_features": 40, "hidden": 16,
                                   "features": 16}
    saved = write_converted(tmp_path / "mlp_clip", config.model.to_dict(), seed=7)
    _, state, _ = fresh(config)
    assert by_path(state.params)["text_proj/kernel"].tobytes() != saved[
        "text_proj/kernel"].tobytes()
    params, _, messages = load_into(state.params, state.rest, config.model,
                                    {"path": str(tmp_path / "mlp_clip")})
    assert_bit_identical(by_path(params), saved)
    assert "converted checkpoint" in messages[0]
    params, _, _ = load_into(state.params, state.rest, config.model, (
        {"path": str(tmp_path / "mlp_clip"), "source": "text_encoder",
         "target": "text_encoder"},))
    got, before = by_path(params), by_path(state.params)
    for path in got:
        want = saved[path] if path.startswith("text_encoder/") else before[path]
        assert got[path].tobytes() == want.tobytes(), path


def test_mismatches_say_which_leaf_or_setting(tmp_path):
    config = clip_quick()
    config.model.sample_encoder = {"name": "mlp", "in_features": 40, "hidden": 16,
                                   "features": 16}
    write_converted(tmp_path / "c", config.model.to_dict(), seed=7)
    _, state, _ = fresh(config)
    path = str(tmp_path / "c")

    def load(init_from, model=config.model):
        return load_into(state.params, state.rest, model, init_from)

    other = config.model.to_dict()
    other["text_encoder"] = {**other["text_encoder"], "width": 8}
    with pytest.raises(ConfigError, match=r"differ at 'text_encoder.width': 16 in "
                                          r".* vs 8 here"):
        load({"path": path}, other)
    with pytest.raises(ConfigError, match=r"the parameter 'text_encoder/out/bias' of this "
                                          r"model has no counterpart 'text_proj/bias'"):
        load({"path": path, "source": "text_proj", "target": "text_encoder/out"})
    write_converted(tmp_path / "narrow", other, seed=7)  # (not config blocks: shapes decide)
    with pytest.raises(ConfigError, match=r"'text_encoder/norm/bias' has shape \(16,\) here "
                                          r"but \(8,\)"):
        load({"path": str(tmp_path / "narrow"), "source": "text_encoder/norm",
              "target": "text_encoder/norm"})
    with pytest.raises(ConfigError, match="not a subtree of this model"):
        load({"path": path, "source": "text_encoder", "target": "image_tower"})
    # a default written out equals one left out (the converters write every setting)...
    explicit = config.model.to_dict()
    explicit["text_projection"] = "linear"
    explicit["text_encoder"] = {**explicit["text_encoder"], "layer_norm_eps": 1e-6}
    load({"path": path}, explicit)
    # ... and a setting other than the default is a difference
    explicit["text_encoder"]["layer_norm_eps"] = 1e-5
    with pytest.raises(ConfigError, match=r"differ at 'text_encoder.layer_norm_eps': 1e-06 "
                                          r"in .* vs 1e-05 here"):
        load({"path": path}, explicit)
    with pytest.raises(ConfigError, match="neither a converted checkpoint"):
        load({"path": str(tmp_path / "nothing")})
    with pytest.raises(ConfigError, match="unknown keys"):
        load({"path": path, "from": "x"})
    with jax.enable_x64(True):  # float64 stored, float32 model: not exact
        big = jax.tree.map(lambda a: np.asarray(a, np.float64), state.params)
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(tmp_path / "d" / "params", nnx.to_pure_dict(big))
        checkpointer.wait_until_finished()
    (tmp_path / "d" / "model.json").write_text(json.dumps(config.model.to_dict()))
    with pytest.raises(ConfigError, match=r"float64 in .* which float32 cannot hold exactly"):
        load({"path": str(tmp_path / "d")})


def test_a_trainer_workdir_loads_its_encoder_and_batch_norm_statistics(tmp_path):
    """SimCLR's quick run, then the LiT config's signal tower from its workdir: parameters
    and BatchNorm statistics bit-identical to the workdir's last checkpoint (read back with
    the trainer's own restore); the LiT run keeps them bit-identical (frozen); another
    encoder block (pooling) is refused; without pretrained the config names the command."""
    simclr = simclr_quick_config()
    simclr_quick_workdir(tmp_path / "simclr")  # its run, trained once per process, copied
    mesh = make_mesh({"data": 8})
    _, template, _ = create_state(simclr, 6, method_for(simclr))
    manager = checkpoints.manager(tmp_path / "simclr", every=3, keep=3)
    saved, step = checkpoints.restore_latest(manager, template,
                                             train_iterator(simclr.data, mesh))
    manager.close()
    assert step == 6
    want = {k: v for k, v in by_path((saved.params, saved.rest)).items()}
    want = {f"{k.split('/', 1)[0]}/sample_encoder/{k.split('/', 2)[2]}": v
            for k, v in want.items() if k.split("/")[1] == "encoder"}

    lit = load_config(f"lit_mnist1d.py:pretrained={tmp_path / 'simclr'},quick")
    lit.evaluation.enabled = False
    _, state, _ = fresh(lit)
    params, rest, _ = load_into(state.params, state.rest, lit.model, lit.model.init_from)
    got = {k: v for k, v in by_path((params, rest)).items() if "/sample_encoder/" in k}
    assert any("/norms/0/mean" in k for k in got)
    assert_bit_identical(got, want)

    train_and_evaluate(lit, str(tmp_path / "lit"))
    manager = checkpoints.manager(tmp_path / "lit", every=3, keep=3)
    _, template, _ = create_state(lit, 6, method_for(lit))
    trained, _ = checkpoints.restore_latest(manager, template, train_iterator(lit.data, mesh))
    manager.close()
    got = {k: v for k, v in by_path((trained.params, trained.rest)).items()
           if "/sample_encoder/" in k}
    assert_bit_identical(got, want)

    flat = load_config(f"lit_mnist1d.py:pretrained={tmp_path / 'simclr'},quick")
    flat.model.sample_encoder.pool = "flatten"
    _, state, _ = fresh(flat)
    with pytest.raises(ConfigError, match=r"differ at 'pool': 'mean' in .* vs 'flatten'"):
        load_into(state.params, state.rest, flat.model, flat.model.init_from)
    with pytest.raises(ConfigError, match=r"configs/simclr_mnist1d\.py:quick --workdir"):
        load_config("lit_mnist1d.py:quick")


def test_a_workdir_with_a_damaged_newest_checkpoint_gives_the_previous_one(tmp_path):
    """init_from falls back as a resume does, without touching the other run's files: step 6
    not matching its checksums, or unreadable, step 3 is loaded with a warning; none readable
    is a ConfigError naming each."""
    simclr_quick_workdir(tmp_path / "simclr")  # checkpoints 1, 3 and 6
    def damage(step):
        for path in (tmp_path / "simclr" / "checkpoints" / str(step) / "state").rglob("*"):
            if path.is_file() and path.stat().st_size > 0:
                path.write_bytes(b"\0" * 7)

    lit = load_config(f"lit_mnist1d.py:pretrained={tmp_path / 'simclr'},quick")
    _, state, _ = fresh(lit)
    # step 6 reads, but not as saved: its arrays differ from its checksums (here its record
    # is step 3's, as if its bytes had changed): passed over as the trainer's resume would
    record = tmp_path / "simclr" / "checkpoints" / "{}" / "checksums" / "metadata"
    own = pathlib.Path(str(record).format(6)).read_text()
    pathlib.Path(str(record).format(6)).write_text(pathlib.Path(str(record).format(3)).read_text())
    _, _, messages = load_into(state.params, state.rest, lit.model, lit.model.init_from)
    assert messages[0] == (f"warning: model.init_from {tmp_path / 'simclr'}: step 6: it does not "
                           "match the checksums recorded when it was saved (damaged files); "
                           "using an earlier one"), messages
    assert "(step 3)" in messages[1], messages
    pathlib.Path(str(record).format(6)).write_text(own)
    damage(6)
    _, _, messages = load_into(state.params, state.rest, lit.model, lit.model.init_from)
    assert messages[0].startswith(f"warning: model.init_from {tmp_path / 'simclr'}: step 6 "
                                  "cannot be read ("), messages
    assert messages[1].endswith(f"the workdir checkpoint {tmp_path / 'simclr'} (step 3), "
                                "'encoder'"), messages
    assert (tmp_path / "simclr" / "checkpoints" / "6").exists()  # left where it was
    damage(3)
    damage(1)
    with pytest.raises(ConfigError, match=r"none of its checkpoints \(steps \[1, 3, 6\]\) can "
                                          r"be used: step 6 cannot be read .*; step 3 cannot be "
                                          r"read .*; step 1 cannot be read"):
        load_into(state.params, state.rest, lit.model, lit.model.init_from)


def test_a_run_from_a_converted_directory_resumes_without_reading_it_again(tmp_path,
                                                                           capsys):
    """A run whose (locked) text tower is initialised from a converted directory, 6 steps
    checkpointed at 3 and 6; with checkpoint 6 and the directory deleted, the rerun resumes
    from its own step-3 checkpoint (reading nothing from init_from) and ends bit-identical to
    the first run (results.json's digest), and differs from a run without init_from."""
    config = clip_quick()
    write_converted(tmp_path / "c", config.model.to_dict(), seed=7)
    config.model.init_from = {"path": str(tmp_path / "c"), "source": "text_encoder",
                              "target": "text_encoder"}
    config.model.frozen = "text_encoder"
    config.checkpoint_every = 3

    def run(workdir, steps, model_config=config.model):
        c = config.copy_and_resolve_references()
        c.model, c.total_steps = model_config, steps
        return train_and_evaluate(c, str(tmp_path / workdir))

    whole = run("run", 6)
    assert "initialised text_encoder from the converted checkpoint" in capsys.readouterr().out
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "6")  # back to step 3
    (tmp_path / "run" / "results.json").unlink()
    shutil.rmtree(tmp_path / "c")  # a resume must not read it
    resumed = run("run", 6)
    assert resumed["resumed_from"] == 3
    assert resumed["params_sha256"] == whole["params_sha256"]
    scratch = config.model.to_dict()
    del scratch["init_from"]
    assert run("scratch", 6, scratch)["params_sha256"] != whole["params_sha256"]
