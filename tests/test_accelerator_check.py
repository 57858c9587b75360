"""benchmarks/accelerator_check.py --smoke: the whole check end to end on one CPU device, with
TensorFlow, TFDS, grain, ml_collections and orbax unimportable in it and in every worker it
starts (a borrowed accelerator machine may have none of them)."""

import importlib
import json
import math
import os
import pathlib
import subprocess
import sys

from xla_environment import child_environment

ROOT = pathlib.Path(__file__).resolve().parents[1]
BANNED = ("tensorflow", "tensorflow_datasets", "grain", "ml_collections", "orbax")
# Python imports ``sitecustomize`` at start-up from the path; on PYTHONPATH it reaches every
# process the check starts. It records its own start (pid) and every blocked import.
SITECUSTOMIZE = '''
import importlib.abc
import os
import sys

_BANNED = frozenset(os.environ["BLOCKED_MODULES"].split(","))
_LOG = os.environ["BLOCKED_LOG"]
with open(os.environ["BLOCKER_STARTS"], "a") as _f:
    _f.write(f"{os.getpid()}\\n")


class _Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in _BANNED:
            with open(_LOG, "a") as log:
                log.write(f"{os.getpid()} {name}\\n")
            raise ImportError(f"{name} is blocked by tests/test_accelerator_check.py")
        return None


sys.meta_path.insert(0, _Blocker())
'''


def _impls(loss: str) -> tuple[str, ...]:
    """The impls a loss has (its module's IMPLS; MoCo's loss has none to choose)."""
    if loss == "moco":
        return ("autodiff",)
    return importlib.import_module(f"contrastive_jax.losses.{loss}").IMPLS


def _blocked_environment(tmp_path: pathlib.Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = child_environment()
    env.update({"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "JAX_PLATFORMS": "cpu",
                "BLOCKED_MODULES": ",".join(BANNED), "BLOCKED_LOG": str(tmp_path / "blocked"),
                "BLOCKER_STARTS": str(tmp_path / "starts")})
    return env


def test_smoke_run_writes_the_table_without_the_data_stack(tmp_path):
    """``--smoke`` exits 0 and writes the table: a row for every loss x impl with a
    float32-vs-float64 relative error < 1e-5, rows of (b) and (c) with numbers, provenance;
    no banned module was asked for, by the check or any of its workers."""
    env = _blocked_environment(tmp_path)
    probe = subprocess.run([sys.executable, "-c", "import grain"], env=env, capture_output=True,
                           text=True, timeout=60)
    assert probe.returncode != 0 and "blocked by tests/" in probe.stderr  # the block holds
    (tmp_path / "blocked").unlink()
    (tmp_path / "starts").unlink()

    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "benchmarks/accelerator_check.py", "--smoke", "--out",
                           str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    blocked = tmp_path / "blocked"
    assert not blocked.exists(), blocked.read_text()
    assert len(set((tmp_path / "starts").read_text().split())) >= 3  # the workers were blocked too
    for text in (done.stdout, done.stderr):
        assert "ModuleNotFoundError" not in text and "ImportError" not in text

    table = (out / "accelerator_check.md").read_text()
    assert "\nProvenance: " in table and "jax " in table and " x cpu" in table
    assert "Command: `PYTHONPATH=. python3 benchmarks/accelerator_check.py --smoke --out " in table
    raw = json.loads((out / "accelerator_check.json").read_text())
    assert raw["provenance"]["device_kind"] == "cpu"
    rows = raw["rows"]

    correctness = {(r["loss"], r["impl"], r["precision"]): r for r in rows if r["part"] == "a"}
    for loss in ("clip", "siglip", "nt_xent", "moco"):
        for impl in _impls(loss):
            row = correctness[loss, impl, "default"]  # smoke: the default precision only
            assert row["status"] == "ok", row
            for key in ("value_rel", "emb_grad_rel", "scalar_grad_rel"):
                assert math.isfinite(row[key]) and row[key] < 1e-5, (row, key)
            assert f"| {loss} | {impl} | default | " in table

    speed = {(r["loss"], r["impl"]): r for r in rows if r["part"] == "b"}
    assert set(speed) == {(loss, impl) for loss in ("clip", "siglip")
                          for impl in ("tiled", "textbook")}
    for (loss, impl), row in speed.items():
        assert row["status"] == "ok", row
        assert row["time_s"] > 0 and math.isfinite(row["value"])
        block = "16" if impl == "tiled" else "-"
        assert f"| {loss} | {impl} | 64 | {block} | ok | " in table

    steps = [r for r in rows if r["part"] == "c"]
    fitted = [r for r in steps if r["status"] == "ok"]
    assert {r["scan"] for r in fitted} == {True, False}  # scanned and unrolled blocks both ran
    for row in fitted:
        assert row["step_s"] > 0 and row["examples_per_s"] > 0 and row["compile_s"] > 0
        assert row["flops"] > 0 and row["mfu"] is None  # no peak FLOP/s for a CPU: "n/a"
        assert math.isfinite(row["loss"])
    cudnn = [r for r in steps if r["attention"] == "cudnn"]  # no GPU here: a ConfigError row
    assert cudnn and all(r["status"].startswith("error: ConfigError") for r in cudnn)
    for blocks in ("scan", "unrolled"):
        assert f"| {blocks} | xla | on | 16 | ok | " in table
