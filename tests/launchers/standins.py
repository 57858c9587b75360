"""Local stand-ins for the launchers that docs/launching.md calls (tests/test_launch_recipes.py).

    STANDIN_PYTHON=... STANDIN_STATE=DIR python standins.py COMMAND ARGS...

``COMMAND`` is ``gcloud``, ``sbatch``, ``srun``, ``curl``, ``uv``, ``tail``, ``python3`` or ``pip``;
the executables of the same names in ``bin/`` (on the test's PATH and every fake TPU
worker's), ``worker/`` (a fake TPU worker's only) and those the fake installers write call
this file. What each does instead of the real thing:

- ``gcloud compute tpus tpu-vm create NAME --accelerator-type=T ...``: a fake slice, one folder
  per host under ``$STANDIN_STATE/tpus/NAME/`` (``worker<i>/home``), the host count of ``T`` as
  :func:`contrastive_jax.accelerators.tpu_slice` gives it (``v4-16``: 8 chips on 2 hosts).
- ``gcloud compute tpus tpu-vm scp SRC... NAME:DEST --worker=all``: copies into each selected
  worker's home (``--recurse`` for folders, as scp).
- ``gcloud compute tpus tpu-vm ssh NAME --worker=all --command=C``: ``bash -c C`` in each
  selected worker's home, concurrently, with the environment a TPU worker gives JAX (below);
  returns, as ssh does, when every process holding the command's output has closed it (a
  background job with its output redirected keeps running; one without holds the call until
  it ends). Each worker's command runs under a supervisor that reaps what the command left
  running and records, in ``worker<i>/sessions/<n>.json``, how many processes were still
  running when the call returned and every exit status.
- ``gcloud compute tpus queued-resources create|describe|delete``: a queued resource that is
  ACTIVE at once and creates its node (``--node-id``) as ``tpu-vm create`` does.
- ``sbatch SCRIPT``: runs SCRIPT with bash in the submission folder, synchronously, on a fake
  cluster of one node (``localhost``) with ``$STANDIN_SLURM_TASKS`` (default 2) task slots: the
  ``#SBATCH`` node and task counts are replaced by that layout (said on stderr); the job's
  variables (``SLURM_JOB_ID``, ``SLURM_NTASKS``, ``SLURM_JOB_NODELIST``, ...) as sbatch sets
  them; output to ``--output`` (``%x`` job name, ``%j`` job id). The job id is chosen so that
  the port JAX derives from it (``SLURM_JOB_ID % 4096 + 61440``) is free. The job's exit status
  goes to ``$STANDIN_STATE/slurm/<id>.json`` (where ``sacct`` would show it).
- ``srun CMD...``: one task per slot, concurrently, each with ``SLURM_PROCID``,
  ``SLURM_LOCALID``, ``SLURM_NODEID``, ``SLURM_STEP_NODELIST``, ``SLURM_STEP_NUM_TASKS``, ... as
  srun sets them; exits with the largest task exit status, recorded per task in the job's file.
- ``curl -LsSf https://astral.sh/uv/install.sh``: prints an installer that puts the ``uv``
  stand-in in ``$HOME/.local/bin`` (where uv's installer puts uv); any other URL fails as
  ``curl -f`` does.
- ``uv venv [--clear] --python X``: ``.venv/bin/python`` is a wrapper that runs
  ``$STANDIN_PYTHON`` with the project folder first on ``PYTHONPATH``, so the copied source is
  what runs (its packages are the test interpreter's). An existing ``.venv`` without
  ``--clear`` is an error, as in uv 0.13.
- ``uv pip install -e '.[EXTRAS]'``: checks what uv would refuse (no virtual environment, a
  Python outside the project's ``requires-python``) and that every extra is defined in
  ``pyproject.toml``; installs nothing.
- ``python3`` (a worker's): the TPU VM image's Python 3.10: ``--version``, and ``-m venv DIR``
  whose ``DIR/bin/pip install -e .`` fails as pip does for a package that needs 3.11.
- ``tail -f FILE`` (a worker's): waits until everything the worker's earlier commands left
  running has exited, then prints the file's end as ``tail`` does (a user stops ``tail -f``).

The fake TPU worker's environment: ``HOME``, a plain ``PATH`` and, for JAX's TPU cluster
detection (``jax/_src/clusters/cloud_tpu_cluster.py``), the variables it reads when it cannot
query a TPU VM's metadata server: ``JAX_FORCE_TPU_INIT=1`` (what JAX sets itself when it finds
TPU chips: a Cloud TPU VM), ``TPU_WORKER_HOSTNAMES`` (the hosts, 127.0.0.1 each) and
``TPU_WORKER_ID``, ``MEGASCALE_*`` empty (one slice) and ``JAX_COORDINATOR_PORT`` (a free port
instead of JAX's fixed 8482). ``GCE_METADATA_IP`` points at a closed port, so a metadata query
fails at once instead of waiting for a server that is not there. Plus ``$STANDIN_WORKER_ENV``
(JSON: the test's JAX_PLATFORMS, XLA flags, compilation cache).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import pathlib
import random
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tomllib

HERE = pathlib.Path(__file__).resolve().parent
UV_INSTALLER_URL = "https://astral.sh/uv/install.sh"
PR_SET_CHILD_SUBREAPER = 36
SLURM_PORT_BASE = 65535 - 2**12 + 1  # JAX's SlurmCluster: SLURM_JOB_ID % 4096 + this


class UsageError(Exception):
    """A command line the real tool would refuse (exit status 2, message on stderr)."""


def state_dir(*parts: str) -> pathlib.Path:
    """``$STANDIN_STATE/parts...``, created."""
    root = os.environ.get("STANDIN_STATE")
    if not root:
        raise UsageError("STANDIN_STATE is not set (tests/test_launch_recipes.py sets it)")
    path = pathlib.Path(root, *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def exit_code(status: int) -> int:
    """A child's status as a shell shows it: ``128 + N`` for a process killed by signal N."""
    return status if status >= 0 else 128 - status


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def split_flags(args: list[str], valued: set[str], boolean: set[str],
                command: str) -> tuple[dict[str, str], list[str]]:
    """``--name=value`` / ``--name`` flags and positionals; a flag not in ``valued`` or
    ``boolean`` (or given the wrong form) is a :class:`UsageError`, as gcloud's
    ``unrecognized arguments``."""
    flags, positionals = {}, []
    for arg in args:
        if not arg.startswith("--"):
            positionals.append(arg)
            continue
        name, sep, value = arg[2:].partition("=")
        if (sep and name not in valued) or (not sep and name not in boolean):
            raise UsageError(f"({command}) unrecognized arguments: {arg}")
        flags[name] = value if sep else "true"
    return flags, positionals


