"""docs/launching.md's command blocks, run as written, with local stand-ins for the launchers.

Each block of the page is marked ``<!-- recipe: NAME -->`` and read from the markdown, so a
recipe that rots fails here. Only the variables at a block's top change: the pod template's
``tiny`` variant, a local folder as the bucket (mock ``coco_captions`` and a tokenizer built
from it, as tests/test_pod_template.py builds them), no evaluation, a ``v4-16`` slice (2
hosts). ``gcloud``, ``sbatch``, ``srun``, ``curl`` and ``uv`` are the stand-ins of
``tests/launchers/`` (what each does: ``tests/launchers/standins.py``); they start the same
training command as 2 processes x 1 CPU device on 127.0.0.1, one step each. Every launch is
bounded: on a timeout every process it started is killed.
"""

import contextlib
import json
import os
import pathlib
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
from collections.abc import Iterator

import pytest
from xla_environment import child_environment

from contrastive_jax.accelerators import GiB, tpu_slice
from contrastive_jax.training.data import build_tokenizer
from contrastive_jax.training.data.prepare import main as prepare_main
from contrastive_jax.training.run.compilation_cache import CACHE_ENV, MIN_COMPILE_TIME_ENV

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "launching.md"
LAUNCHERS = ROOT / "tests" / "launchers"
RECIPES = {"install", "tpu-pod", "tpu-pod-stream", "slurm-script", "slurm-submit", "explicit",
           "queued-resource", "queued-resource-again"}
INSTALL_EXTRAS = ("train,tpu,gcs", "train,cuda12,gcs", "train")
TOKENIZER = "coco_sp32k.model"  # the name docs/data.md's build_tokenizer step writes
NO_EVALUATION = '"--config.evaluation.enabled=False"'
SLICE = "v4-16"  # 8 chips on 2 hosts: a 2-process fake pod
LAUNCH_TIMEOUT_S = 300
STEP_LINE = re.compile(r"^step\s+1/1 \| loss", re.M)


# ---------------------------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------------------------

def recipe_blocks(text: str) -> dict[str, str]:
    """``{name: body}`` of every fenced block of ``text``; each must be a ``bash`` block right
    after its ``<!-- recipe: NAME -->`` marker."""
    fences = re.findall(r"^```(\S*)$", text, re.M)
    openings = fences[::2]
    assert openings == ["bash"] * len(openings), f"only bash blocks are recipes: {openings}"
    blocks = {}
    for match in re.finditer(r"^(?:<!-- recipe: ([\w-]+) -->\n)?```bash\n(.*?)^```$", text,
                             re.M | re.S):
        name, body = match[1], match[2]
        assert name, f"a command block without a recipe marker:\n{body[:300]}"
        assert name not in blocks, f"two recipes named {name}"
        blocks[name] = body
    assert len(blocks) == len(openings)
    return blocks


SETTING = re.compile(r'([A-Z][A-Z0-9_]*)=("[^"]*"|\S*)(\s+#.*)?')


def top_settings(block: str) -> dict[str, str]:
    """The ``NAME=value`` lines before a block's first command (comments and ``#SBATCH`` lines
    skipped), as written."""
    settings = {}
    for line in block.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = SETTING.fullmatch(stripped)
        if not match:
            break
        settings[match[1]] = match[2]
    return settings


def with_settings(block: str, **values: str) -> str:
    """``block`` with the variables at its top set to ``values`` (each must be one of them);
    nothing else changes."""
    missing = set(values) - set(top_settings(block))
    assert not missing, f"the recipe sets no {sorted(missing)} at its top:\n{block}"
    lines = block.splitlines()
    for i, line in enumerate(lines):
        match = SETTING.fullmatch(line.strip())
        if match and match[1] in values:
            lines[i] = f"{match[1]}={values.pop(match[1])}"
        if not values:
            break
    return "\n".join(lines) + "\n"


def tiny(config: str) -> str:
    """The recipe's ``CONFIG`` (the pod template with its tokenizer) with the ``tiny`` variant."""
    assert config.startswith("configs/clip_vit_b16_pod.py:") and "tokenizer=" in config, config
    return config.replace(".py:", ".py:tiny,", 1)


