"""Launch settings, and 2 processes x 2 CPU devices on loopback agreeing with one process."""

import json
import pathlib
import shutil
import signal
import socket
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import float32_bounds as fb
from contrastive_jax.losses import clip_loss, nt_xent
from contrastive_jax.losses.sharded import sharded_clip_loss, sharded_nt_xent
from contrastive_jax.mesh import global_batch, make_mesh
from contrastive_jax.training.data import HostShard, open_split, train_dataset
from contrastive_jax.training.run.launch.distributed import Launch, join_job, launch_settings

WORKER = pathlib.Path(__file__).with_name("multihost_worker.py")
sys.path.insert(0, str(WORKER.parent))
import forked_command_lines  # noqa: E402
import multihost_worker  # noqa: E402
from xla_environment import child_environment  # noqa: E402


def test_single_process_unless_asked():
    assert launch_settings({}, environ={}) == Launch()
    assert join_job(Launch()) is False


def test_the_bounded_waits_are_jax_defaults_in_the_class_and_the_base_config():
    """Hosts of a large slice started over ssh arrive over minutes: the waits are JAX's own
    defaults (300 s to initialise, 100 s heartbeat), not tighter."""
    import inspect

    from contrastive_jax.training.config import base_config

    jax_defaults = inspect.signature(jax.distributed.initialize).parameters
    expected = (jax_defaults["initialization_timeout"].default,
                jax_defaults["heartbeat_timeout_seconds"].default)
    assert expected == (300, 100)
    launch = base_config().launch
    assert (Launch().initialization_timeout_s, Launch().heartbeat_timeout_s) == expected
    assert (launch.initialization_timeout_s, launch.heartbeat_timeout_s) == expected


def test_settings_from_environment_and_config():
    env = {"CONTRASTIVE_JAX_COORDINATOR": "10.0.0.1:1234",
           "CONTRASTIVE_JAX_NUM_PROCESSES": "4", "CONTRASTIVE_JAX_PROCESS_ID": "3"}
    launch = launch_settings(None, environ=env)
    assert (launch.mode, launch.coordinator_address, launch.num_processes,
            launch.process_id) == ("explicit", "10.0.0.1:1234", 4, 3)
    assert launch_settings({}, environ={"CONTRASTIVE_JAX_DISTRIBUTED": "auto"}).mode == "auto"
    from_config = launch_settings({"coordinator_address": "h:1", "num_processes": 2,
                                   "process_id": 0}, environ={})
    assert from_config.mode == "explicit"


def test_bad_settings_say_what_to_change():
    with pytest.raises(ValueError, match="NUM_PROCESSES"):
        launch_settings(None, environ={"CONTRASTIVE_JAX_COORDINATOR": "h:1"})
    with pytest.raises(ValueError, match=r"process_id 2 is not in 0\.\.1"):
        launch_settings({"coordinator_address": "h:1", "num_processes": 2, "process_id": 2})
    with pytest.raises(ValueError, match="unknown launch settings"):
        launch_settings({"coordinator": "h:1"})
    with pytest.raises(ValueError, match="needs coordinator_address"):
        launch_settings({"mode": "explicit"})


def test_global_batch_single_process():
    mesh = make_mesh({"data": 4}, jax.devices()[:4])
    x = np.arange(24.0).reshape(8, 3)
    g = global_batch({"x": x}, mesh)["x"]
    assert g.shape == (8, 3) and len(g.addressable_shards) == 4
    np.testing.assert_array_equal(np.asarray(g), x)
    with pytest.raises(ValueError, match="global batch 6 does not divide by the 4"):
        global_batch(np.ones((6, 3)), mesh)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_two_processes(timeout: float = 240.0) -> list[dict]:
    port = str(_free_port())
    env = child_environment()
    env["JAX_PLATFORMS"] = "cpu"
    procs = [forked_command_lines.popen([sys.executable, WORKER, str(i), port], env)
             for i in range(2)]  # forked where the server can: no start-up of Python each
    outputs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            assert p.returncode == 0, f"process exited {p.returncode}:\n{err[-3000:]}"
            outputs.append(json.loads(out.strip().splitlines()[-1]))
    finally:  # bounded: whatever happened, no process outlives the test
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outputs


