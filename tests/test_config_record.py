"""workdir/config.json records the resolved config; a resume with another config stops with the
differences unless accepted; the run's length, logging and evaluation may change."""

import json
import math
import sys
from pathlib import Path

import pytest

from contrastive_jax.errors import ConfigError
from contrastive_jax.training import train
from contrastive_jax.training.run.workdir.config_record import (
    changes,
    check_config,
    flatten,
    plain,
)

sys.path.insert(0, str(Path(__file__).parent))
from test_reliability import command, quick, run_command_lines
from test_train import load_config
from trained_workdirs import simclr_quick_workdir


def test_plain_flatten_and_changes():
    config = {"loss": {"max_scale": math.inf, "temperature": 0.2}, "sizes": (1, 2),
              "evaluation": {"every": 5}, "empty": {}}
    record = plain(config)
    assert record == {"loss": {"max_scale": "inf", "temperature": 0.2}, "sizes": [1, 2],
                      "evaluation": {"every": 5}, "empty": {}}
    assert json.loads(json.dumps(record, allow_nan=False)) == record  # strict JSON
    assert flatten(record) == {"loss.max_scale": "inf", "loss.temperature": 0.2,
                               "sizes": [1, 2], "evaluation.every": 5, "empty": {}}
    other = plain({**config, "loss": {"max_scale": 100.0, "temperature": 0.2},
                   "evaluation": {"every": 50}, "total_steps": 9, "new": 1})
    # evaluation and total_steps may change; the scale and a new key may not
    assert changes(record, other) == [("loss.max_scale", "inf", 100.0),
                                      ("new", "<absent>", 1)]
    assert changes(record, record) == []


@pytest.mark.parametrize(("spec", "unwritten"), [
    ("simclr_mnist1d.py:quick", ("model.dtype", "model.remat")),
    ("mi_gaussian.py:quick", ("model.dtype", "model.remat")),
    ("clip_mnist1d.py:quick", ("model.dtype", "model.remat")),
    ("clip_vit_canvas.py:quick", ("model.dtype", "model.remat", "model.attention")),
    ("clip_vit_b16_pod.py:tiny", ("model.sample_encoder.patch_dropout",))])
def test_a_record_without_the_settings_configs_now_write_resumes(tmp_path, spec, unwritten):
    """The shipped configs write out ``model.dtype`` and ``model.remat`` (and ``attention``
    with a Transformer tower), the pod template its ViT's ``patch_dropout``, at the values a
    block without them runs with, so that the command line can set them: a workdir recorded
    before, without them (``unwritten``), resumes with today's config of the same run; another
    value is still a change, named."""
    config = load_config(spec)
    record = plain(config)
    for path in unwritten:
        *blocks, key = path.split(".")
        block = record
        for name in blocks:
            block = block[name]
        del block[key]
    (tmp_path / "config.json").write_text(json.dumps(record))
    assert check_config(config, tmp_path, resuming_from=6) == []
    if "model.dtype" in unwritten:
        config.model.dtype = "bfloat16"
        with pytest.raises(ConfigError, match=r"Differences: model\.dtype: 'float32' -> "
                                              r"'bfloat16'\."):
            check_config(config, tmp_path, resuming_from=6)
    else:
        config.model.sample_encoder.patch_dropout = 0.5
        assert check_config(config, tmp_path, resuming_from=6, accept_change=True) == [
            ("model.sample_encoder.patch_dropout", 0.0, 0.5)]


def test_resume_with_another_config_stops_unless_accepted(tmp_path, capsys):
    simclr_quick_workdir(tmp_path)  # trained once per process, copied
    recorded = json.loads((tmp_path / "config.json").read_text())
    assert recorded == plain(quick(total_steps=6, checkpoint_every=3))
    assert recorded["loss"]["temperature"] == 0.2 and recorded["total_steps"] == 6

    changed = quick(total_steps=12, checkpoint_every=3)  # the suite's 12-step program
    changed.seed = 1  # settings outside the compiled step: no compile of its own
    changed.data.seed = 2
    with pytest.raises(ConfigError, match=r"another config.*data\.seed: 0 -> 2; "
                                          r"seed: 0 -> 1\. .*--accept_config_change"):
        train.train_and_evaluate(changed, str(tmp_path))
    assert json.loads((tmp_path / "config.json").read_text()) == recorded  # untouched
    # a longer run (total_steps) and other evaluation settings are not a different run
    longer = quick(total_steps=9, checkpoint_every=3)
    longer.evaluation.every = 2
    assert train.train_and_evaluate(longer, str(tmp_path))["resumed_from"] == 6
    capsys.readouterr()
    accepted = train.train_and_evaluate(changed, str(tmp_path), accept_config_change=True)
    assert accepted["resumed_from"] == 9
    assert "config changed at step 9" in capsys.readouterr().out
    assert json.loads((tmp_path / "config.json").read_text())["data"]["seed"] == 2
    old = json.loads((tmp_path / "config-before-step-9.json").read_text())
    assert old["data"]["seed"] == 0 and old["total_steps"] == 9


def test_cli_config_drift_exits_2_and_the_flag_accepts_it(tmp_path):
    """The three command lines in turn, one forked child each of one interpreter
    (tests/forked_command_lines.py: the exit status and stderr of ``python -m
    contrastive_jax.main``, one import of the trainer). A change outside the compiled step
    (the seed), and the lengths of test_train's and test_storage_errors' command lines: their
    compiled programs."""
    base = command(tmp_path, "--config.checkpoint_every=2")[3:]
    first, drift, ok = run_command_lines([
        [*base, "--config.total_steps=4"],
        [*base, "--config.total_steps=6", "--config.seed=1"],
        [*base, "--config.total_steps=6", "--config.seed=1", "--accept_config_change"]])
    assert first.returncode == 0, first.stderr[-2000:]
    assert drift.returncode == 2 and "Traceback" not in drift.stderr
    assert "another config" in drift.stderr and "seed: 0 -> 1" in drift.stderr, drift.stderr
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert json.loads((tmp_path / "results.json").read_text())["resumed_from"] == 4


def test_a_finished_run_run_again_keeps_its_results(tmp_path, capsys):
    """The second run of a finished workdir changes nothing: results.json keeps its training
    time and evaluation history (it used to write train_time_s 0 and drop the history)."""
    config = quick(total_steps=6, checkpoint_every=3)
    config.evaluation.enabled = True
    config.evaluation.every = 3
    first = train.train_and_evaluate(config, str(tmp_path))
    assert [e["step"] for e in first["evaluations"]] == [3, 6]
    capsys.readouterr()
    again = train.train_and_evaluate(config, str(tmp_path))
    assert "already finished: step 6 of 6" in capsys.readouterr().out
    assert again == json.loads((tmp_path / "results.json").read_text()) == json.loads(
        json.dumps(first))
    # a longer run keeps the evaluations of the steps it resumes after
    config.total_steps = 9
    longer = train.train_and_evaluate(config, str(tmp_path))
    assert longer["resumed_from"] == 6
    assert [e["step"] for e in longer["evaluations"]] == [3, 6, 9]
    assert longer["evaluations"][0] == json.loads(json.dumps(first["evaluations"][0]))