@pytest.fixture(scope="module")
def recipes() -> dict[str, str]:
    blocks = recipe_blocks(DOC.read_text())
    assert set(blocks) == RECIPES
    return blocks


def test_every_command_block_is_a_marked_recipe(recipes):
    assert "--config.data.data_dir=$DATA_DIR" in recipes["tpu-pod"]
    assert "--config.data.data_dir=$DATA_DIR" in recipes["slurm-script"]
    with pytest.raises(AssertionError, match="without a recipe marker"):
        recipe_blocks("text\n```bash\nrm -rf ~\n```\n")
    with pytest.raises(AssertionError, match="only bash blocks"):
        recipe_blocks("<!-- recipe: a -->\n```bash\nls\n```\n```sh\nls\n```\n")


def test_the_slice_table_counts_as_the_slice_names_do():
    """The page's table of slices: chips, hosts and memory as
    :func:`contrastive_jax.accelerators.tpu_slice` (what ``plan --slice`` uses) has them."""
    rows = re.findall(r"^\| `([\w-]+)` \| (\d+) \| (\d+) \| (\d+) GiB \|$", DOC.read_text(),
                      re.M)
    assert len(rows) >= 8 and {"v4-256", "v4-512", "v5p-512", "v6e-256"} <= {r[0] for r in rows}
    for name, chips, hosts, memory in rows:
        target = tpu_slice(name)
        assert (target.chips, target.hosts, target.memory) == (int(chips), int(hosts),
                                                               int(memory) * GiB), name
    assert tpu_slice("v4-256").chips == 128  # v4 names count TensorCores


# ---------------------------------------------------------------------------------------------
# A user's machine: a checkout, a bucket, the stand-ins on PATH
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> pathlib.Path:
    """A git checkout of this tree (package, configs, pyproject), committed, with what a
    user's checkout also holds uncommitted: a ``.venv`` and a ``runs/`` folder."""
    path = tmp_path_factory.mktemp("checkout")
    for name in ("pyproject.toml", "README.md", ".gitignore"):
        shutil.copy2(ROOT / name, path / name)
    for name in ("contrastive_jax", "configs"):
        shutil.copytree(ROOT / name, path / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.com", "-c",
           "init.defaultBranch=main"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "checkout"]):
        subprocess.run([*git, *command], cwd=path, check=True, capture_output=True)
    (path / ".venv" / "bin").mkdir(parents=True)
    (path / ".venv" / "LOCAL_VENV").write_text("a local venv: never copied to a worker")
    (path / "runs" / "old").mkdir(parents=True)
    (path / "runs" / "old" / "results.json").write_text("{}")
    return path


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> pathlib.Path:
    """A bucket's contents: mock ``coco_captions`` prepared in ``tensorflow_datasets/`` and a
    SentencePiece model built from its captions (in-process, as tests/test_pod_template.py)."""
    bucket = tmp_path_factory.mktemp("prepared")
    data_dir = str(bucket / "tensorflow_datasets")
    assert prepare_main(["--mock", "coco_captions", f"--data_dir={data_dir}"]) == 0
    assert build_tokenizer.main([
        "--dataset=coco_captions", f"--data_dir={data_dir}", "--split=train+restval",
        "--vocab_size=64", f"--output={bucket / TOKENIZER}"]) == 0
    return bucket


@pytest.fixture
def bucket(prepared, tmp_path) -> pathlib.Path:
    """This test's bucket: the prepared dataset and tokenizer, and room for its runs."""
    path = tmp_path / "bucket"
    path.mkdir()
    for name in ("tensorflow_datasets", TOKENIZER):
        (path / name).symlink_to(prepared / name)
    return path


