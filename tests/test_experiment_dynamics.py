"""The training-dynamics experiments in their quick modes: norm growth and the effective learning
rate (docs/derivations.md §12.3, §12.4), the learned temperature with and without the clip
(§7.5-7.6), and the
gradient-check script's CSV and figure."""

import importlib.util
import itertools
import math
import pathlib

import numpy as np
import pytest

from common.reporting import read_csv, read_report

ROOT = pathlib.Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_script",
                                                  ROOT / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(path: pathlib.Path) -> list[dict]:
    return read_csv(path)  # past the provenance line


def _png(path: pathlib.Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG and len(data) > 10_000, path


def test_norm_growth_helpers():
    ng = _script("norm_growth")
    rng = np.random.default_rng(0)
    w = rng.normal(size=50)
    # derivations §12.1: scale only
    assert ng.angular_step(w, 3.0 * w) == pytest.approx(0.0, abs=1e-15)
    e0, e1 = np.eye(3)[0], np.eye(3)[1]
    assert ng.angular_step(e0, 7.0 * e1) == pytest.approx(math.sqrt(2.0), rel=1e-15)
    assert ng.effective_lr(2e-3, 10_000, 4.0) == pytest.approx(2e-3 * 100 / 4.0, rel=1e-15)
    assert ng.is_scale_invariant(("encoder", "convs", 0, "kernel"))
    assert ng.is_scale_invariant(("head", "hidden", 0, "kernel"))
    for names in (("encoder", "out", "kernel"), ("head", "out", "kernel"),
                  ("encoder", "norms", 0, "scale"), ("encoder", "convs", 0, "bias")):
        assert not ng.is_scale_invariant(names), names


def test_norm_growth_quick(tmp_path):
    ng = _script("norm_growth")
    out = tmp_path / "norm_growth"
    # the dot-product run (the cosine run is the quick main job, trained by test_train.py)
    assert ng.main(["--quick", "--runs", "dot", "--out", str(out)]) == 0
    rows = _rows(out.with_suffix(".csv"))
    assert list(rows[0]) == ["run", "normalize", "temperature", "weight_decay", "step",
                             "learning_rate", "loss", "top1", "embedding_norm", "weight_norm",
                             "n_params", "effective_lr", "angular_step"]  # quick: no evaluation
    assert [r["run"] for r in rows] == ["dot"] * 8
    assert [int(r["step"]) for r in rows] == list(range(1, 9))
    config = ng.load_config("configs/simclr_mnist1d.py:quick").model
    widths = (1, *config.encoder.channels)
    convs = sum(k * a * b for k, (a, b) in zip(config.encoder.kernel_sizes,
                                                itertools.pairwise(widths), strict=True))
    hidden = config.encoder.features * config.head.hidden  # head: Linear (no bias) -> BN
    for r in rows:
        lr, n, norm = float(r["learning_rate"]), int(r["n_params"]), float(r["weight_norm"])
        assert n == convs + hidden == 680
        assert 0 < norm < 1e3 and 0 < float(r["embedding_norm"]) < 1e3
        assert float(r["effective_lr"]) == pytest.approx(lr * math.sqrt(n) / norm, rel=1e-12)
        step = float(r["angular_step"])
        if int(r["step"]) == 1:  # warmup starts at lr 0: the weights do not move
            assert lr == 0.0 and step == 0.0
        else:  # Adam turns W by the RMS of its normalised update times lr sqrt(n)/||W||
            assert 0.1 * float(r["effective_lr"]) < step < 1.5 * float(r["effective_lr"]), r
    assert {(r["normalize"], r["temperature"], r["weight_decay"]) for r in rows} == {
        ("False", "1.0", "0.1")}
    _png(out.with_suffix(".png"))
    _, produced, [table] = read_report(out.with_suffix(".md"))  # measurements only
    assert "8 steps" in produced and "n = 680 scale-invariant weights" in produced
    [row] = table
    first, last = rows[0], rows[-1]
    assert row["run"] == "dot product / tau 1, wd 0.1"
    assert row["‖z‖ first → last"] == (f"{float(first['embedding_norm']):.3g} → "
                                       f"{float(last['embedding_norm']):.3g}")
    # dot-product logits at tau 1: the logit scale is the mean norm squared (derivations §12.4)
    assert row["logit scale first → last"] == (f"{float(first['embedding_norm']) ** 2:.3g} → "
                                               f"{float(last['embedding_norm']) ** 2:.3g}")
    ratio = float(row["ratio"])
    assert 0.1 < ratio < 1.5  # as the per-step bounds above
    assert (row["linear probe"], row["kNN"]) == ("–", "–")  # quick: no evaluation


def test_learned_temperature_quick_clip_binds(tmp_path):
    lt = _script("learned_temperature")
    out = tmp_path / "learned_temperature"
    assert lt.main(["--quick", "--out", str(out)]) == 0
    rows = _rows(out.with_suffix(".csv"))
    clip = [r for r in rows if r["run"] == "identical_clip"]
    free = [r for r in rows if r["run"] == "identical_no_clip"]
    assert len(clip) == len(free) == 8 and len(rows) == 16
    t_clip = [float(r["log_scale"]) for r in clip]
    t_free = [float(r["log_scale"]) for r in free]
    # derivations §7.5: identical views, every positive wins, dl/dt < 0: t climbs in both runs ...
    assert t_free[0] == t_clip[0] == pytest.approx(math.log(1 / 0.2), abs=1e-6)
    assert all(b > a for a, b in itertools.pairwise(t_free))
    assert np.mean([float(r["top1"]) for r in rows]) > 0.95
    # ... the unclipped one past log 100, the clipped one never above it (clamped there)
    assert max(t_free) > math.log(100) + 1.0
    assert max(t_clip) <= math.log(100) + 1e-6
    assert t_clip[-1] == pytest.approx(math.log(100), abs=1e-6)
    # identical until the clip binds
    below = [i for i, t in enumerate(t_free) if t < math.log(100)]
    assert len(below) >= 2 and all(t_clip[i] == t_free[i] for i in below)
    for r in rows:
        assert float(r["temperature"]) == pytest.approx(math.exp(-float(r["log_scale"])),
                                                        rel=1e-12)
        assert math.isfinite(float(r["loss"])) and "linear_probe" not in r
    # the sharper unclipped softmax has the lower loss on these easy positives
    assert float(free[-1]["loss"]) < float(clip[-1]["loss"])
    _png(out.with_suffix(".png"))
    _, produced, [table] = read_report(out.with_suffix(".md"))  # measurements only
    assert "t starts at log(1 / 0.2) = 1.609, log 100 = 4.605" in produced
    assert [(r["run"], r["temperature_lr"], r["max_scale"]) for r in table] == [
        ("identical_clip", "1.5", "100"), ("identical_no_clip", "1.5", "inf")]
    clipped, unclipped = table
    assert clipped["t final (s = e^t)"] == "4.605 (100)"  # held at the clip
    assert float(unclipped["max t"]) == pytest.approx(max(t_free), abs=1e-3)
    # both pass log 100 at the same recorded step: the runs agree until the clip binds
    reached = next(int(r["step"]) for r in free if float(r["log_scale"]) >= math.log(100))
    assert clipped["first step t ≥ log 100"] == unclipped["first step t ≥ log 100"] == str(
        reached)


def test_gradcheck_script_writes_csv_and_png(tmp_path, monkeypatch):
    from contrastive_jax.analytic import gradcheck

    monkeypatch.setattr(gradcheck, "CHECKS", gradcheck.CHECKS[:3])
    script = _script("gradcheck")
    out = tmp_path / "gradcheck"
    assert script.main(["--quick", "--out", str(out)]) == 0
    rows = _rows(out.with_suffix(".csv"))
    assert [r["formula"] for r in rows] == [c.name for c in gradcheck.CHECKS]
    assert [r["source"] for r in rows] == [c.source for c in gradcheck.CHECKS]
    table = [line for line in out.with_suffix(".md").read_text().splitlines()
             if line.startswith("| ") and "source" not in line and "---" not in line]
    for row, line in zip(rows, table, strict=True):
        f32, f64 = float(row["float32"]), float(row["float64"])
        assert f64 < 1e-10 and f32 < 1e-5
        assert line.endswith(f"| {f32:.2e} | {f64:.2e} |")
    _png(out.with_suffix(".png"))
