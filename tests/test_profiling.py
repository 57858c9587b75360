"""config.profile: a jax.profiler trace of the chosen steps, and only those, in workdir/profile
(contrastive_jax/training/run/profiling.py); the settings are checked; a resume traces what is
left of the window; a gs:// workdir gets the trace through the bucket's client."""

import functools
import gzip
import json
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from etils import epath

from contrastive_jax.errors import ConfigError
from contrastive_jax.training import train
from contrastive_jax.training.config import base_config
from contrastive_jax.training.run import profiling
from contrastive_jax.training.run.profiling import ProfileWindow, StepProfiler, profile_window
from contrastive_jax.training.run.workdir.config_record import (
    ADDED_FIELDS,
    check_config,
    upgrade,
    write_config,
)

sys.path.insert(0, str(Path(__file__).parent))
from test_reliability import quick
from test_remote_paths import BUCKET, _objects, gcs  # noqa: F401 (gcs: the fixture)
from trained_workdirs import simclr_quick_workdir


def _traces(folder) -> list[Path]:
    """The ``.xplane.pb`` files under ``folder`` (the layout TensorBoard / XProf read)."""
    return sorted(Path(folder).glob("plugins/profile/*/*.xplane.pb"))


def _executions(folder, module: str) -> int:
    """How many times the device ran the jitted program ``module`` (``jit_NAME``) in the trace
    under ``folder``: the distinct ``run_id`` of its device ops (the exporter's
    ``trace.json.gz`` beside the ``.xplane.pb``)."""
    [events] = Path(folder).glob("plugins/profile/*/*.trace.json.gz")
    runs = {e["args"]["run_id"] for e in json.loads(gzip.decompress(events.read_bytes()))[
        "traceEvents"] if e.get("args", {}).get("hlo_module") == module}
    return len(runs)


def test_the_settings_are_checked_and_default_to_off():
    assert base_config().profile.to_dict() == profiling.DEFAULTS == ADDED_FIELDS[("profile",)]
    assert profile_window(base_config().profile, 100) is None  # off
    assert profile_window(None, 100) is None  # a config without the block
    assert profile_window({"start_step": 10, "num_steps": 5}, 100) == ProfileWindow(10, 5)
    assert profile_window({"start_step": 96, "num_steps": 5, "all_hosts": True}, 100) == \
        ProfileWindow(96, 5, True)
    bad = [({"start_step": -1, "num_steps": 5}, r"profile\.start_step must be an integer >= 0"),
           ({"start_step": 2, "num_steps": 1.5}, r"profile\.num_steps must be an integer"),
           ({"start_step": True, "num_steps": 1}, r"profile\.start_step must be an integer"),
           ({"start_step": 0, "num_steps": 5}, r"profile\.num_steps=5 needs profile\.start_step"),
           ({"start_step": 10, "num_steps": 0}, r"profile\.start_step=10 traces nothing.*set "
                                                r"profile\.num_steps > 0"),
           ({"start_step": 97, "num_steps": 5}, r"profile steps 97\.\.101 end past the run's "
                                                r"last step 100: set profile\.start_step \+ "
                                                r"profile\.num_steps <= 101"),
           ({"start_step": 1, "num_steps": 1, "all_hosts": "yes"}, r"profile\.all_hosts must"),
           ({"start": 1, "num_steps": 1}, r"unknown profile setting\(s\) \['start'\]")]
    for settings, message in bad:
        with pytest.raises(ConfigError, match=message):
            profile_window(settings, 100)


def test_the_profile_may_change_on_a_resume_and_old_records_resume(tmp_path):
    """``profile`` is in MAY_CHANGE, and a record written before the block existed reads as
    profiling off (ADDED_FIELDS)."""
    config = quick(total_steps=6, checkpoint_every=3)
    write_config(config, tmp_path)
    config.profile.update({"start_step": 4, "num_steps": 2})
    assert check_config(config, tmp_path, resuming_from=3) == []
    old = json.loads((tmp_path / "config.json").read_text())
    del old["profile"]
    assert upgrade(old)["profile"] == profiling.DEFAULTS
    (tmp_path / "config.json").write_text(json.dumps(old))
    assert check_config(config, tmp_path, resuming_from=3) == []


def _run_steps(profiler: StepProfiler, steps, step_fn, x):
    with profiler:
        for step in steps:
            profiler.before_step(step)
            y = step_fn(x)
            profiler.after_step(step, y)


def _toy_step():
    def toy_step(x, scale):
        return jnp.tanh(x @ x.T).sum() * scale

    step_fn = jax.jit(functools.partial(toy_step, scale=2.0))
    x = jnp.ones((32, 32))
    step_fn(x).block_until_ready()  # compiled before any trace
    return step_fn, x