@pytest.fixture
def machine(tmp_path) -> Iterator[dict[str, str]]:
    """The environment of a user's shell: the stand-ins first on PATH, a home of its own, none
    of the suite's settings but its XLA flags, one CPU device per process and its compilation
    cache (TPU workers get the same through ``STANDIN_WORKER_ENV``)."""
    env = {k: v for k, v in child_environment().items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV")
           and not (k.startswith("CONTRASTIVE_JAX_") and k != CACHE_ENV)}
    assert CACHE_ENV in env  # tests/conftest.py: the run's compilation cache
    for name in ("home", "tmp", "state"):
        (tmp_path / name).mkdir()
    env.update(JAX_PLATFORMS="cpu", HOME=str(tmp_path / "home"), TMPDIR=str(tmp_path / "tmp"),
               PATH=f"{LAUNCHERS / 'bin'}:/usr/local/bin:/usr/bin:/bin",
               STANDIN_PYTHON=sys.executable, STANDIN_STATE=str(tmp_path / "state"),
               STANDIN_WORKER_ENV=json.dumps({k: env[k] for k in ("XLA_FLAGS", CACHE_ENV,
                                                                  MIN_COMPILE_TIME_ENV)}
                                             | {"JAX_PLATFORMS": "cpu"}))
    yield env
    kill_tpu_sessions(tmp_path / "state")


def run_bash(script: str, cwd: pathlib.Path, env: dict[str, str],
             timeout: float = LAUNCH_TIMEOUT_S) -> tuple[str, str]:
    """``bash -c script`` with ``set -euo pipefail``; its output. A non-zero exit or a timeout
    fails the test; on a timeout its whole process group is killed."""
    proc = subprocess.Popen(["bash", "-c", "set -euo pipefail\n" + script], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the recipe ran past {timeout} s\n{out[-2000:]}\n{err[-3000:]}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out[-2000:]}\n{err[-3000:]}"
    return out, err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_finished(workdir: pathlib.Path, log: str) -> dict:
    """One step of a 2-process job: the step in process 0's log, results.json written."""
    assert STEP_LINE.search(log), log[-3000:]
    assert "on 2 devices (2 processes)" in log
    results = json.loads((workdir / "results.json").read_text())
    assert (results["steps"], results["processes"], results["devices"]) == (1, 2, 2)
    return results


# ---------------------------------------------------------------------------------------------
# The fake TPU workers' sessions (tests/launchers/standins.py's ssh supervisor)
# ---------------------------------------------------------------------------------------------

def tpu_sessions(state: pathlib.Path) -> list[pathlib.Path]:
    return sorted(state.glob("tpus/*/worker*/sessions/*.pid"))


def kill_tpu_sessions(state: pathlib.Path) -> None:
    """Kill every fake worker's session (the supervisor leads its process group)."""
    for pid_file in tpu_sessions(state):
        if not pid_file.with_suffix(".json").exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)


def wait_for_tpu_sessions(state: pathlib.Path, timeout: float) -> None:
    """Until every fake worker's session has ended (its record written), at most ``timeout``
    seconds; then kill what is left and fail."""
    waiting = []
    for pid_file in tpu_sessions(state):
        if pid_file.with_suffix(".json").exists():
            continue
        with contextlib.suppress(ProcessLookupError):
            waiting.append(os.pidfd_open(int(pid_file.read_text())))
    poller = select.poll()
    for fd in waiting:
        poller.register(fd, select.POLLIN)
    try:
        remaining = set(waiting)
        while remaining:
            ready = poller.poll(timeout * 1000)
            if not ready:
                kill_tpu_sessions(state)
                pytest.fail(f"fake TPU worker sessions still running after {timeout} s")
            for fd, _ in ready:
                poller.unregister(fd)
                remaining.discard(fd)
    finally:
        for fd in waiting:
            os.close(fd)


def session_records(worker_dir: pathlib.Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(worker_dir.glob("sessions/*.json"),
                                                      key=lambda p: int(p.stem))]


# ---------------------------------------------------------------------------------------------
# The recipes
# ---------------------------------------------------------------------------------------------

