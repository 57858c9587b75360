"""The mixed-precision experiment script: its table, and the script end to end in quick mode."""

import importlib.util
import pathlib
import sys

import pytest

from common.reporting import read_csv, read_report, summarise

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def precision():
    module = "experiments_precision_ablation"
    spec = importlib.util.spec_from_file_location(
        module, ROOT / "experiments" / "precision_ablation.py")
    script = importlib.util.module_from_spec(spec)
    sys.modules[module] = script  # dataclasses look their module up while the class is made
    spec.loader.exec_module(script)
    return script


def test_table_compares_each_setting_with_float32(precision):
    rows = [{"setting": s.label, "dtype": s.dtype, "remat": s.remat, "seed": seed,
             "status": "ok", "linear_probe": probe, "knn": 0.9, "loss": 4.0, "train_s": 20.0}
            for s, probes in zip(precision.settings(remat=True),
                                 ((0.95, 0.97), (0.94, 0.94), (0.92, 0.93)), strict=True)
            for seed, probe in enumerate(probes)]
    summary = summarise(rows, precision.SETTING_KEYS, ("linear_probe", "knn", "loss", "train_s"))
    table = precision.results_table(summary)
    assert "| float32 | 2 (0) | 96.0 ± 1.4 | 90.0 ± 0.0 | +0.0 | yes |" in table
    assert "| bfloat16 | 2 (0) | 94.0 ± 0.0 | 90.0 ± 0.0 | -2.0 | no |" in table
    assert "| bfloat16 + remat | 2 (0) | 92.5 ± 0.7 | 90.0 ± 0.0 | -3.5 | no |" in table
    config = precision.make_config(precision.Setting("bfloat16", True), 1, quick=True)
    assert (config.model.dtype, config.model.remat, config.seed) == ("bfloat16", True, 1)


def test_precision_script_quick(precision, tmp_path):
    out = tmp_path / "precision"
    assert precision.main(["--quick", "--out", str(out)]) == 0
    rows = read_csv(out.with_suffix(".csv"))
    assert [(r["setting"], r["dtype"], r["remat"]) for r in rows] == [
        ("float32", "float32", "False"), ("bfloat16", "bfloat16", "False")]
    for row in rows:
        assert row["status"] == "ok" and row["steps"] == "6" and row["skipped_steps"] == "0"
        assert 0.0 <= float(row["linear_probe"]) <= 1.0 and 0.0 <= float(row["knn"]) <= 1.0
    # the bfloat16 run computed something else than the float32 one
    assert rows[0]["loss"] != rows[1]["loss"]
    title, produced, [table] = read_report(out.with_suffix(".md"))
    assert title == "Mixed precision (SimCLR, MNIST-1D)"
    assert "2 settings × seeds 0 = 2 runs of the quick variant (6 steps of batch 64)" in produced
    delta = 100 * (float(rows[1]["linear_probe"]) - float(rows[0]["linear_probe"]))
    assert table[1]["probe - float32 (points)"] == f"{delta:+.1f}"
    assert out.with_suffix(".png").stat().st_size > 10_000