# ---------------------------------------------------------------------------------------------
# gcloud compute tpus
# ---------------------------------------------------------------------------------------------

SSH_FLAGS = {"zone", "worker", "command", "project", "ssh-flag", "ssh-key-file",
             "strict-host-key-checking"}
SSH_BOOLEAN = {"internal-ip", "plain", "dry-run", "force-key-file-overwrite"}
CREATE_FLAGS = {"zone", "accelerator-type", "version", "project", "network", "subnetwork",
                "description", "labels", "metadata", "service-account"}
CREATE_BOOLEAN = {"spot", "preemptible", "internal-ips", "async"}
QUEUED_CREATE_FLAGS = {"zone", "accelerator-type", "runtime-version", "node-id", "project",
                       "network", "subnetwork", "description", "labels", "metadata",
                       "service-account", "valid-until-duration", "valid-after-duration"}
QUEUED_CREATE_BOOLEAN = {"spot", "best-effort", "guaranteed", "reserved", "async",
                         "internal-ips"}


def slice_dir(name: str) -> pathlib.Path:
    return state_dir("tpus") / name


def create_slice(name: str, accelerator_type: str, version: str) -> None:
    """A fake slice ``name``: one worker folder per host of ``accelerator_type``."""
    from contrastive_jax.accelerators import tpu_slice

    if not version:
        raise UsageError("argument --version (--runtime-version): must be specified")
    target = tpu_slice(accelerator_type)
    folder = slice_dir(name)
    if (folder / "slice.json").exists():
        raise UsageError(f"ALREADY_EXISTS: node {name} already exists")
    for worker in range(target.hosts):
        (folder / f"worker{worker}" / "home").mkdir(parents=True)
        (folder / f"worker{worker}" / "sessions").mkdir()
    (folder / "slice.json").write_text(json.dumps({
        "accelerator_type": accelerator_type, "version": version, "hosts": target.hosts,
        "chips": target.chips, "coordinator_port": free_port()}))
    print(f"Create request issued for: [{name}]", file=sys.stderr)