def test_two_processes_match_one_process():
    results = _run_two_processes()
    # the input pipeline: each global batch holds the single-process batch's examples
    single = train_dataset(open_split("digits", "train"), global_batch_size=multihost_worker.
                           DATA_BATCH, seed=multihost_worker.DATA_SEED, shard=HostShard(0, 1))
    single = iter(single)
    for step in range(multihost_worker.DATA_STEPS):
        want = np.sort(next(single)["index"])
        for proc in results:
            np.testing.assert_array_equal(np.sort(proc["data/indices"][step]), want)
    x, y = multihost_worker.data()
    mesh4 = make_mesh({"data": 4}, jax.devices()[:4])
    thirds = {"clip": np.float32(np.log(10.0)), "nt_xent": np.float32(0.2)}
    refs = {
        "clip": lambda a, b, t: clip_loss(a, b, t, impl="autodiff"),
        "nt_xent": lambda a, b, t: nt_xent(a, b, t, impl="autodiff"),
    }
    no_grad = {
        "clip": lambda a, b, t: sharded_clip_loss(a, b, t, mesh=mesh4,
                                                  strategy="all_gather_no_grad"),
        "nt_xent": lambda a, b, t: sharded_nt_xent(a, b, t, mesh=mesh4,
                                                   strategy="all_gather_no_grad"),
    }
    for name, fn in refs.items():
        # The single-process answers in float64; the processes' float32 results must lie within
        # the float32 bounds (tests/float32_bounds.py; the no-grad gradient keeps a subset of
        # the exact one's terms, so the same bounds hold).
        b = fb.bounds_for(name, x, y, thirds[name])
        with jax.enable_x64(True):
            args = (jnp.asarray(x, jnp.float64), jnp.asarray(y, jnp.float64),
                    jnp.float64(b.third))
            want, nog = jax.jit(lambda *a, fn=fn, name=name: (  # one compile for both
                jax.value_and_grad(fn, argnums=(0, 1, 2))(*a),
                jax.value_and_grad(no_grad[name], argnums=(0, 1, 2))(*a)))(*args)
        for strategy in ("all_gather", "ring", "all_gather_no_grad"):
            loss, grads = nog if strategy == "all_gather_no_grad" else want
            for proc in results:  # both processes hold the same, single-process answer
                got = proc[f"{name}/{strategy}"]
                what = f"{name}/{strategy}"
                fb.assert_within(got["loss"], loss, b.loss, what)
                fb.assert_rows_within(got["grads"][0], grads[0], b.rows_x, what)
                fb.assert_rows_within(got["grads"][1], grads[1], b.rows_y, what)
                fb.assert_within(got["grads"][2], grads[2], b.third_grad, what)


def test_sigterm_to_one_host_stops_both_at_the_same_step(tmp_path):
    """2 processes x 1 CPU device train together; SIGTERM reaches only process 1. Both must
    agree on the step (through the coordination service's key-value store, no device
    collective: between the log steps every 3 steps each process runs under the emulated
    device-to-host transfer guard, tests/emulated_transfer_guard.py, installed in each
    forked process; a control child shows that it stops a read there), save one checkpoint
    there and exit 0; the run then resumes from it."""
    port = str(_free_port())
    workdir = tmp_path / "run"

    def start(i):
        return _cli_process(i, port, [
            "--config=configs/simclr_mnist1d.py:quick", f"--workdir={workdir}",
            "--config.total_steps=400", "--config.checkpoint_every=1000",
            "--config.log_every=3", "--config.evaluation.enabled=False",
            "--config.transfer_guard=disallow"], transfer_guard=True)

    procs = [start(0), start(1)]
    metrics = workdir / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and all(p.poll() is None for p in procs):
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 5:
                procs[1].send_signal(signal.SIGTERM)
                break
            time.sleep(0.02)
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    assert [p.returncode for p in procs] == [0, 0], [err[-1500:] for _, err in outs]
    assert "stopped by a signal to another process after step" in outs[0][0]
    assert not any("GuardedRead" in err for _, err in outs)
    stopped = int(outs[0][0].split("after step ")[1].split(":")[0])
    assert stopped < 400
    saved = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert saved[-1] == stopped
    # the guard holds in such a child: a read on the host under "disallow" is an error
    control = forked_command_lines.run([sys.executable, "-c", (
        "import jax, jax.numpy as jnp\nwith jax.transfer_guard_device_to_host('disallow'):\n"
        "    float(jnp.ones(()))")], transfer_guard=True)
    assert control.returncode == 1 and "GuardedRead" in control.stderr, control.stderr[-1500:]


