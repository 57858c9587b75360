"""Progress lines: metrics averaged over the logging window, status lines while compiling and
evaluating, per-method console metrics; where the command line's compilation cache is (that
it fills it: tests/test_checkpoint_compat.py)."""

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from contrastive_jax.training import train
from contrastive_jax.training.run.compilation_cache import compilation_cache_dir
from contrastive_jax.training.run.progress import MetricWindow

sys.path.insert(0, str(Path(__file__).parent))
from test_reliability import quick
from trained_workdirs import simclr_quick_config, simclr_quick_workdir


def test_metric_window_means_and_last_values():
    window = MetricWindow()
    for i in range(1, 4):
        window.add({"loss": np.float32(i), "top1": np.float32(0.5 * i),
                    "skipped_in_a_row": np.int32(i), "learning_rate": np.float32(10 * i)})
    assert window.count == 3
    assert window.mean() == {"loss": 2.0, "top1": 1.0, "skipped_in_a_row": 3.0,
                             "learning_rate": 30.0}  # counters and the rate: the last step's
    assert window.count == 0
    window.add({"loss": np.float32(np.nan), "top1": np.float32(1.0),
                "skipped_in_a_row": np.int32(1), "learning_rate": np.float32(1.0)})
    assert math.isnan(window.mean()["loss"])  # a non-finite step shows in its window


def _train_records(workdir):
    lines = (Path(workdir) / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["prefix"] == "train"]


def test_logged_metrics_are_window_means_of_every_step(tmp_path, capsys):
    capsys.readouterr()
    every_step = train.train_and_evaluate(quick(total_steps=6, log_every=1),
                                          str(tmp_path / "each"))
    out = capsys.readouterr().out
    # the same run logging every 2 steps (trained once per process, copied)
    assert simclr_quick_config().log_every == 2
    simclr_quick_workdir(tmp_path / "window")
    each = {r["step"]: r for r in _train_records(tmp_path / "each")}
    window = _train_records(tmp_path / "window")
    assert [r["step"] for r in window] == [2, 4, 6]
    for record in window:
        steps = range(record["step"] - 1, record["step"] + 1)
        for key in ("loss", "top1", "grad_norm", "mi_bound"):
            assert record[key] == pytest.approx(np.mean([each[s][key] for s in steps]),
                                                rel=1e-5), key
        assert record["learning_rate"] == pytest.approx(each[record["step"]]["learning_rate"])
    assert every_step["final_train_metrics"]["loss"] == pytest.approx(each[6]["loss"])
    # status lines around the silent parts
    assert "compiling the train step (fresh state" in out and "compiled and ran step 1 in" in out


def test_compilation_cache_location():
    assert compilation_cache_dir({"CONTRASTIVE_JAX_COMPILATION_CACHE": "/c"}) == "/c"
    for off in ("off", "", "0"):
        assert compilation_cache_dir({"CONTRASTIVE_JAX_COMPILATION_CACHE": off}) is None
    assert compilation_cache_dir({"XDG_CACHE_HOME": "/x"}) == (
        "/x/contrastive_jax/jax_compilation_cache")

def test_the_cache_keeps_programs_of_over_a_second_unless_jax_is_told_otherwise(monkeypatch,
                                                                                tmp_path):
    import jax

    from contrastive_jax.training.run.compilation_cache import (
        MIN_COMPILE_TIME_ENV,
        enable_compilation_cache,
    )

    saved = {name: getattr(jax.config, name) for name in (
        "jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")}
    monkeypatch.setenv("CONTRASTIVE_JAX_COMPILATION_CACHE", str(tmp_path))
    try:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.25)
        monkeypatch.delenv(MIN_COMPILE_TIME_ENV, raising=False)
        enable_compilation_cache()
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 1.0
        assert jax.config.jax_compilation_cache_dir == str(tmp_path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.25)
        monkeypatch.setenv(MIN_COMPILE_TIME_ENV, "0")  # JAX read it at import: left as it is
        enable_compilation_cache()
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.25
    finally:
        for name, value in saved.items():
            jax.config.update(name, value)


# That the command line fills its compilation cache: tests/test_checkpoint_compat.py, whose
# command line (compiled as a user's run is) writes into a cache folder of its own.
