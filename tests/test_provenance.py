"""provenance(): date, commit (or "not a checkout", and a dirty tree marked), versions and devices,
never an exception; the trainer's results.json and the experiments' CSV and markdown carry it."""

import datetime
import importlib.metadata
import json
import platform
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from common import reporting
from contrastive_jax.training.run import provenance as provenance_module
from contrastive_jax.training.run.provenance import (
    NOT_A_CHECKOUT,
    git_state,
    provenance,
    provenance_line,
)

sys.path.insert(0, str(Path(__file__).parent))
from trained_workdirs import simclr_quick_workdir

KEYS = ["date_utc", "commit", "dirty", "python", "jax", "jaxlib", "flax", "optax",
        "device_kind", "device_count", "process_count"]


def _git(folder: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          cwd=folder, check=True, capture_output=True, text=True).stdout.strip()


def test_the_record_holds_versions_devices_and_the_date():
    record = provenance()
    assert list(record) == KEYS
    assert json.loads(json.dumps(record, allow_nan=False)) == record  # plain JSON
    assert record["python"] == platform.python_version()
    assert (record["jax"], record["jaxlib"]) == (jax.__version__, importlib.metadata.version(
        "jaxlib"))
    assert record["flax"] == importlib.metadata.version("flax")
    assert record["optax"] == importlib.metadata.version("optax")
    assert (record["device_kind"], record["device_count"], record["process_count"]) == (
        "cpu", 8, 1)  # tests/conftest.py's 8 CPU devices
    date = datetime.datetime.fromisoformat(record["date_utc"].replace("Z", "+00:00"))
    assert record["date_utc"].endswith("Z") and date.utcoffset() == datetime.timedelta(0)
    assert (record["commit"], record["dirty"]) == git_state()


def test_the_commit_of_a_checkout_and_its_dirty_tree(tmp_path):
    repo = tmp_path / "repo"
    package = repo / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("x = 1\n")
    _git(repo, "init", "-q")
    assert git_state(package) == (NOT_A_CHECKOUT, None)  # the package is not tracked yet
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "first")
    head = _git(repo, "rev-parse", "HEAD")
    assert git_state(package) == (head, False)
    (repo / "results.md").write_text("numbers\n")  # a result file: not the code
    assert git_state(package) == (head, False)
    (repo / "new_module.py").write_text("y = 2\n")  # new code
    assert git_state(package) == (head, True)
    (repo / "new_module.py").unlink()
    (package / "__init__.py").write_text("x = 2\n")  # changed code
    assert git_state(package) == (head, True)
    assert git_state(tmp_path) == (NOT_A_CHECKOUT, None)  # no repository
    assert git_state(tmp_path / "missing") == (NOT_A_CHECKOUT, None)


def test_no_git_no_devices_no_exception(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no git command
    assert git_state() == (NOT_A_CHECKOUT, None)

    def no_backend():
        raise RuntimeError("no backend")

    monkeypatch.setattr(jax, "devices", no_backend)
    record = provenance()
    assert (record["commit"], record["dirty"]) == (NOT_A_CHECKOUT, None)
    assert record["device_kind"] == "unknown (RuntimeError)"
    assert record["device_count"] is None and record["process_count"] is None
    assert "not a checkout, Python" in provenance_line(record)


def test_the_line():
    record = {"date_utc": "2026-12-02T18:20:31Z", "commit": "0123456789abcdef" * 2 + "01234567",
              "dirty": True, "python": "3.11.7", "jax": "0.10.2", "jaxlib": "0.10.2",
              "flax": "0.12.8", "optax": "0.2.8", "device_kind": "TPU v5 lite",
              "device_count": 16, "process_count": 4}
    assert provenance_line(record) == (
        "Provenance: 2026-12-02T18:20:31Z, commit 0123456789ab + local changes (.py), Python "
        "3.11.7, jax 0.10.2, jaxlib 0.10.2, flax 0.12.8, optax 0.2.8, 16 x TPU v5 lite, 4 "
        "processes.")
    record.update(dirty=False, process_count=1)
    assert "commit 0123456789ab, Python" in provenance_line(record)
    assert provenance_line(record).endswith(", 16 x TPU v5 lite, 1 process.")
    assert provenance_module.provenance_line().startswith("Provenance: ")


def test_results_json_records_the_provenance(tmp_path):
    simclr_quick_workdir(tmp_path)  # trained once per process, copied
    record = json.loads((tmp_path / "results.json").read_text())["provenance"]
    assert list(record) == KEYS
    assert (record["commit"], record["device_count"], record["jax"]) == (
        git_state()[0], 8, jax.__version__)


def test_the_reports_csv_and_markdown_carry_the_provenance(tmp_path):
    rows = [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.25}]
    md = reporting.report(tmp_path / "x", rows, title="T", produced="how", tables=[
        reporting.markdown_table(["a"], [[1]])], figure=None)
    record = reporting.csv_provenance(tmp_path / "x.csv")
    assert list(record) == KEYS and record["commit"] == git_state()[0]
    assert reporting.read_csv(tmp_path / "x.csv") == [{"step": "1", "loss": "0.5"},
                                                      {"step": "2", "loss": "0.25"}]
    lines = md.read_text().splitlines()
    assert lines[:5] == ["# T", "", provenance_line(record), "", "how"]  # the same record
    assert reporting.read_report(md) == ("T", "how", [[{"a": "1"}]])
    # a report without the line is refused (every report names where it came from)
    md.write_text("\n".join(lines[:2] + lines[4:]) + "\n")
    with pytest.raises(ValueError, match="Provenance"):
        reporting.read_report(md)
    (tmp_path / "y.csv").write_text("step,loss\n1,0.5\n")
    with pytest.raises(ValueError, match="no '# provenance:' first line"):
        reporting.csv_provenance(tmp_path / "y.csv")


