"""Several ``python -m contrastive_jax.main`` command lines from one interpreter (not a test).

    python tests/forked_command_lines.py < commands.json > results.json
    python tests/forked_command_lines.py --serve    (through :func:`server`)

``commands.json`` is a list of ``{"args": [...], "env": {...}}``: the arguments after
``-m contrastive_jax.main`` and the environment variables to set; ``"bug": "message"`` makes
that child's ``train.train_and_evaluate`` raise ``RuntimeError(message)`` (a bug in the
trainer, to check what the command line does with one). The interpreter imports the
command line (and the trainer it imports) once, then forks one child per command: the child
parses its own flags (the parent never parses any) and runs ``main.main()``, as
``python -m contrastive_jax.main`` does, with its stdout and stderr in files; its exit status
is the one that command would have (an uncaught exception: its traceback and 1, as the
interpreter does). Prints a JSON list of ``{"returncode", "stdout", "stderr"}``. The test suite
checks the user errors this way: one import of JAX and the trainer instead of one per command.

``--serve``: the same interpreter kept for the test process that started it, forking a child
per request while earlier ones still run (:func:`server` and :class:`ForkedRun`, a
:class:`subprocess.Popen` look-alike): the runs a test watches, signals and kills (a
multi-process job's processes, runs stopped by SIGTERM or SIGKILL) start without Python's
start-up and imports (about 2.5 s of CPU each). A child's environment is the request's; only
what the interpreter read at its own start must be the server's: the ``JAX_*`` settings (JAX
reads them at import) and ``PYTHONPATH`` (start-up hooks such as ``sitecustomize``), else the
request is refused and the test must start a process of its own. ``XLA_FLAGS`` may differ (XLA
reads them when JAX's backend starts, in the child).
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.realpath(__file__))
REPO = os.path.dirname(HERE)


def _child(args: list[str], env: dict[str, str] | None, out_path: str, err_path: str,
           bug: str | None = None, file_size_limit: int | None = None,
           cwd: str | None = None, exit_as_python: bool = False, program: dict | None = None,
           transfer_guard: bool = False) -> None:
    """In a forked child: the command line with ``args`` (``env``: its whole environment, or
    None to add nothing), stdout and stderr to the files; exits with its status: at once
    (``os._exit``), or ``exit_as_python`` as the interpreter ends a program (``SystemExit``
    up the stack: threads joined, ``atexit`` handlers run, such as JAX's end of a
    multi-process job). ``program``: what runs instead of ``python -m contrastive_jax.main``
    (:func:`_run_program`); ``transfer_guard``: tests/emulated_transfer_guard.py installed
    first, as its ``sitecustomize`` does in a new interpreter."""
    code = 1
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        if file_size_limit is not None:  # as a shell's ulimit -f
            import resource

            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        for fd, path in ((1, out_path), (2, err_path)):
            handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(handle, fd)
            os.close(handle)
        if transfer_guard:  # as emulated_transfer_guard.site_folder's sitecustomize does
            sys.path.insert(0, HERE)
            import emulated_transfer_guard

            emulated_transfer_guard.install()
        sys.argv = ["contrastive_jax.main", *args]
        from contrastive_jax import main

        if bug is not None:
            from contrastive_jax.training import train

            def raise_bug(config, workdir, **options):
                raise RuntimeError(bug)

            train.train_and_evaluate = raise_bug
        try:
            if program:
                _run_program(program, args)
            else:
                main.main()
            code = 0
        except SystemExit as stop:
            if stop.code is None or isinstance(stop.code, int):
                code = stop.code or 0
            else:
                print(stop.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        if not exit_as_python:
            os._exit(code)
    raise SystemExit(code)


def _run_program(program: dict, args: list[str]) -> None:
    """``python -m MODULE ARGS`` (``{"module"}``), ``python -c CODE ARGS`` (``{"code"}``) or
    ``python SCRIPT ARGS`` (``{"script"}``) in this (forked) interpreter, with ``sys.argv`` and
    ``sys.path[0]`` as Python sets them."""
    import runpy

    if "module" in program:
        sys.argv = [program["module"], *args]  # runpy puts the module's file in argv[0]
        sys.path[0] = os.getcwd()
        runpy.run_module(program["module"], run_name="__main__", alter_sys=True)
    elif "code" in program:
        sys.argv = ["-c", *args]
        sys.path[0] = ""
        exec(compile(program["code"], "<string>", "exec"), {"__name__": "__main__"})
    else:
        sys.argv = [program["script"], *args]
        sys.path[0] = os.path.dirname(os.path.abspath(program["script"]))
        runpy.run_path(program["script"], run_name="__main__")


def run_in_child(args: list[str], env: dict[str, str], out_path: str, err_path: str,
                 bug: str | None = None) -> int:
    """Fork; in the child, run the command line with ``args`` (``env`` added to this
    process's) and exit with its status."""
    pid = os.fork()
    if pid:
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    _child(args, {**os.environ, **env}, out_path, err_path, bug)


def _import_the_command_line() -> None:
    from contrastive_jax import main as _  # noqa: F401  (imported once, before the forks)
    from contrastive_jax.training import train as _train  # noqa: F401


def main() -> None:
    commands = json.load(sys.stdin)
    _import_the_command_line()
    results = []
    with tempfile.TemporaryDirectory() as folder:
        out_path, err_path = os.path.join(folder, "out"), os.path.join(folder, "err")
        for command in commands:
            sys.stdout.flush()
            code = run_in_child(command["args"], command.get("env", {}), out_path, err_path,
                                command.get("bug"))
            with open(out_path) as out, open(err_path) as err:
                results.append({"returncode": code, "stdout": out.read(), "stderr": err.read()})
    print(json.dumps(results))


# ------------------------------------------------------------------------------ the server
START_SETTINGS = ("PYTHONPATH",)  # read by Python's own start


def _differences(mine: dict[str, str], env: dict[str, str]) -> str | None:
    """The settings read at start that differ between a server started with ``mine`` and a
    child with ``env``, or None. A PYTHONPATH that only names the repository (the folder the
    server imports the package from) adds nothing to what the server has."""
    names = {k for k in (*mine, *env) if k.startswith("JAX_") or k in START_SETTINGS}
    differ = sorted(k for k in names if mine.get(k) != env.get(k) and not (
        k == "PYTHONPATH" and not mine.get(k) and
        {os.path.realpath(p) for p in env[k].split(os.pathsep) if p} <= {REPO}))
    return f"the server started with other {', '.join(differ)}" if differ else None


def _refusal(env: dict[str, str], program: dict | None = None) -> str | None:
    """Why a child with ``env`` (running ``program``) cannot be a fork of this interpreter, or
    None: settings read at start that differ, or a module to run that this interpreter has
    imported already (``python -m`` would import it afresh)."""
    differ = _differences(dict(os.environ), env)
    if differ:
        return differ
    module = (program or {}).get("module")
    if module:
        import importlib.util

        spec = importlib.util.find_spec(module)
        main_module = module + ".__main__" if spec.submodule_search_locations else module
        if main_module in sys.modules:
            return f"{main_module} is imported already"
    return None


def serve() -> None:
    """Read one JSON request a line on stdin (:meth:`CommandLineServer.start`), fork its child,
    answer ``{"pid"}`` (or ``{"error"}``) on stdout, and write each child's exit status to its
    ``status`` file when it ends (Popen's ``returncode``: ``-N`` for signal N). Ends at EOF, or
    when the test process dies."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: never outlive the test
    _import_the_command_line()
    running: dict[int, str] = {}
    pending = b""
    os.set_blocking(0, False)
    while True:
        for pid, status_path in list(running.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                with open(status_path + ".tmp", "w") as f:
                    f.write(str(os.waitstatus_to_exitcode(status)))
                os.rename(status_path + ".tmp", status_path)
                del running[pid]
        try:
            data = os.read(0, 1 << 16)
        except BlockingIOError:
            time.sleep(0.01)
            continue
        if not data:
            return
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            refusal = _refusal(request["env"], request.get("program"))
            if refusal:
                answer = {"error": refusal}
            else:
                sys.stdout.flush()
                pid = os.fork()
                if pid == 0:
                    _child(request["args"], request["env"], request["stdout"],
                           request["stderr"], request.get("bug"),
                           file_size_limit=request.get("file_size_limit"),
                           cwd=request.get("cwd"),
                           exit_as_python=not request.get("exit_at_once"),
                           program=request.get("program"),
                           transfer_guard=request.get("transfer_guard", False))
                running[pid] = request["status"]
                answer = {"pid": pid}
            os.write(1, json.dumps(answer).encode() + b"\n")


class Refused(ValueError):
    """The server cannot fork this child (:func:`_refusal`)."""


class ForkedRun:
    """A child of the server, as :class:`subprocess.Popen` is used: ``pid``, ``returncode``,
    ``poll``, ``wait``, ``communicate`` (its stdout and stderr, once it has ended),
    ``send_signal``, ``terminate`` and ``kill``."""

    def __init__(self, pid: int, folder: str):
        self.pid, self.folder, self.returncode = pid, folder, None

    def poll(self) -> int | None:
        if self.returncode is None:
            path = os.path.join(self.folder, "status")
            if os.path.exists(path):
                with open(path) as f:
                    self.returncode = int(f.read())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout)
            time.sleep(0.005)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        outputs = []
        for name in ("stdout", "stderr"):
            with open(os.path.join(self.folder, name), errors="replace") as f:
                outputs.append(f.read())
        return outputs[0], outputs[1]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class CommandLineServer:
    """``python tests/forked_command_lines.py --serve``, started with ``env``."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.folder = tempfile.mkdtemp(prefix="forked_command_lines_")
        self.process = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        env=env, cwd=REPO)
        self.count = 0

    def refusal(self, env: dict[str, str]) -> str | None:
        """Why a child with ``env`` cannot be forked by this server (:func:`_refusal`), or
        None."""
        return _differences(self.env, env)

    def start(self, args: list[str], env: dict[str, str] | None = None, cwd: str | None = None,
              file_size_limit: int | None = None, bug: str | None = None,
              exit_at_once: bool = False, program: dict | None = None,
              transfer_guard: bool = False) -> ForkedRun:
        """``python -m contrastive_jax.main ARGS`` (or ``program``, :func:`_run_program`) with
        the environment ``env`` (the server's when None) in ``cwd`` (the repository's when
        None), forked; ``bug``: its trainer raises ``RuntimeError(bug)``; ``exit_at_once``: it
        ends with ``os._exit`` (as the children of ``commands.json`` do: no ``atexit``
        handlers and no teardown of its modules, which costs about 0.4 s), else as the
        interpreter ends a program; ``transfer_guard``: tests/emulated_transfer_guard.py
        installed first."""
        self.count += 1
        folder = os.path.join(self.folder, str(self.count))
        os.mkdir(folder)
        request = {"args": list(args), "env": dict(self.env if env is None else env),
                   "cwd": str(cwd or REPO), "stdout": os.path.join(folder, "stdout"),
                   "stderr": os.path.join(folder, "stderr"),
                   "status": os.path.join(folder, "status"),
                   "file_size_limit": file_size_limit, "bug": bug,
                   "exit_at_once": exit_at_once, "program": program,
                   "transfer_guard": transfer_guard}
        self.process.stdin.write(json.dumps(request).encode() + b"\n")
        self.process.stdin.flush()
        answer = json.loads(self.process.stdout.readline())
        if "error" in answer:
            raise Refused(f"cannot fork this command line: {answer['error']}")
        return ForkedRun(answer["pid"], folder)

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


