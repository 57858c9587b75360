"""The JSON a run writes is strict (no bare NaN) and results.json is replaced atomically."""

import json
import math
import os

import numpy as np
import pytest

from contrastive_jax.training.run.progress import Progress
from contrastive_jax.training.run.workdir import json_output


def _strict_loads(text: str):
    def refuse(name):
        raise ValueError(f"non-strict JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


def test_non_finite_values_become_null():
    value = {"loss": float("nan"), "scale": np.float32(np.inf), "ok": np.float64(1.5),
             "steps": np.int32(3), "history": [{"knn": -math.inf}, (1.0, float("nan"))]}
    text = json_output.dumps(value)
    assert "NaN" not in text and "Infinity" not in text
    assert _strict_loads(text) == {"loss": None, "scale": None, "ok": 1.5, "steps": 3,
                                   "history": [{"knn": None}, [1.0, None]]}


def test_write_atomic_replaces_or_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    json_output.write_atomic(path, {"step": 1, "loss": float("nan")})
    assert _strict_loads(path.read_text()) == {"step": 1, "loss": None}

    def crash(fd):  # a kill between writing the temporary file and the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(KeyboardInterrupt):
        json_output.write_atomic(path, {"step": 2})
    assert _strict_loads(path.read_text()) == {"step": 1, "loss": None}  # untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]  # no temporary left


def test_metrics_lines_are_strict_json(tmp_path):
    progress = Progress(tmp_path, total_steps=4, global_batch=8, every=1)
    progress.log_train(1, {"loss": np.float32(np.nan), "top1": 0.5})
    progress.close()
    (line,) = (tmp_path / "metrics.jsonl").read_text().splitlines()
    record = _strict_loads(line)
    assert record["loss"] is None and record["top1"] == 0.5 and record["step"] == 1


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_written_files_follow_the_umask(tmp_path, umask):
    """results.json and config.json are created as open() creates files (0666 less the umask),
    so a workdir shared by a group stays readable; a temporary file's 0600 would not be."""
    old = os.umask(umask)
    try:
        json_output.write_atomic(tmp_path / "results.json", {"step": 1})
        json_output.write_atomic(tmp_path / "results.json", {"step": 2})  # replaced: same mode
    finally:
        os.umask(old)
    assert (tmp_path / "results.json").stat().st_mode & 0o777 == 0o666 & ~umask
