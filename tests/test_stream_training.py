"""Training straight from shards (the pod template's ``stream=PATTERN`` variant at tiny size):
a run killed with SIGKILL at a random step and run again ends with the parameters of the
uninterrupted run, bit for bit: 1 process on local tars, 1 process on tars in a bucket (the
loopback GCS server of tests/test_remote_paths.py, which also shows the bucket's stream is the
local one), and 2 processes on local tars, both killed. Each run is forked by
tests/forked_command_lines.py's server."""

import json
import random
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import forked_command_lines
from test_convert_shards import good, write_tar
from test_distributed import _cli_process, _finish_all, _free_port
from test_reliability import load_chaos
from test_remote_paths import BUCKET, gcs  # noqa: F401 (the fixture)
from xla_environment import child_environment

STEPS, EVERY = 8, 2


def args(pattern: str, workdir) -> list[str]:
    """The trainer's arguments: the tiny pod template streaming ``pattern`` (a 12-word
    vocabulary for the captions, a shuffle buffer of 8 per reader)."""
    return [f"--config=configs/clip_vit_b16_pod.py:tiny,stream={pattern},steps={STEPS}",
            f"--workdir={workdir}", f"--config.checkpoint_every={EVERY}",
            "--config.log_every=1", "--config.data.preprocess.tokenizer.kind=words",
            "--config.data.shuffle_buffer=8"]


def digest(workdir) -> str:
    return json.loads((Path(workdir) / "results.json").read_text())["params_sha256"]


@pytest.fixture(scope="module")
def tars(tmp_path_factory) -> Path:
    """Four tars of 10 image-caption pairs (one member bad in each: no caption)."""
    folder = tmp_path_factory.mktemp("stream_tars")
    for s in range(4):
        members = [m for k in range(10) for m in good(f"s{s}k{k}", 10 * s + k,
                                                       size=(36 + 2 * k, 30))]
        write_tar(folder / f"{s:05d}.tar", [*members, ("bad.jpg", members[0][1])])
    return folder


@pytest.fixture(scope="module")
def reference(tars, tmp_path_factory) -> str:
    """The parameter digest of the uninterrupted 1-process run on the local tars."""
    workdir = tmp_path_factory.mktemp("stream_whole") / "run"
    cmd = [sys.executable, "-m", "contrastive_jax.main",
           *args(f"{tars}/{{00000..00003}}.tar", workdir)]
    run = forked_command_lines.run(cmd)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "input (process 0): skipped no caption" in run.stdout
    results = json.loads((workdir / "results.json").read_text())
    assert results["steps"] == STEPS and results["input"]["skipped"]["no caption"] >= 4
    return digest(workdir)


def _killed_once(pattern: str, workdir: Path) -> dict:
    chaos = load_chaos()
    cmd = [sys.executable, "-m", "contrastive_jax.main", *args(pattern, workdir)]
    # Random(5): the kill lands at step 4, after checkpoint 2 (a resume, not a fresh start)
    return chaos.run_with_kills(cmd, workdir, STEPS, 1, random.Random(5), child_environment(),
                                popen=forked_command_lines.popen)


def test_a_killed_stream_run_resumes_bit_identical(tars, reference, tmp_path):
    stats = _killed_once(f"{tars}/{{00000..00003}}.tar", tmp_path / "run")
    assert stats["kills"] == 1 and stats["resumes"] == 1, stats
    assert digest(tmp_path / "run") == reference


def test_a_killed_run_on_shards_in_a_bucket_resumes_to_the_local_parameters(gcs, tars,  # noqa: F811
                                                                           reference, tmp_path):
    import gcsfs

    fs = gcsfs.GCSFileSystem()
    for path in sorted(tars.glob("*.tar")):
        fs.put(str(path), f"{BUCKET}/stream/{path.name}")
    stats = _killed_once(f"gs://{BUCKET}/stream/{{00000..00003}}.tar", tmp_path / "run")
    assert stats["kills"] == 1 and stats["resumes"] == 1, stats
    assert digest(tmp_path / "run") == reference


def test_two_processes_killed_together_resume_bit_identical(tars, tmp_path):
    """2 processes x 1 device (2 readers), both killed with SIGKILL after step 3, run again:
    the parameters of an uninterrupted 2-process run."""
    pattern = f"{tars}/{{00000..00003}}.tar"

    def job(workdir):
        port = str(_free_port())
        return [_cli_process(i, port, args(pattern, workdir)) for i in range(2)]

    whole = job(tmp_path / "whole")
    outs = _finish_all(whole)
    assert [p.returncode for p in whole] == [0, 0], [e[-1500:] for _, e in outs]
    chaos = load_chaos()
    cut = tmp_path / "cut"
    procs = job(cut)
    try:
        deadline = time.monotonic() + 240
        while chaos.logged_step(cut) < 3:
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
                [p.communicate()[1][-1500:] for p in procs if p.poll() is not None]
            time.sleep(0.005)
        for p in procs:
            p.kill()
    finally:
        _finish_all(procs)
    again = job(cut)
    outs = _finish_all(again)
    assert [p.returncode for p in again] == [0, 0], [e[-1500:] for _, e in outs]
    assert "resumed from step" in outs[0][0]
    assert digest(cut) == digest(tmp_path / "whole")