_SERVER: list[CommandLineServer] = []


def server() -> CommandLineServer:
    """This test process's server (started at the first call, with the children's environment
    of tests/xla_environment.py: JAX's default of one CPU device, the suite's XLA flags)."""
    if not _SERVER:
        import atexit

        from xla_environment import child_environment

        _SERVER.append(CommandLineServer({**child_environment(), "JAX_PLATFORMS": "cpu"}))
        atexit.register(_SERVER[0].close)
    return _SERVER[0]


TRAINER = ("-m", "contrastive_jax.main")


def popen(command: list[str], env: dict[str, str] | None = None, cwd=None,
          file_size_limit: int | None = None, transfer_guard: bool = False):
    """``subprocess.Popen(command, stdout=PIPE, stderr=PIPE, text=True)`` in ``cwd`` (the
    repository's when None) with ``env`` (tests/xla_environment.py's children's environment
    when None): a :class:`ForkedRun` of this process's :func:`server` when ``command`` is
    ``[sys.executable, ...]`` running ``-m MODULE``, ``-c CODE`` or a script and the server can
    fork it, else a new process. ``file_size_limit``: bytes, as a shell's ``ulimit -f``;
    ``transfer_guard``: tests/emulated_transfer_guard.py in the child (forked runs only: a new
    process gets it from ``emulated_transfer_guard.site_folder`` on its PYTHONPATH)."""
    if env is None:
        from xla_environment import child_environment

        env = child_environment()
    command = [str(c) for c in command]
    program, args = _program(command)
    if args is not None and server().refusal(env) is None:
        try:
            return server().start(args, env, cwd, file_size_limit, program=program,
                                  transfer_guard=transfer_guard)
        except Refused:  # a module the server has imported: a new process
            pass
    assert file_size_limit is None and not transfer_guard, "it needs a forked run"
    return subprocess.Popen(command, env=env, cwd=cwd or REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _program(command: list[str]) -> tuple[dict | None, list[str] | None]:
    """``(program, args)`` of a ``python`` command line for :meth:`CommandLineServer.start`
    (``program`` None: the trainer's command line), or ``(None, None)``: not one the server
    runs (another interpreter, or Python's own options)."""
    if not command or command[0] != sys.executable or len(command) < 2:
        return None, None
    if command[1] == "-m" and len(command) > 2:
        module = command[2]
        return (None if module == TRAINER[1] else {"module": module}), command[3:]
    if command[1] == "-c" and len(command) > 2:
        return {"code": command[2]}, command[3:]
    if command[1].endswith(".py"):
        return {"script": command[1]}, command[2:]
    return None, None


def run(command: list[str], env: dict[str, str] | None = None, cwd=None,
        timeout: float = 300, file_size_limit: int | None = None, transfer_guard: bool = False):
    """``subprocess.run(command, capture_output=True, text=True, timeout=timeout)`` through
    :func:`popen`: a :class:`subprocess.CompletedProcess`; on a timeout the run is killed."""
    proc = popen(command, env, cwd, file_size_limit, transfer_guard)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


if __name__ == "__main__":
    sys.path[0] = REPO  # as ``python -m contrastive_jax.main`` in the repository: its package
    serve() if sys.argv[1:] == ["--serve"] else main()
