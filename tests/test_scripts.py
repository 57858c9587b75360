"""The user-facing scripts run end to end (in their quick modes)."""

import importlib.util
import pathlib

from common.reporting import read_csv, read_report
from contrastive_jax import demo
from contrastive_jax.analytic.gradcheck import CHECKS

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_demo_prints_every_loss(capsys):
    # the gradient table the demo prints next is the gradcheck script's, tested below
    assert demo.main(["--batch", "16", "--skip-gradcheck"]) == 0
    out = capsys.readouterr().out
    for name in ("clip_loss (impl=dense_vjp)", "nt_xent", "moco_infonce"):
        assert name in out


def test_gradcheck_script_writes_markdown(tmp_path, monkeypatch):
    # every check's numbers are tested in test_analytic.py; here the script's plumbing, on a
    # few checks (one row per check, float64 errors below 1e-10)
    from contrastive_jax.analytic import gradcheck

    monkeypatch.setattr(gradcheck, "CHECKS", CHECKS[:4])
    spec = importlib.util.spec_from_file_location("gradcheck_script",
                                                  ROOT / "experiments" / "gradcheck.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "gradcheck.md"
    assert script.main(["--quick", "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    table = [line for line in lines
             if line.startswith("| ") and "source" not in line and "---" not in line]
    assert len(table) == 4
    for line in table:
        f64 = float(line.rstrip(" |").split("|")[-1])
        assert f64 < 1e-10, line


def test_time_to_accuracy_script_quick(tmp_path):
    spec = importlib.util.spec_from_file_location("tta", ROOT / "experiments" /
                                                  "time_to_accuracy.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "tta"
    assert script.main(["--quick", "--seeds", "0", "--target", "0.0", "--out", str(out)]) == 0
    provenance, *rows = out.with_suffix(".csv").read_text().splitlines()
    assert provenance.startswith("# provenance: {")  # the record, then the table
    assert rows[0] == "seed,step,train_s,linear_probe,knn" and len(rows) == 3  # steps 3, 6
    assert len(read_csv(out.with_suffix(".csv"))) == 2
    _, produced, [table] = read_report(out.with_suffix(".md"))  # measurements only
    assert "seeds 0, evaluation every 3 steps" in produced
    seed, mean = table
    assert (seed["seed"], seed["steps"]) == ("0", "6")
    assert seed["train s to probe >= 0.00"] != "not reached"  # any probe reaches 0
    probe, knn = (f"{float(v):.4f}" for v in rows[-1].split(",")[3:])  # the last evaluation
    assert (seed["linear probe"], seed["kNN"]) == (probe, knn)  # is the final one
    assert mean["seed"] == "mean ± std"  # of one seed
    assert (mean["linear probe"], mean["kNN"]) == (f"{probe} ± 0.0000", f"{knn} ± 0.0000")
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
