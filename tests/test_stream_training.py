"""Training straight from shards (the pod template's ``stream=PATTERN`` variant at tiny size):
a run killed with SIGKILL at a random step and run again ends with the parameters of the
uninterrupted run, bit for bit: 1 process on tars in a bucket (the loopback GCS server of
tests/test_remote_paths.py), against the uninterrupted run on the same tars on the local disk
(so the bucket's stream is the local one too), and 2 processes with an input worker process
each on local tars, both killed (their workers die with them). Each run is forked by
tests/forked_command_lines.py's server."""

import json
import random
import shutil
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
def whole(tars, tmp_path_factory) -> Path:
    """The workdir of the uninterrupted 1-process run on the local tars (evaluated on a
    held-out tar: retrieval on its 10 pairs)."""
    workdir = tmp_path_factory.mktemp("stream_whole") / "run"
    heldout = tmp_path_factory.mktemp("stream_heldout") / "00000.tar"
    write_tar(heldout, [m for k in range(10) for m in good(f"h{k}", 100 + k)])
    cmd = [sys.executable, "-m", "contrastive_jax.main",
           *args(f"{tars}/{{00000..00003}}.tar", workdir)]
    cmd[3] = cmd[3].replace(",steps=", f",heldout_stream={heldout},steps=")
    run = forked_command_lines.run(cmd)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "input (process 0): skipped no caption" in run.stdout
    results = json.loads((workdir / "results.json").read_text())
    assert results["steps"] == STEPS and results["input"]["skipped"]["no caption"] >= 4
    final = results["evaluations"][-1]
    # retrieval over the held-out tar's 10 pairs: every recall a multiple of 1/10, R@10 = 1
    recalls = [v for k, v in final.items() if k.startswith(("x_to_y_r", "y_to_x_r"))]
    assert len(recalls) == 6 and final["x_to_y_r10"] == final["y_to_x_r10"] == 1.0, final
    assert all(abs(10 * v - round(10 * v)) < 1e-9 for v in recalls), final
    return workdir


@pytest.fixture(scope="module")
def reference(whole) -> str:
    """The parameter digest of :func:`whole` (evaluation changes no parameter)."""
    return digest(whole)


def test_bad_stream_input_exits_2_with_nothing_written(whole, tars, tmp_path):
    """A pattern that matches nothing: exit 2 with one line, nothing in the workdir (the
    command line's writability probe made it, and removed its probe); the finished
    workdir resumed on another shard list: exit 2 naming it, its checkpoints untouched."""
    from test_reliability import run_command_lines

    fresh = tmp_path / "fresh"
    other = tmp_path / "other"
    shutil.copytree(whole, other)
    before = sorted(p.name for p in (other / "checkpoints").iterdir())
    missing, changed = run_command_lines([
        args(f"{tars}/{{00007..00009}}.tar", fresh),
        [*args(f"{tars}/{{00000..00002}}.tar", other), "--accept_config_change"]])
    assert missing.returncode == 2 and missing.stderr.count("error:") == 1, missing.stderr
    assert "00007.tar' matches no file (and 2 more of its 3 names)" in missing.stderr
    assert not any(fresh.iterdir())
    assert changed.returncode == 2, changed.stderr[-2000:]
    assert "another shard list" in changed.stderr and "Traceback" not in changed.stderr
    assert sorted(p.name for p in (other / "checkpoints").iterdir()) == before


def _killed_once(pattern: str, workdir: Path) -> dict:
    chaos = load_chaos()
    cmd = [sys.executable, "-m", "contrastive_jax.main", *args(pattern, workdir)]
    # Random(5): the kill lands at step 4, after checkpoint 2 (a resume, not a fresh start)
    return chaos.run_with_kills(cmd, workdir, STEPS, 1, random.Random(5), child_environment(),
                                popen=forked_command_lines.popen)


def test_a_killed_run_on_shards_in_a_bucket_resumes_to_the_local_parameters(gcs, tars,  # noqa: F811
                                                                           reference, tmp_path):
    import gcsfs

    fs = gcsfs.GCSFileSystem()
    for path in sorted(tars.glob("*.tar")):
        fs.put(str(path), f"{BUCKET}/stream/{path.name}")
    stats = _killed_once(f"gs://{BUCKET}/stream/{{00000..00003}}.tar", tmp_path / "run")
    assert stats["kills"] == 1 and stats["resumes"] == 1, stats
    assert digest(tmp_path / "run") == reference


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (``/proc``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError):
                continue
    return found


def _descendants(pid: int) -> list[int]:
    """The children of ``pid``, theirs, and so on."""
    found, stack = [], [pid]
    while stack:
        children = _children(stack.pop())
        found += children
        stack += children
    return found


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_two_processes_killed_together_resume_bit_identical(tars, tmp_path):
    """2 processes x 1 device, each with a grain worker process (2 readers, two shards each per
    epoch), both killed with SIGKILL after step 3, run again: the parameters of an
    uninterrupted 2-process run."""
    pattern = f"{tars}/{{00000..00003}}.tar"

    def job(workdir):
        port = str(_free_port())
        return [_cli_process(i, port, [*args(pattern, workdir), "--config.data.worker_count=1"])
                for i in range(2)]

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
        workers = [c for p in procs for c in _descendants(p.pid)]
        for p in procs:
            p.kill()
    finally:
        _finish_all(procs)
    # the input workers die with their process (PR_SET_PDEATHSIG), left running by nobody
    # each process: its supervised trainer, its grain worker and their resource tracker
    assert len(workers) >= 6, workers
    deadline = time.monotonic() + 30
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [w for w in workers if _alive(w)], workers
    again = job(cut)
    outs = _finish_all(again)
    assert [p.returncode for p in again] == [0, 0], [e[-1500:] for _, e in outs]
    assert "resumed from step" in outs[0][0]
    assert digest(cut) == digest(tmp_path / "whole")
    # one process cannot take the two processes' places in their shards, even when asked to
    single = forked_command_lines.run([
        sys.executable, "-m", "contrastive_jax.main", *args(pattern, cut),
        "--config.data.worker_count=1", "--resplit_data", "--jax_num_cpu_devices=2"])
    assert single.returncode == 2, single.stderr[-2000:]
    assert "holds the data position of a stream of shards" in single.stderr, single.stderr
    assert "resume with 2 processes" in single.stderr