LOST_HOST_ARGS = ["--config=configs/simclr_mnist1d.py:quick", "--config.total_steps=24",
                  "--config.log_every=2", "--config.evaluation.enabled=False",
                  "--config.launch.heartbeat_timeout_s=5"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> pathlib.Path:
    """The workdir of one uninterrupted 2-process x 1-device run of :data:`LOST_HOST_ARGS`
    (checkpoints 10, 20 and 24), run once for the module: the parameters a rerun after a lost
    host must end with, bit for bit, and the finished 2-process workdir that the run with a
    failing write and the 1-process resume start from (each on its own copy)."""
    workdir = tmp_path_factory.mktemp("uninterrupted") / "run"
    port = str(_free_port())
    procs = [_cli_process(i, port, [*LOST_HOST_ARGS, f"--workdir={workdir}",
                                    "--config.checkpoint_every=10"]) for i in range(2)]
    outs = _finish_all(procs)
    assert [p.returncode for p in procs] == [0, 0], [e[-1500:] for _, e in outs]
    assert _saved(workdir) == [10, 20, 24]
    return workdir


def _saved(workdir: pathlib.Path) -> list[int]:
    return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


def _copy(workdir: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    """A copy of ``workdir`` to run in (its lock is an flock held only while a run lives)."""
    shutil.copytree(workdir, dest)
    return dest


@pytest.mark.parametrize("victim", [1, 0])
def test_a_lost_host_is_one_line_and_exit_75_then_the_rerun_is_bit_identical(tmp_path, victim,
                                                                              request):
    """SIGKILL of one process mid-run: the other exits 75 within the heartbeat timeout (5 s)
    + 20 s with one line on stderr naming what was lost and the checkpoint to resume from (no
    C++ abort, no traceback). Process 1 is killed while a checkpoint is being written (one
    every step: a step folder still unfinished); rerunning both never takes that step,
    resumes from the named one and ends with the parameters of an uninterrupted run (the
    module's :func:`uninterrupted` run, which checkpoints every 10 steps: saving changes no
    parameter), bit for bit. Process 0 hosts JAX's coordination service: the other learns at
    once that the connection broke."""
    port = str(_free_port())
    workdir = tmp_path / "run"
    args = [*LOST_HOST_ARGS, f"--workdir={workdir}",
            f"--config.checkpoint_every={1 if victim == 1 else 10}"]
    procs = [_cli_process(i, port, args) for i in range(2)]
    folder = workdir / "checkpoints"
    first = 3 if victim == 1 else 10  # a finished checkpoint to resume from

    def saving() -> bool:  # a step folder orbax has not finished (renamed) yet
        return victim == 0 or any(".orbax-checkpoint-tmp" in p.name for p in folder.iterdir())

    try:
        deadline = time.monotonic() + 180
        while not ((folder / str(first)).is_dir() and saving()):  # one saved, then mid-run
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
                [p.communicate()[1][-1500:] for p in procs if p.poll() is not None]
            time.sleep(0.002)
        procs[victim].kill()
        killed = time.monotonic()
        survivor = procs[1 - victim]
        _, err = survivor.communicate(timeout=60)
        waited = time.monotonic() - killed
    finally:
        _finish_all(procs)
    assert survivor.returncode == 75, err[-2000:]
    lost = ("the connection to process 0, which coordinates the job, broke" if victim == 0
            else "process 1 stopped sending heartbeats for 5 s")
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and lost in lines[0], err[-2000:]
    assert "Traceback" not in err and "Check failure stack trace" not in err, err[-2000:]
    step = int(lines[0].split("last checkpoint (step ")[1].split(" ")[0])
    assert step >= first and (folder / str(step) / "commit_success.txt").is_file()
    assert waited < 5 + 20
    if victim == 0:
        return
    unfinished = [p.name for p in folder.iterdir() if ".orbax-checkpoint-tmp" in p.name]
    assert unfinished and all(int(name.split(".")[0]) > step for name in unfinished)
    port = str(_free_port())  # the rerun saves at 20 and 24 only (a field free to change)
    again = [_cli_process(i, port, [*args, "--config.checkpoint_every=10"]) for i in range(2)]
    outs = _finish_all(again)
    assert [p.returncode for p in again] == [0, 0], [e[-1500:] for _, e in outs]
    assert f"resumed from step {step}:" in outs[0][0]
    reference = request.getfixturevalue("uninterrupted")
    digests = [json.loads((d / "results.json").read_text())["params_sha256"]
               for d in (workdir, reference)]
    assert digests[0] == digests[1]


def test_a_two_process_workdir_resumed_by_one_process_needs_resplit_data(uninterrupted,
                                                                          tmp_path):
    """The finished 2-process x 1-device workdir (:func:`uninterrupted`) resumed by 1 process
    x 2 devices (the same global batch and devices): exit 2 naming both counts and
    --resplit_data, nothing moved aside; with --resplit_data it resumes at that step and
    finishes."""
    workdir = _copy(uninterrupted, tmp_path / "run")
    single = [sys.executable, "-m", "contrastive_jax.main", *LOST_HOST_ARGS,
              f"--workdir={workdir}", "--config.total_steps=28", "--accept_config_change",
              "--jax_num_cpu_devices=2"]
    refused = forked_command_lines.run(single)
    assert refused.returncode == 2, refused.stderr[-1500:]
    assert refused.stderr.splitlines()[-1].startswith(
        f"error: checkpoint 24 in {workdir / 'checkpoints'} was written by a run of 2 "
        "processes and this run has 1: each process saved its own place in the data. Resume "
        "with 2 processes, or add --resplit_data")
    assert not (workdir / "checkpoints_set_aside").exists()
    resumed = forked_command_lines.run([*single, "--resplit_data"])
    assert resumed.returncode == 0, resumed.stderr[-1500:]
    assert "resumed from step 24: 28 steps of 64 on 2 devices (1 processes)" in resumed.stdout
    assert json.loads((workdir / "results.json").read_text())["steps"] == 28


def test_the_identity_digests_follow_the_code_and_the_prepared_data(tmp_path):
    from contrastive_jax.training.data.sources import prepared_digest as dataset_digest
    from contrastive_jax.training.run.provenance import source_digest

    code = tmp_path / "code"
    (code / "sub").mkdir(parents=True)
    (code / "a.py").write_text("x = 1\n")
    (code / "sub" / "b.py").write_text("y = 2\n")
    before = source_digest(code)
    (code / "sub" / "b.py").write_text("y = 3\n")
    assert source_digest(code) != before and len(before) == 16
    (code / "sub" / "b.py").write_text("y = 2\n")
    assert source_digest(code) == before
    dirs = [tmp_path / "host0", tmp_path / "host1"]
    assert dataset_digest("cifar10", str(dirs[0])) == "not prepared"
    for folder, shards in zip(dirs, ("50000", "49999"), strict=True):
        (folder / "cifar10" / "3.0.2").mkdir(parents=True)
        (folder / "cifar10" / "3.0.2" / "dataset_info.json").write_text(
            '{"splits": [{"name": "train", "shardLengths": ["' + shards + '"]}]}')
    assert dataset_digest("cifar10", str(dirs[0])) != dataset_digest("cifar10", str(dirs[1]))
    assert dataset_digest("mnist1d", str(dirs[0])) == "generated by the code"


def test_a_host_whose_checkpoint_write_fails_stops_both_with_one_line_each(uninterrupted,
                                                                          tmp_path):
    """A refused write on one host (process 1 under a file-size limit, as a full disk refuses
    it) while the job saves a checkpoint (the finished 2-process workdir of
    :func:`uninterrupted`, resumed to save step 30): process 1 exits 2 with its own one-line
    reason, process 0 exits 75 naming process 1, both within checkpoint_timeout_s (4 s) + 90
    s (it used to be orbax's 20 minutes, then a traceback); checkpoint 24 is intact."""
    workdir = _copy(uninterrupted, tmp_path / "run")
    args = [*LOST_HOST_ARGS, f"--workdir={workdir}", "--config.checkpoint_every=10",
            "--config.checkpoint_timeout_s=4", "--config.total_steps=30",
            "--accept_config_change"]
    port = str(_free_port())
    limited = [_cli_process(0, port, args),  # process 1 can write no file above 8 KiB
               _cli_process(1, port, args, file_size_limit=8 * 1024)]  # (a save's are larger)
    start = time.monotonic()
    outs = _finish_all(limited)
    assert time.monotonic() - start < 4 + 90  # start-up and the steps included
    assert [p.returncode for p in limited] == [75, 2], [e[-2000:] for _, e in outs]
    assert "resumed from step 24:" in outs[0][0]
    errors = [[line for line in err.splitlines() if line.startswith("error: ")]
              for _, err in outs]
    assert errors[1] and errors[1][0].startswith(f"error: cannot write in the workdir {workdir}")
    assert errors[0] == [
        "error: process 1 did not finish writing a checkpoint within checkpoint_timeout_s "
        "(its own error says why: a full disk, a refused write); process 0 stopped too. Fix "
        "that host, then start every process again with the same command: the run resumes "
        f"from its last checkpoint (step 24 in {workdir})."], outs[0][1][-2000:]
    assert "Traceback" not in outs[0][1]
    assert (workdir / "checkpoints" / "24" / "commit_success.txt").is_file()


def test_processes_that_never_meet_each_say_so_in_one_line(tmp_path):
    """Two processes of a job of 3 (one never started; a wrong address or an id used twice
    look the same to the others): each exits 2 within launch.initialization_timeout_s (2 s)
    + 60 s (start-up included) with one line saying what to check; no checkpoint is written."""
    port = str(_free_port())
    start = time.monotonic()
    procs = [_cli_process(i, port, [
        "--config=configs/simclr_mnist1d.py:quick", f"--workdir={tmp_path / 'run'}",
        "--config.launch.initialization_timeout_s=2"], {"CONTRASTIVE_JAX_NUM_PROCESSES": "3"})
        for i in range(2)]
    outs = _finish_all(procs)
    assert time.monotonic() - start < 2 + 60  # start-up included (slow machines: 2-3x)
    assert [p.returncode for p in procs] == [2, 2], [err[-1500:] for _, err in outs]
    for i, (_, err) in enumerate(outs):
        assert err.splitlines() == [
            f"error: process {i} could not join the job: the coordinator at 127.0.0.1:{port} "
            "(process 0) did not see all 3 processes within launch.initialization_timeout_s "
            "= 2 s. Start process 0 there and every other process with the same coordinator "
            "address and process count, each id once."], err[-1500:]
    assert not (tmp_path / "run" / "checkpoints").exists()


def _cli_process(i: int, port: str, args: list[str], env_extra: dict[str, str] | None = None,
                 file_size_limit: int | None = None, transfer_guard: bool = False):
    """Process ``i`` of a 2-process ``contrastive_jax.main`` job over loopback (a
    :class:`subprocess.Popen`, or its look-alike forked by tests/forked_command_lines.py's
    server where the environment allows: no second start-up of Python and its imports).
    ``file_size_limit``: bytes, as a shell's ``ulimit -f``; ``transfer_guard``: under the
    emulated device-to-host transfer guard (tests/emulated_transfer_guard.py)."""
    env = child_environment()
    env.update(JAX_PLATFORMS="cpu", CONTRASTIVE_JAX_COORDINATOR=f"127.0.0.1:{port}",
               CONTRASTIVE_JAX_NUM_PROCESSES="2", CONTRASTIVE_JAX_PROCESS_ID=str(i))
    env.update(env_extra or {})
    return forked_command_lines.popen([sys.executable, "-m", "contrastive_jax.main", *args],
                                      env, file_size_limit=file_size_limit,
                                      transfer_guard=transfer_guard)


def _finish_all(procs: list) -> list[tuple[str, str]]:
    try:
        return [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def test_processes_with_different_configs_stop_at_start_naming_the_difference(tmp_path):
    """Two processes, batch 64 and 32 (it used to end in SIGABRT after 24-81 s with gloo
    messages), process 1 also seeing another optax (a dist-info folder first on its path, as
    a host with another install would): both exit 2 at start-up, naming data.batch_size and
    software.optax with process 0's values and what to make equal."""
    fake = tmp_path / "site"
    (fake / "optax-9.9.9.dist-info").mkdir(parents=True)
    (fake / "optax-9.9.9.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: optax\nVersion: 9.9.9\n")
    port = str(_free_port())
    procs = [_cli_process(i, port, [
        "--config=configs/simclr_mnist1d.py:quick", f"--workdir={tmp_path / 'run'}",
        "--config.total_steps=4", f"--config.data.batch_size={batch}",
        # a per-host data dir may differ; it is not a different run
        f"--config.data.data_dir={tmp_path / ('data' + str(i))}",
        "--config.evaluation.enabled=False"], {"PYTHONPATH": str(fake)} if i else None)
        for i, batch in ((0, 64), (1, 32))]
    outs = _finish_all(procs)
    assert [p.returncode for p in procs] == [2, 2], [err[-1500:] for _, err in outs]
    from contrastive_jax.training.run.provenance import version

    for _, err in outs:
        assert "Traceback" not in err and err.count("\n") == 1, err[-1500:]
        assert "do not run the same config" in err
        assert "process 1: data.batch_size, software.optax" in err
        assert ("with the same command, config file and overrides and the same checkout of "
                "contrastive_jax and the same package versions.") in err
    assert (f"(process 0 has {{'data.batch_size': 64, 'software.optax': "
            f"'{version('optax')}'}})") in outs[0][1]
    assert not (tmp_path / "run" / "checkpoints").exists()  # stopped before any work