def load_slice(name: str) -> dict:
    path = slice_dir(name) / "slice.json"
    if not path.exists():
        raise UsageError(f"NOT_FOUND: node {name} does not exist (create it first)")
    return json.loads(path.read_text())


def selected_workers(spec: str, hosts: int) -> list[int]:
    """``--worker``: ``all``, ``N`` or ``N,M,...`` (gcloud's default is 0)."""
    if spec == "all":
        return list(range(hosts))
    workers = [int(w) for w in spec.split(",")]
    if any(not 0 <= w < hosts for w in workers):
        raise UsageError(f"--worker={spec}: the slice has workers 0..{hosts - 1}")
    return workers


def worker_home(name: str, worker: int) -> pathlib.Path:
    return slice_dir(name) / f"worker{worker}" / "home"


def remote_path(name: str, worker: int, path: str) -> pathlib.Path:
    """A path on a worker as scp reads it: relative to the home, ``~`` for the home."""
    home = worker_home(name, worker)
    if path in ("", "~"):
        return home
    if path.startswith("~/"):
        path = path[2:]
    if path.startswith("/"):
        raise UsageError(f"{path}: the stand-in copies only into a worker's home")
    return home / path


def tpu_scp(args: list[str]) -> int:
    flags, positionals = split_flags(args, SSH_FLAGS - {"command"} | {"scp-flag"},
                                     SSH_BOOLEAN | {"recurse", "compress"},
                                     "gcloud.compute.tpus.tpu-vm.scp")
    if len(positionals) < 2 or ":" not in positionals[-1]:
        raise UsageError("scp SRC... TPU:DEST (the stand-in copies local files to workers)")
    name, _, dest = positionals[-1].partition(":")
    name = name.rpartition("@")[2]
    hosts = load_slice(name)["hosts"]
    for worker in selected_workers(flags.get("worker", "0"), hosts):
        target = remote_path(name, worker, dest)
        for source in map(pathlib.Path, positionals[:-1]):
            into = target / source.name if target.is_dir() else target
            if source.is_dir():
                if "recurse" not in flags:
                    raise UsageError(f"{source} is a directory: scp needs --recurse")
                shutil.copytree(source, into, symlinks=True, dirs_exist_ok=True)
            else:
                shutil.copy2(source, into)
    return 0


def worker_environment(name: str, worker: int, slice_info: dict, session: int) -> dict:
    """What a command on TPU worker ``worker`` sees: a login's plain variables, JAX's TPU
    cluster variables (module docstring) and the test's ``STANDIN_WORKER_ENV``."""
    home = worker_home(name, worker)
    env = {
        "HOME": str(home), "USER": "tpu-user", "LOGNAME": "tpu-user", "SHELL": "/bin/bash",
        "LANG": "C.UTF-8",
        "PATH": f"{HERE / 'worker'}:{HERE / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "JAX_FORCE_TPU_INIT": "1",
        "TPU_WORKER_HOSTNAMES": ",".join(["127.0.0.1"] * slice_info["hosts"]),
        "TPU_WORKER_ID": str(worker),
        "MEGASCALE_COORDINATOR_ADDRESS": "", "MEGASCALE_NUM_SLICES": "",
        "MEGASCALE_SLICE_ID": "",
        "GCE_METADATA_IP": "127.0.0.1:9",
        "JAX_COORDINATOR_PORT": str(slice_info["coordinator_port"]),
    }
    env.update(json.loads(os.environ.get("STANDIN_WORKER_ENV", "{}")))
    env.update({"STANDIN_PYTHON": os.environ["STANDIN_PYTHON"],
                "STANDIN_STATE": os.environ["STANDIN_STATE"],
                "STANDIN_WORKER_DIR": str(home.parent), "STANDIN_SESSION": str(session)})
    return env


