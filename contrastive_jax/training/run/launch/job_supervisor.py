"""A multi-process run's process, watched: when the job loses a host, one line and exit 75.

When a process of a ``jax.distributed`` job dies (its host fails, is preempted without
notice, is killed), JAX's coordination service notices the missing heartbeats after
``launch.heartbeat_timeout_s`` and terminates every other process from C++: a ``SIGABRT``
after a fatal log ("Terminating process because the JAX distributed service detected fatal
errors"), a stack trace, tracebacks of orbax's background threads. The same happens to every
process when process 0, which hosts the service, dies. jaxlib offers no hook a Python program
can use: the client's ``missed_heartbeat_callback`` fails to hand its status to a Python
function (``std::bad_cast``, then ``terminate``; jaxlib 0.10.2, checked 2026-12-04), and the
service's ``recoverable`` mode keeps processes alive only while process 0 lives.

So ``python -m contrastive_jax.main`` of a multi-process launch trains in a child process
(this process forked once its flags are parsed, :data:`SUPERVISED_ENV` set: the child needs
no second start-up of Python and its imports; the same command started anew where threads
already run) and watches its stderr. Lines pass through as
they come until the first line of the coordination service's failure report or of a Python
traceback (a collective whose peer went away fails first, in Python); from there stderr is
held back. When the child has exited after the service's fatal report (or, failing, after a
collective lost its peer), the process prints one line, naming the lost process(es) where the
report does, the last checkpoint on disk and the command to resume, and exits with
:data:`LOST_PROCESS_STATUS` (75, ``EX_TEMPFAIL``: rerun). A child that ends otherwise gives
its own status, and the held-back lines are printed as they were. SIGTERM, SIGINT, SIGHUP,
SIGUSR1 and SIGUSR2 sent to the process are passed to the child (its own process group: a
terminal's ^C reaches it once), and the child is killed when the process dies
(``PR_SET_PDEATHSIG``).
docs/reliability.md, "Multi-host faults".
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence

from contrastive_jax.interrupts import die_with_parent
from contrastive_jax.training.run.launch.distributed import Launch

SUPERVISED_ENV = "CONTRASTIVE_JAX_SUPERVISED"
JOINED_MARKER = "contrastive_jax.job_supervisor: joined the job\n"  # consumed, never shown
LOST_PROCESS_STATUS = 75  # sysexits EX_TEMPFAIL: a temporary failure, run again
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
# the first line of the coordination service's failure report (absl log lines of its files)
REPORT_START = re.compile(r"^[EWF]\d{4} .*\b(coordination_service(_agent)?\.cc|client\.h|"
                          r"preemption_sync_manager\.cc)")
# a Python traceback is held as well (shown when the child ends: it may be a collective
# failing because a peer went away, which the report then explains)
TRACEBACK_START = ("Traceback (most recent call last):", "Exception in thread")
FATAL = "JAX distributed service detected fatal errors"
# a second process with the same id (or a process restarted while the job runs)
TWICE = re.compile(r"(\d+) unexpectedly tried to connect (?:with a different incarnation|while)")
# a checkpoint save whose barrier another process never reached (its write failed or stalled)
SAVE_BARRIER = re.compile(r"Timed out while waiting for async_write_complete barrier|"
                          r"DEADLINE_EXCEEDED: Barrier timed out")
# a collective (gloo on CPU) that failed because its peer is gone
PEER_GONE = re.compile(r"Gloo \w+ failed|Connection reset by peer|Connection closed by peer")
UNHEALTHY = re.compile(r"tasks are unhealthy \(stopped sending heartbeats\):\s*\n"
                       r"((?:\s*\d+\s*\n)+)")
COORDINATOR_GONE = ("Connection reset by peer", "Connection refused", "Socket closed",
                    "failed to connect to all addresses")


def supervised() -> bool:
    """Whether this process is the supervised child (it trains)."""
    return os.environ.get(SUPERVISED_ENV) == "1"


def joined() -> None:
    """Tell the supervisor that this process joined the job (a marker line it consumes; a
    no-op when not supervised): a failure report after it is a lost process, before it a
    start-up that never met the others."""
    if supervised():
        sys.stderr.write(JOINED_MARKER)
        sys.stderr.flush()


def supervise(argv: Sequence[str], workdir: str, launch: Launch, *,
              program: Sequence[str] | None = None) -> int | None:
    """Run this command (``python -m contrastive_jax.main ARGV``) as the supervised child of
    the process of ``launch`` and return the exit status (module docstring):
    :data:`LOST_PROCESS_STATUS` after the coordination service's fatal report (2 when it came
    before the child joined the job: the processes never met), else the child's (``128 + n``
    when signal ``n`` ended it). The child is this process forked (its imports and parsed
    flags kept: no second start-up); it gets ``None`` and goes on to train (where Python
    threads run, the command is started anew instead). ``program``: another command to run
    instead (the tests)."""
    if program is None and threading.active_count() == 1:  # no thread to lose in a fork
        child = _fork()
        if child is None:
            return None
    else:
        program = program or [sys.executable, "-m", "contrastive_jax.main"]
        child = subprocess.Popen([*program, *argv], env={**os.environ, SUPERVISED_ENV: "1"},
                                 stderr=subprocess.PIPE, preexec_fn=_child_setup)
    previous = {sig: signal.signal(sig, lambda s, _f: _forward(child, s)) for sig in FORWARDED}
    held: list[str] = []
    met = False
    try:
        for raw in child.stderr:
            line = raw.decode("utf-8", "replace")
            if line == JOINED_MARKER:
                met = True
                continue
            if held or REPORT_START.match(line) or line.startswith(TRACEBACK_START):
                held.append(line)
                continue
            sys.stderr.write(line)
            sys.stderr.flush()
        status = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    report = "".join(held)
    ending = _ending(report, status, met, launch, workdir)
    if ending is not None:
        print(ending[0], file=sys.stderr, flush=True)
        return ending[1]
    sys.stderr.write(report)
    return 128 - status if status < 0 else status


def _ending(report: str, status: int, met: bool, launch: Launch,
            workdir: str) -> tuple[str, int] | None:
    """``(the one line, exit status)`` for a child that ended with the held-back ``report``
    (``met``: it had joined the job), or None: its own ending stands."""
    twice = TWICE.search(report)
    if twice and (FATAL in report or not met):
        return started_twice_line(int(twice.group(1)), launch), 2
    if not met and FATAL in report:
        return never_met_line(report, launch), 2
    if status != 0 and FATAL not in report and SAVE_BARRIER.search(report):
        return save_barrier_line(report, workdir, launch.process_id), LOST_PROCESS_STATUS
    if FATAL in report or (status != 0 and PEER_GONE.search(report)):
        return (lost_process_line(report, workdir, launch.heartbeat_timeout_s,
                                  launch.process_id), LOST_PROCESS_STATUS)
    return None


def started_twice_line(duplicate: int, launch: Launch) -> str:
    """The one line for a job in which process ``duplicate`` registered twice."""
    return (f"error: process {duplicate} of the job was started twice (a second process with "
            f"that id registered while the first ran, or it restarted mid-job); "
            f"{_me(launch.process_id)} stopped. "
            "Start every process once, each with its own process id, then the same command "
            "resumes from the last checkpoint.")


def never_met_line(report: str, launch: Launch) -> str:
    """The one line for a start-up whose processes never met (the service's report came
    before this process joined)."""
    me = _me(launch.process_id)
    where = f" at {launch.coordinator_address}" if launch.coordinator_address else ""
    count = f"{launch.num_processes} processes" if launch.num_processes else "every process"
    return (f"error: {me} could not join the job: the coordinator{where} (process 0) "
            f"did not see all {count} within launch.initialization_timeout_s = "
            f"{launch.initialization_timeout_s} s. Start process 0 there and every other "
            "process with the same coordinator address and process count, each id once.")


def save_barrier_line(report: str, workdir: str, process_id: int | None = None) -> str:
    """The one line for a checkpoint save that another process never finished (the wait at
    orbax's barrier timed out): which processes, where the run resumes."""
    named = re.search(r"timed out task names:\s*\n((?:\s*\d+\s*\n)+)", report)
    who = _processes(named.group(1)) if named else "another process"
    return (f"error: {who} did not finish writing a checkpoint within checkpoint_timeout_s "
            f"(its own error says why: a full disk, a refused write); {_me(process_id)} "
            "stopped too. Fix that host, then start every process again with the same "
            f"command: {_resumes(workdir)}.")


def lost_process_line(report: str, workdir: str, heartbeat_timeout_s: int,
                      process_id: int | None = None) -> str:
    """The one line for the coordination service's failure ``report``: who was lost (the
    processes it names, the coordinator when the connection to it broke), the last checkpoint
    in ``workdir`` and what to run."""
    named = UNHEALTHY.search(report)
    if named:
        who = (f"{_processes(named.group(1))} stopped sending heartbeats for "
               f"{heartbeat_timeout_s} s (launch.heartbeat_timeout_s)")
    elif any(marker in report for marker in COORDINATOR_GONE):
        who = "the connection to process 0, which coordinates the job, broke"
    else:
        who = "the coordination service reported a failed process"
    return (f"error: the job lost a process: {who}; {_me(process_id)} stopped too (a host "
            "died, was preempted or was killed). Start every process again with the same "
            f"command: {_resumes(workdir)}.")


def _processes(listed: str) -> str:
    """``"process 1"`` / ``"processes 1, 3"`` of the ids one per line in ``listed``."""
    ids = sorted({int(x) for x in listed.split()})
    return f"process{'es' if len(ids) > 1 else ''} {', '.join(map(str, ids))}"


def _me(process_id: int | None) -> str:
    return f"process {process_id}" if process_id is not None else "this process"


def _resumes(workdir: str) -> str:
    step = last_checkpoint(workdir)
    return (f"the run resumes from its last checkpoint (step {step} in {workdir})"
            if step is not None else f"no checkpoint is in {workdir} yet: the run starts over")


def last_checkpoint(workdir: str) -> int | None:
    """The highest finished checkpoint step in ``workdir/checkpoints`` (orbax renames a step's
    folder to its number once it is complete; a folder still being written has a suffix), or
    None; nothing is read from the checkpoints (the restore checks them)."""
    try:
        from etils import epath

        names = [p.name for p in (epath.Path(workdir) / "checkpoints").iterdir()]
    except Exception:  # no such folder, or storage not reachable now
        return None
    steps = [int(name) for name in names if name.isdigit()]
    return max(steps) if steps else None


def _forward(child, sig: int) -> None:
    if child.poll() is None:
        child.send_signal(sig)


class _Forked:
    """The forked child, as much of :class:`subprocess.Popen` as :func:`supervise` uses."""

    def __init__(self, pid: int, stderr):
        self.pid, self.stderr, self.returncode = pid, stderr, None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            try:
                _, status = os.waitpid(self.pid, 0)
                self.returncode = os.waitstatus_to_exitcode(status)
            except ChildProcessError:  # reaped meanwhile by poll() in a signal's handler
                pass
        self.stderr.close()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        os.kill(self.pid, sig)


def _fork() -> _Forked | None:
    """Fork this process: in the child (marked supervised, its stderr a pipe to the parent,
    :func:`_child_setup` done) None, in the parent the child."""
    read, write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.dup2(write, 2)
        os.close(write)
        os.environ[SUPERVISED_ENV] = "1"
        _child_setup()
        return None
    os.close(write)
    return _Forked(pid, os.fdopen(read, "rb"))


def _child_setup() -> None:
    """In the child (before exec, or after the fork): its own process group (signals come
    through the parent only), and killed when the parent dies (Linux)."""
    os.setpgid(0, 0)
    die_with_parent()