def test_install_recipe_with_each_extras(recipes, checkout, machine):
    """The install block with each of the extras it names: uv installed to ~/.local/bin, a
    ``.venv`` whose python runs this checkout's source, every extra defined and the Python
    asked for within ``requires-python`` (the stand-in checks both, as uv would refuse)."""
    block = recipes["install"]
    for extras in INSTALL_EXTRAS:
        assert extras in block
        _, err = run_bash(with_settings(block, EXTRAS=extras), checkout, machine)
        assert f"Installed contrastive-jax (.[{extras}]" in err
    assert (pathlib.Path(machine["HOME"]) / ".local" / "bin" / "uv").exists()
    assert not (checkout / ".venv" / "LOCAL_VENV").exists()  # --clear replaced it
    where = subprocess.run([str(checkout / ".venv" / "bin" / "python"), "-c",
                            "import importlib.util as u; "
                            "print(u.find_spec('contrastive_jax').origin)"],
                           cwd="/", env=machine, capture_output=True, text=True, check=True)
    assert where.stdout.strip() == str(checkout / "contrastive_jax" / "__init__.py")
    # what the stand-in refuses, as uv does: a Python the package does not support
    old = block.replace("--python 3.11", "--python 3.10")
    proc = subprocess.run(["bash", "-c", with_settings(old, EXTRAS="train")], cwd=checkout,
                          env=machine, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "does not satisfy Python>=3.11" in proc.stderr


def streaming_config(recipes, checkout, bucket, machine) -> str:
    """The ``tpu-pod-stream`` block's CONFIG as the shell expands it (the brace ranges kept for
    the worker), over tars written into ``bucket`` (4 to train on, 1 held out)."""
    from test_convert_shards import good, write_tar

    for folder, count in (("laion", 4), ("laion_heldout", 1)):
        (bucket / folder).mkdir()
        for s in range(count):
            write_tar(bucket / folder / f"{s:05d}.tar", [
                m for k in range(8) for m in good(f"{folder}{s}k{k}", 8 * s + k)])
    stream = with_settings(recipes["tpu-pod-stream"],
                           SHARDS=f"{bucket}/laion/{{00000..00003}}.tar",
                           HELDOUT=f"{bucket}/laion_heldout/{{00000..00000}}.tar", STEPS="1")
    out, _ = run_bash(f"BUCKET={bucket}\n{stream}\nprintf '%s' \"$CONFIG\"", checkout, machine)
    assert out.startswith(f"configs/clip_vit_b16_pod.py:stream={bucket}/laion/{{00000..00003}}")
    return out


def test_tpu_pod_recipe_runs_one_step_on_two_workers(recipes, checkout, bucket, machine):
    """Create a 2-host slice, copy the committed checkout, install and start the run on both
    workers, follow worker 0's log: both processes join one job, run the step and exit 0. The
    run streams its shards: the ``tpu-pod-stream`` settings in place of the block's CONFIG
    (the prepared dataset's CONFIG runs in the SLURM and explicit recipes below); the pod
    block's quotes keep the brace ranges from the worker's shell."""
    block = recipes["tpu-pod"]
    settings = top_settings(block)
    tiny(settings["CONFIG"])  # the block's own CONFIG is the template with a tokenizer
    script = with_settings(block, ACCELERATOR=SLICE, BUCKET=str(bucket), OVERRIDES=NO_EVALUATION,
                           CONFIG=tiny(streaming_config(recipes, checkout, bucket, machine)))
    state = pathlib.Path(machine["STANDIN_STATE"])
    out, _ = run_bash(script, checkout, machine)
    wait_for_tpu_sessions(state, LAUNCH_TIMEOUT_S)
    pod = state / "tpus" / settings["TPU"]
    workers = sorted(pod.glob("worker*"))
    assert len(workers) == tpu_slice(SLICE).hosts == 2
    for worker in workers:
        home = worker / "home"
        with tarfile.open(home / "contrastive_jax.tar.gz") as archive:
            names = archive.getnames()
        assert "configs/clip_vit_b16_pod.py" in names
        assert not [n for n in names if n.split("/")[0] in (".venv", "runs")], names
        copy = home / "contrastive_jax"
        assert not (copy / "runs").exists() and not (copy / ".venv" / "LOCAL_VENV").exists()
        assert "standin = true" in (copy / ".venv" / "pyvenv.cfg").read_text()
        setup, launch, *_ = session_records(worker)
        assert setup["status"] == 0 and "uv pip install" in setup["command"]
        # the ssh call returned with the run still going, which then exited 0
        assert launch["status"] == 0 and "contrastive_jax.main" in launch["command"]
        assert launch["running_when_ssh_returned"] == 1
        assert [p["status"] for p in launch["left_running"]] == [0]
        log = (home / "train.log").read_text()
        assert "Traceback" not in log and "error:" not in log, log[-3000:]
    worker0_log = (workers[0] / "home" / "train.log").read_text()
    results = assert_finished(bucket / "runs" / "clip_b16", worker0_log)
    assert results["input"] == {"skipped": {}, "failed_shard_reads": 0, "failed_shards": {}}
    assert STEP_LINE.search(out)  # what `tail -f` showed (the last lines of the log)
    assert not STEP_LINE.search((workers[1] / "home" / "train.log").read_text())


def test_queued_resource_recipes(recipes, checkout, machine):
    """Create a spot queued resource (its node is a slice), see it ACTIVE, then delete it with
    its node and create it again, as after a preemption."""
    script = recipes["queued-resource"] + recipes["queued-resource-again"] + \
        "gcloud compute tpus queued-resources describe $TPU-qr --zone=$ZONE\n"
    out, _ = run_bash(with_settings(script, ACCELERATOR=SLICE), checkout, machine, timeout=120)
    assert out.count("state: ACTIVE") == 2
    tpu = top_settings(recipes["queued-resource"])["TPU"]
    state = pathlib.Path(machine["STANDIN_STATE"])
    assert json.loads((state / "queued" / f"{tpu}-qr.json").read_text())["spot"] is True
    assert len(list((state / "tpus" / tpu).glob("worker*"))) == 2


def test_slurm_recipe_runs_one_step_as_two_tasks(recipes, checkout, bucket, machine):
    """Install with the GPU extras, save the batch script, submit it: ``srun`` starts 2 tasks,
    JAX's SlurmCluster finds the coordinator and ids, both run the step and exit 0."""
    run_bash(with_settings(recipes["install"], EXTRAS="train,cuda12,gcs"), checkout, machine)
    script = recipes["slurm-script"]
    (checkout / "clip_b16.sbatch").write_text(with_settings(
        script, SHARED=str(bucket), CONFIG=tiny(top_settings(script)["CONFIG"]),
        OVERRIDES=NO_EVALUATION))
    submit = recipes["slurm-submit"]
    assert "sbatch clip_b16.sbatch" in submit
    out, err = run_bash(with_settings(submit, CHECKOUT=str(checkout)), checkout, machine)
    job = int(re.search(r"Submitted batch job (\d+)", out)[1])
    assert "this cluster is 1 node x 2 tasks" in err
    record = json.loads((pathlib.Path(machine["STANDIN_STATE"]) / "slurm" /
                         f"{job}.json").read_text())
    log = (checkout / f"clip_b16-{job}.log").read_text()
    assert record["output"] == str(checkout / f"clip_b16-{job}.log")
    assert (record["exit"], record["step0_tasks"]) == (0, [0, 0]), log[-3000:]
    assert "Traceback" not in log
    assert_finished(bucket / "runs" / "clip_b16", log)


def test_explicit_launch_recipe_runs_one_step_as_two_processes(recipes, checkout, bucket,
                                                               machine):
    """The explicit launch block, run twice at once with PROCESS_ID 0 and 1."""
    run_bash(with_settings(recipes["install"], EXTRAS="train"), checkout, machine)
    block = recipes["explicit"]
    coordinator = f"127.0.0.1:{free_port()}"
    scripts = [with_settings(block, COORDINATOR=coordinator, NUM_PROCESSES="2",
                             PROCESS_ID=str(i), SHARED=str(bucket),
                             CONFIG=tiny(top_settings(block)["CONFIG"]),
                             OVERRIDES=NO_EVALUATION) for i in range(2)]
    procs = [subprocess.Popen(["bash", "-c", "set -euo pipefail\n" + s], cwd=checkout,
                              env=machine, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True) for s in scripts]
    try:
        outs = [p.communicate(timeout=LAUNCH_TIMEOUT_S) for p in procs]
    finally:  # bounded: whatever happened, no process outlives the test
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    assert_finished(bucket / "runs" / "clip_b16", outs[0][0] + outs[0][1])