def _provenance_header(text: str, title: str) -> None:
    """``text`` (a benchmark's markdown) opens with ``# title``, a blank line and the line of
    this process's record."""
    first, blank, line = text.splitlines()[:3]
    assert (first, blank) == (f"# {title}", "")
    assert line.startswith("Provenance: ") and line.endswith(", 8 x cpu, 1 process.")
    assert f"commit {git_state()[0][:12]}" in line or NOT_A_CHECKOUT in line


def test_the_benchmark_tables_are_headed_by_the_provenance(tmp_path, monkeypatch):
    """Each benchmark's writer (its measurements replaced by fixed rows, except the sharded
    benchmark's: one tiny ring step on the 8 devices); loss_bench: tests/test_loss_bench.py."""
    import accumulation_bench
    import image_input_bench
    import input_bench
    import sharded_bench

    monkeypatch.setattr(accumulation_bench, "measure", lambda batch, k, runs: {
        "K": k, "micro": batch // k, "temp_mb": 10.0 / k, "time_s": 1.0, "loss": 2.0})
    accumulation_bench.main(["--batch", "8", "--steps", "1", "2", "--runs", "1",
                             "--out", str(tmp_path / "accumulation.md")])
    _provenance_header((tmp_path / "accumulation.md").read_text(),
                       "Gradient accumulation: memory and time of one CLIP step")

    out = tmp_path / "sharded.md"
    sharded_bench.main(["--devices", "8", "--flat-devices", "8", "--sizes", "64", "--d", "8",
                        "--block", "8", "--runs", "1", "--losses", "clip", "--strategies",
                        "ring", "--flat-rows", "8", "--out", str(out)])
    _provenance_header(out.read_text(), "Sharded-loss benchmark")

    monkeypatch.setattr(input_bench, "RESULTS", tmp_path)
    monkeypatch.setattr(input_bench, "measure", lambda *args: 1000.0)
    monkeypatch.setattr("contrastive_jax.training.data.prepare", lambda name: None)
    monkeypatch.setattr(sys, "argv", ["input_bench.py", "--threads", "0"])
    input_bench.main()
    _provenance_header((tmp_path / "input_bench.md").read_text(), "Input pipeline: examples/s "
                       "of one process (batch 512, 40 batches, reader alone)")

    facts = {"images": 4, "kb_min": 1.0, "kb_median": 2.0, "kb_max": 3.0}
    monkeypatch.setattr(image_input_bench, "prepared", lambda data_dir, images: ("x", facts))
    monkeypatch.setattr("contrastive_jax.training.data.sources.open_split",
                        lambda *args, **kwargs: None)
    monkeypatch.setattr(image_input_bench, "measure", lambda *args, **kwargs: {
        "images_per_s": 100.0, "cpu_s": 1.0, "images_per_cpu_s": 50.0, "bytes_per_image": 1,
        "put_ms": 1.0, "dtype": "uint8"})
    monkeypatch.setattr(sys, "argv", ["image_input_bench.py", "--part", "clip",
                                      "--data_dir", str(tmp_path),
                                      "--output", str(tmp_path / "image.md")])
    image_input_bench.main()
    _provenance_header((tmp_path / "image.md").read_text(),
                       "Image input: 224 x 224 training batches from JPEG shards")