def test_only_the_window_is_traced_and_a_resume_traces_what_is_left(tmp_path):
    step_fn, x = _toy_step()
    lines = []
    window = ProfileWindow(3, 2)
    _run_steps(StepProfiler(window, tmp_path / "a", 1, lines.append), range(1, 7), step_fn, x)
    folder = tmp_path / "a" / "profile" / "process_0"
    [trace] = _traces(folder)
    assert trace.stat().st_size > 0 and b"toy_step" in trace.read_bytes()
    assert _executions(folder, "jit_toy_step") == 2  # steps 3 and 4 of 1..6
    assert lines == [f"profile: tracing steps 3..4 into {folder}",
                     f"profile: the trace of steps 3..4 is in {folder}"]
    # a run resumed inside the window: the rest of it; past it: nothing, and it says so
    _run_steps(StepProfiler(window, tmp_path / "b", 4, lines.append), range(4, 7), step_fn, x)
    assert _executions(tmp_path / "b" / "profile" / "process_0", "jit_toy_step") == 1
    lines.clear()
    _run_steps(StepProfiler(window, tmp_path / "c", 5, lines.append), range(5, 7), step_fn, x)
    assert not (tmp_path / "c").exists()
    assert lines == ["profile: steps 3..4 come before this run's first step 5 (resumed): "
                     "nothing traced"]


def test_process_zero_traces_unless_all_hosts_and_a_stop_writes_what_was_traced(tmp_path):
    step_fn, x = _toy_step()
    window = ProfileWindow(2, 3)
    _run_steps(StepProfiler(window, tmp_path / "w", 1, process_index=1), range(1, 6), step_fn,
               x)
    assert not (tmp_path / "w").exists()  # process 1 traces only with all_hosts
    every = ProfileWindow(2, 3, all_hosts=True)
    _run_steps(StepProfiler(every, tmp_path / "w", 1, process_index=1), range(1, 6), step_fn, x)
    assert len(_traces(tmp_path / "w" / "profile" / "process_1")) == 1
    # an error inside the window: the steps traced so far are written, the error goes on
    lines = []
    with pytest.raises(KeyboardInterrupt):
        with StepProfiler(window, tmp_path / "x", 1, lines.append) as profiler:
            for step in range(1, 6):
                profiler.before_step(step)
                profiler.after_step(step, step_fn(x))
                if step == 3:
                    raise KeyboardInterrupt
    assert _executions(tmp_path / "x" / "profile" / "process_0", "jit_toy_step") == 2
    assert lines[-1].startswith("profile: the trace of steps 2..3 is in")
    # a loop left inside the window (the trainer's stop on a signal): the same
    lines.clear()
    _run_steps(StepProfiler(window, tmp_path / "y", 1, lines.append), range(1, 4), step_fn, x)
    assert _executions(tmp_path / "y" / "profile" / "process_0", "jit_toy_step") == 2
    assert lines[-1].startswith("profile: the trace of steps 2..3 is in")


def test_a_gs_workdir_gets_the_trace_in_the_bucket(gcs, tmp_path, monkeypatch):  # noqa: F811
    step_fn, x = _toy_step()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the local copy: removed
    workdir = f"gs://{BUCKET}/profiled"
    _run_steps(StepProfiler(ProfileWindow(1, 2), workdir, 1), range(1, 4), step_fn, x)
    [trace] = [o for o in _objects("profiled") if o.endswith(".xplane.pb")]
    assert trace.startswith("profile/process_0/plugins/profile/")
    assert b"toy_step" in (epath.Path(workdir) / trace).read_bytes()
    assert list(tmp_path.iterdir()) == []


def test_a_run_writes_the_trace_of_its_window_into_the_workdir(tmp_path, capsys):
    """The trainer (a resume from step 6 to 9, so its step is a program the suite compiled):
    steps 8 and 9 traced, the train step's device work in the trace, nothing of step 7."""
    simclr_quick_workdir(tmp_path)
    config = quick(total_steps=9, checkpoint_every=3)
    config.profile.update({"start_step": 8, "num_steps": 2})
    train.train_and_evaluate(config, str(tmp_path))
    folder = tmp_path / "profile" / "process_0"
    [trace] = _traces(folder)
    assert trace.stat().st_size > 0 and b"train_step" in trace.read_bytes()
    assert _executions(folder, "jit_train_step") == 2
    out = capsys.readouterr().out
    assert f"profile: tracing steps 8..9 into {folder}" in out
    assert f"profile: the trace of steps 8..9 is in {folder}" in out
    # a bad window stops the run before it trains, naming the setting
    config.total_steps = 12
    config.profile.update({"start_step": 12, "num_steps": 2})
    with pytest.raises(ConfigError, match=r"profile steps 12\.\.13 end past the run's last "
                                          r"step 12"):
        train.train_and_evaluate(config, str(tmp_path))
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["3", "6", "9"]