def new_session(worker_dir: pathlib.Path) -> int:
    """The next session number of a worker (its lock file created exclusively)."""
    sessions = worker_dir / "sessions"
    n = 0
    while True:
        try:
            os.close(os.open(sessions / f"{n}.lock", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return n
        except FileExistsError:
            n += 1


def relay(pipes: dict[int, int]) -> None:
    """Copy each readable fd of ``pipes`` (source -> destination) until every one is at EOF:
    ssh returns when the remote command's output is closed by every process holding it."""
    with selectors.DefaultSelector() as selector:
        for source in pipes:
            selector.register(source, selectors.EVENT_READ)
        open_pipes = set(pipes)
        while open_pipes:
            for key, _ in selector.select():
                data = os.read(key.fd, 65536)
                if data:
                    os.write(pipes[key.fd], data)
                else:
                    selector.unregister(key.fd)
                    open_pipes.discard(key.fd)


def live_children() -> list[int]:
    """This process's children that have not exited (zombies excluded), from /proc."""
    me, children = os.getpid(), []
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rpartition(")")[2].split()
            if int(fields[1]) == me and fields[0] != "Z":
                children.append(int(stat.parent.name))
    return children


def supervise(command: str, cwd: pathlib.Path, env: dict, worker_dir: pathlib.Path,
              session: int, report_fd: int) -> None:
    """In a forked child: a new session that holds ``sessions/<n>.lock`` and runs ``bash -c``
    with its output relayed until every holder closes it (as ssh does); then writes bash's exit
    status to ``report_fd`` (the ssh call returns), reaps every process the command left
    running (a child subreaper) and records in ``sessions/<n>.json`` bash's status, how many
    processes were still running when ssh returned, and the exit status of each."""
    os.setsid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    sessions = worker_dir / "sessions"
    lock = os.open(sessions / f"{session}.lock", os.O_WRONLY)
    fcntl.flock(lock, fcntl.LOCK_EX)
    (sessions / f"{session}.pid").write_text(str(os.getpid()))
    bash = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    relay({bash.stdout.fileno(): 1, bash.stderr.fileno(): 2})
    status = bash.wait()
    running = len(live_children())
    os.write(report_fd, str(status).encode())
    os.close(report_fd)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the ssh call has returned: its output is closed
        os.dup2(devnull, fd)
    left_running = []
    while True:
        try:
            pid, wait_status = os.wait()
        except ChildProcessError:
            break
        left_running.append({"pid": pid, "status": os.waitstatus_to_exitcode(wait_status)})
    record = sessions / f"{session}.json"
    record.with_suffix(".tmp").write_text(json.dumps(
        {"command": command, "status": status, "running_when_ssh_returned": running,
         "left_running": left_running}))
    record.with_suffix(".tmp").rename(record)


def tpu_ssh(args: list[str]) -> int:
    flags, positionals = split_flags(args, SSH_FLAGS, SSH_BOOLEAN,
                                     "gcloud.compute.tpus.tpu-vm.ssh")
    if len(positionals) != 1:
        raise UsageError("ssh TPU --command=C (the stand-in runs commands, no shell)")
    if "command" not in flags:
        raise UsageError("the stand-in needs --command (no interactive shell)")
    name = positionals[0].rpartition("@")[2]
    info = load_slice(name)
    reports = []
    for worker in selected_workers(flags.get("worker", "0"), info["hosts"]):
        worker_dir = slice_dir(name) / f"worker{worker}"
        session = new_session(worker_dir)
        env = worker_environment(name, worker, info, session)
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            for fd in (read_fd, *reports):
                os.close(fd)
            try:
                supervise(flags["command"], worker_dir / "home", env, worker_dir, session,
                          write_fd)
            finally:
                os._exit(0)
        os.close(write_fd)
        reports.append(read_fd)
    statuses = []
    for fd in reports:  # every worker's bash runs concurrently; collect each one's status
        with os.fdopen(fd, "rb") as report:
            text = report.read().decode()
        statuses.append(int(text) if text else 255)
    return max(map(exit_code, statuses))


def queued_resources(verb: str, args: list[str]) -> int:
    command = f"gcloud.compute.tpus.queued-resources.{verb}"
    if verb == "create":
        flags, positionals = split_flags(args, QUEUED_CREATE_FLAGS, QUEUED_CREATE_BOOLEAN,
                                         command)
    else:
        flags, positionals = split_flags(args, {"zone", "project"},
                                         {"force", "async", "quiet"}, command)
    if len(positionals) != 1 or "zone" not in flags:
        raise UsageError(f"({command}) QUEUED_RESOURCE and --zone are required")
    record = state_dir("queued") / f"{positionals[0]}.json"
    if verb == "create":
        if record.exists():
            raise UsageError(f"ALREADY_EXISTS: queued resource {positionals[0]}")
        missing = {"node-id", "accelerator-type", "runtime-version"} - set(flags)
        if missing:
            raise UsageError(f"({command}) missing required arguments: {sorted(missing)}")
        create_slice(flags["node-id"], flags["accelerator-type"], flags["runtime-version"])
        record.write_text(json.dumps({"node": flags["node-id"], "state": "ACTIVE",
                                      "spot": "spot" in flags}))
        return 0
    if not record.exists():
        raise UsageError(f"NOT_FOUND: queued resource {positionals[0]}")
    info = json.loads(record.read_text())
    if verb == "describe":
        print(f"name: projects/standin/locations/{flags['zone']}/queuedResources/"
              f"{positionals[0]}\nstate:\n  state: {info['state']}")
        return 0
    if verb == "delete":
        if (slice_dir(info["node"]) / "slice.json").exists() and "force" not in flags:
            raise UsageError("FAILED_PRECONDITION: the queued resource has a node; delete "
                             "it with --force")
        shutil.rmtree(slice_dir(info["node"]), ignore_errors=True)
        record.unlink()
        return 0
    raise UsageError(f"({command}) unknown command")


def gcloud(args: list[str]) -> int:
    """``gcloud compute tpus tpu-vm create|scp|ssh`` and ``... queued-resources ...``."""
    if args[:3] == ["compute", "tpus", "tpu-vm"] and len(args) > 3:
        verb, rest = args[3], args[4:]
        if verb == "create":
            flags, positionals = split_flags(rest, CREATE_FLAGS, CREATE_BOOLEAN,
                                             "gcloud.compute.tpus.tpu-vm.create")
            if len(positionals) != 1 or "accelerator-type" not in flags:
                raise UsageError("tpu-vm create NAME --accelerator-type=T --version=V")
            create_slice(positionals[0], flags["accelerator-type"], flags.get("version", ""))
            return 0
        if verb == "scp":
            return tpu_scp(rest)
        if verb == "ssh":
            return tpu_ssh(rest)
    if args[:3] == ["compute", "tpus", "queued-resources"] and len(args) > 3:
        return queued_resources(args[3], args[4:])
    raise UsageError(f"the stand-in does not implement gcloud {' '.join(args[:4])}")


# ---------------------------------------------------------------------------------------------
# SLURM
# ---------------------------------------------------------------------------------------------

SBATCH_VALUED = {"job-name", "nodes", "ntasks", "ntasks-per-node", "gpus-per-node",
                 "gpus-per-task", "gres", "cpus-per-task", "time", "signal", "output", "error",
                 "partition", "account", "qos", "mem", "mem-per-cpu", "constraint"}
SBATCH_BOOLEAN = {"requeue", "exclusive", "no-requeue"}


def sbatch_directives(script: str) -> list[str]:
    """The ``#SBATCH`` options: read up to the first command line, as sbatch does."""
    options = []
    for line in script.splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("#SBATCH"):
            options += stripped[len("#SBATCH"):].split("#")[0].split()
        elif stripped and not stripped.startswith("#"):
            break
    return options


def job_id() -> int:
    """A job id whose SLURM coordinator port (JAX's SlurmCluster) is free now."""
    while True:
        port = random.randrange(SLURM_PORT_BASE, 65536)
        with socket.socket() as s, contextlib.suppress(OSError):
            s.bind(("", port))
            break
    return port - SLURM_PORT_BASE + 2**12 * random.randrange(1, 200)


def sbatch(args: list[str]) -> int:
    """Run the batch script at once (see the module docstring)."""
    if not args or args[-1].startswith("-"):
        raise UsageError("sbatch [OPTIONS] SCRIPT")
    script = pathlib.Path(args[-1])
    text = script.read_text()
    if not text.startswith("#!"):
        raise UsageError("sbatch: error: This does not look like a batch script. The first "
                         "line must start with #! followed by the path to an interpreter.")
    flags, _ = split_flags(sbatch_directives(text) + args[:-1], SBATCH_VALUED, SBATCH_BOOLEAN,
                           "sbatch")
    tasks = int(os.environ.get("STANDIN_SLURM_TASKS", "2"))
    number = job_id()
    name = flags.get("job-name", script.name)
    asked = (f"--nodes={flags.get('nodes', 1)} "
             f"--ntasks-per-node={flags.get('ntasks-per-node', 1)}")
    print(f"stand-in: {asked} asked; this cluster is 1 node x {tasks} tasks", file=sys.stderr)
    print(f"Submitted batch job {number}", flush=True)
    env = {**os.environ, "SLURM_JOB_ID": str(number), "SLURM_JOBID": str(number),
           "SLURM_JOB_NAME": name, "SLURM_SUBMIT_DIR": os.getcwd(),
           "SLURM_SUBMIT_HOST": "localhost", "SLURM_JOB_NODELIST": "localhost",
           "SLURM_NODELIST": "localhost", "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1",
           "SLURM_NTASKS": str(tasks), "SLURM_NPROCS": str(tasks),
           "SLURM_NTASKS_PER_NODE": str(tasks), "SLURM_TASKS_PER_NODE": str(tasks),
           "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
           "SLURM_CLUSTER_NAME": "standin", "SLURMD_NODENAME": "localhost"}
    if "cpus-per-task" in flags:
        env["SLURM_CPUS_PER_TASK"] = flags["cpus-per-task"]
    output = flags.get("output", "slurm-%j.out").replace("%x", name).replace("%j", str(number))
    with open(output, "w") as log:
        status = subprocess.run(["bash", str(script)], env=env, stdout=log,
                                stderr=subprocess.STDOUT).returncode
    record = state_dir("slurm") / f"{number}.json"
    job = json.loads(record.read_text()) if record.exists() else {}
    record.write_text(json.dumps({**job, "name": name, "output": os.path.abspath(output),
                                  "exit": status}))
    return 0


def srun(args: list[str]) -> int:
    """One task per slot of the job, each with the step's SLURM variables."""
    if "SLURM_JOB_ID" not in os.environ:
        raise UsageError("srun: the stand-in runs only inside a job (sbatch)")
    if not args or args[0].startswith("-"):
        raise UsageError("srun CMD... (the stand-in takes no srun options)")
    tasks = int(os.environ["SLURM_NTASKS"])
    nodes = os.environ["SLURM_JOB_NODELIST"]
    step = {"SLURM_STEP_ID": "0", "SLURM_STEPID": "0", "SLURM_STEP_NODELIST": nodes,
            "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NUM_TASKS": str(tasks),
            "SLURM_STEP_TASKS_PER_NODE": str(tasks), "SLURM_NODEID": "0"}
    procs = [subprocess.Popen(args, env={**os.environ, **step, "SLURM_PROCID": str(i),
                                         "SLURM_LOCALID": str(i)})
             for i in range(tasks)]

    def forward(signum, _frame):  # srun passes SIGTERM/SIGINT on to its tasks
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    statuses = [p.wait() for p in procs]
    record = state_dir("slurm") / f"{os.environ['SLURM_JOB_ID']}.json"
    job = json.loads(record.read_text()) if record.exists() else {}
    record.write_text(json.dumps({**job, "step0_tasks": statuses}))
    return max(map(exit_code, statuses))


# ---------------------------------------------------------------------------------------------
# curl | sh, uv, tail
# ---------------------------------------------------------------------------------------------

def curl(args: list[str]) -> int:
    urls = [a for a in args if not a.startswith("-")]
    if urls != [UV_INSTALLER_URL]:
        print(f"curl: (22) the stand-in serves only {UV_INSTALLER_URL}", file=sys.stderr)
        return 22
    uv = f'exec "{os.environ["STANDIN_PYTHON"]}" "{HERE / "standins.py"}" uv "$@"'
    print(f"""set -eu
dir="${{UV_INSTALL_DIR:-${{XDG_BIN_HOME:-$HOME/.local/bin}}}}"
mkdir -p "$dir"
printf '#!/bin/sh\\n%s\\n' '{uv}' > "$dir/uv"
chmod +x "$dir/uv"
echo "installing to $dir"
echo "everything's installed!"
""")
    return 0


def find_venv(start: pathlib.Path) -> pathlib.Path:
    """``$VIRTUAL_ENV``, else ``.venv`` in ``start`` or a parent (uv's search)."""
    if os.environ.get("VIRTUAL_ENV"):
        return pathlib.Path(os.environ["VIRTUAL_ENV"])
    for folder in (start, *start.parents):
        if (folder / ".venv" / "pyvenv.cfg").exists():
            return folder / ".venv"
    raise UsageError("error: No virtual environment found; run `uv venv` to create an "
                     "environment, or pass `--system` to install into a non-virtual "
                     "environment")


def uv_venv(args: list[str]) -> int:
    python, clear, positionals = None, False, []
    it = iter(args)
    for arg in it:
        if arg in ("--python", "-p"):
            python = next(it)
        elif arg.startswith("--python="):
            python = arg.partition("=")[2]
        elif arg in ("--clear", "-c"):
            clear = True
        elif arg.startswith("-"):
            raise UsageError(f"uv venv: the stand-in does not know {arg}")
        else:
            positionals.append(arg)
    if python is None or not all(p.isdigit() for p in python.split(".")):
        raise UsageError("uv venv: the stand-in needs --python X.Y (the version to provide)")
    venv = pathlib.Path(positionals[0] if positionals else ".venv").absolute()
    if venv.exists():
        if not clear:
            raise UsageError(f"error: Failed to create virtual environment\n  cause: A virtual "
                             f"environment already exists at: {venv.name}\n\nhint: Use the "
                             "`--clear` flag or set `UV_VENV_CLEAR=1` to replace the existing "
                             "virtual environment")
        shutil.rmtree(venv)
    (venv / "bin").mkdir(parents=True)
    project = venv.parent
    (venv / "pyvenv.cfg").write_text(f"version_info = {python}\nstandin = true\n")
    wrapper = venv / "bin" / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{project}${{PYTHONPATH:+:$PYTHONPATH}}" '
                       f'exec "{os.environ["STANDIN_PYTHON"]}" "$@"\n')
    wrapper.chmod(0o755)
    print(f"Using CPython {python} (stand-in)\nCreating virtual environment at: {venv.name}",
          file=sys.stderr)
    return 0


def check_install(venv: pathlib.Path, args: list[str], refuse, installer: str) -> None:
    """What ``installer`` (``pip`` or ``uv``) checks before ``-e PATH[EXTRAS]``: the venv's
    Python within the project's ``requires-python`` (its message), and every extra defined;
    ``refuse(message)`` raises or exits."""
    from packaging.specifiers import SpecifierSet

    editable = [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-e", "--editable")]
    editable += [a.partition("=")[2] for a in args if a.startswith("--editable=")]
    if not editable:
        refuse("the stand-in installs only -e PATH[EXTRAS]")
    version = dict(line.split(" = ", 1) for line in
                   (venv / "pyvenv.cfg").read_text().splitlines())["version_info"]
    for spec in editable:
        path, _, extras = spec.partition("[")
        project = tomllib.loads((pathlib.Path(path) / "pyproject.toml").read_text())["project"]
        requires = SpecifierSet(project.get("requires-python", ""))
        if not requires.contains(version + ".0" if version.count(".") == 1 else version):
            refuse(f"Package '{project['name']}' requires a different Python: {version} not "
                   f"in '{requires}'" if installer == "pip" else
                   f"the current Python version ({version}) does not satisfy Python{requires}")
        defined = set(project.get("optional-dependencies", {}))
        unknown = {e.strip() for e in extras.rstrip("]").split(",") if e.strip()} - defined
        if unknown:
            refuse(f"{project['name']} defines no extra {sorted(unknown)} "
                   f"(defined: {sorted(defined)})")
        print(f"Installed {project['name']} ({spec}; stand-in: no packages downloaded)",
              file=sys.stderr)


def refuse(message: str) -> None:
    raise UsageError(message)


def uv_pip_install(args: list[str]) -> int:
    check_install(find_venv(pathlib.Path.cwd()), args, refuse, "uv")
    return 0


SYSTEM_PYTHON = "3.10.12"  # the TPU VM images' (Ubuntu 22.04) python3


def python3(args: list[str]) -> int:
    """A TPU VM image's ``python3``: ``--version``, and ``-m venv DIR`` whose ``bin/pip``
    refuses this package as pip does (its ``requires-python``)."""
    if args in (["--version"], ["-V"]):
        print(f"Python {SYSTEM_PYTHON}")
        return 0
    if args[:2] == ["-m", "venv"] and len(args) == 3:
        venv = pathlib.Path(args[2]).absolute()
        (venv / "bin").mkdir(parents=True, exist_ok=True)
        (venv / "pyvenv.cfg").write_text(f"version_info = {SYSTEM_PYTHON}\nstandin = true\n")
        for name, command in (("pip", f'pip "{venv}"'), ("python", "python3")):
            script = venv / "bin" / name
            script.write_text(f'#!/bin/sh\nexec "{os.environ["STANDIN_PYTHON"]}" '
                              f'"{HERE / "standins.py"}" {command} "$@"\n')
            script.chmod(0o755)
        return 0
    raise UsageError(f"the stand-in for the image's python3 ({SYSTEM_PYTHON}) answers only "
                     "--version and -m venv DIR")


def pip(args: list[str]) -> int:
    """``VENV/bin/pip install [-q] -e SPEC`` of a ``python3 -m venv VENV`` (its script passes
    ``VENV`` first): pip's checks, its ``ERROR:`` and exit status 1."""
    venv, args = pathlib.Path(args[0]), args[1:]
    if args[:1] != ["install"]:
        raise UsageError("the stand-in pip only installs")

    def pip_error(message: str) -> None:
        print(f"ERROR: {message}", file=sys.stderr)
        sys.exit(1)

    check_install(venv, [a for a in args[1:] if a != "-q"], pip_error, "pip")
    return 0


def uv(args: list[str]) -> int:
    if args[:1] == ["venv"]:
        return uv_venv(args[1:])
    if args[:2] == ["pip", "install"]:
        return uv_pip_install(args[2:])
    raise UsageError(f"the stand-in does not implement uv {' '.join(args[:2])}")


def tail(args: list[str]) -> int:
    follow = {"-f", "-F", "--follow"}
    if follow & set(args):
        sessions = pathlib.Path(os.environ["STANDIN_WORKER_DIR"]) / "sessions"
        mine = f"{os.environ['STANDIN_SESSION']}.lock"
        for lock in sorted(sessions.glob("*.lock")):
            if lock.name != mine:
                with open(lock) as f:  # held by that session's supervisor until it is done
                    fcntl.flock(f, fcntl.LOCK_SH)
    real = shutil.which("tail", path="/usr/bin:/bin")
    os.execv(real, [real, *(a for a in args if a not in follow)])
    return 1


COMMANDS = {"gcloud": gcloud, "sbatch": sbatch, "srun": srun, "curl": curl, "uv": uv,
            "tail": tail, "python3": python3, "pip": pip}


if __name__ == "__main__":
    try:
        sys.exit(COMMANDS[sys.argv[1]](sys.argv[2:]))
    except UsageError as err:
        print(f"ERROR: {err}", file=sys.stderr)
        sys.exit(2)
