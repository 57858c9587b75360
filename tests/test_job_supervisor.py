"""contrastive_jax.training.run.launch.job_supervisor: a multi-process run's child watched. The
coordination service's fatal report (the C++ abort when a peer dies) becomes one line and exit
75; every other ending keeps its status and its lines; signals reach the child once; the child
dies with its supervisor. Children here are small Python scripts (no JAX); the real 2-process
cases are in tests/test_distributed.py."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from contrastive_jax.training.run.launch import job_supervisor
from contrastive_jax.training.run.launch.distributed import Launch

MARKER = job_supervisor.JOINED_MARKER


def launch(process_id: int = 0) -> Launch:
    return Launch(mode="explicit", coordinator_address="127.0.0.1:1234", num_processes=2,
                  process_id=process_id, initialization_timeout_s=5, heartbeat_timeout_s=20)

REPORT = textwrap.dedent("""\
    E1204 02:52:36.221592    8090 coordination_service.cc:1549] [756] Use error polling to propagate the following error to all tasks: UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):
    1
    3
    The tasks have crashed. Check the task logs for an earlier error.
    E1204 02:52:36.222151    8101 coordination_service_agent.cc:289] Polled an error from coordination service (this can be an error from this or another task).
    F1204 02:52:36.222180    8101 client.h:80] Terminating process because the JAX distributed service detected fatal errors. This most likely indicates that another task died
    Traceback (most recent call last):
      File "orbax/checkpoint/async_checkpointer.py", line 1, in _thread_func
    RuntimeError: barrier failed
    """)  # noqa: E501 (the service's own lines)


def child(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


@pytest.fixture
def workdir(tmp_path):
    for name in ("20", "40", "60.orbax-checkpoint-tmp-1733", "notes"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
    return str(tmp_path)


def test_the_fatal_report_becomes_one_line_and_status_75(workdir, capsys):
    program = child(f"""
        import os, sys
        sys.stderr.write("an ordinary line\\n")
        sys.stderr.write({MARKER!r})
        sys.stderr.write({REPORT!r})
        sys.stderr.flush()
        os.abort()
    """)
    assert job_supervisor.supervise([], workdir, launch(0), program=program) == 75
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "an ordinary line",
        "error: the job lost a process: processes 1, 3 stopped sending heartbeats for 20 s "
        "(launch.heartbeat_timeout_s); process 0 stopped too (a host died, was preempted or "
        "was killed). Start every process again with the same command: the run resumes from "
        f"its last checkpoint (step 40 in {workdir})."]


def test_the_coordinator_lost_and_no_checkpoint_yet(tmp_path):
    report = ("W1204 02:58:32.6 11337 preemption_sync_manager.cc:147] Failed to retrieve "
              "preemption notice from coordination service: UNAVAILABLE: Socket closed\n"
              "F1204 02:58:32.7 11337 client.h:80] Terminating process because the JAX "
              "distributed service detected fatal errors.\n")
    line = job_supervisor.lost_process_line(report, str(tmp_path), 100, 1)
    assert line == ("error: the job lost a process: the connection to process 0, which "
                    "coordinates the job, broke; process 1 stopped too (a host died, was "
                    "preempted or was killed). Start every process again with the same "
                    f"command: no checkpoint is in {tmp_path} yet: the run starts over.")
    assert job_supervisor.last_checkpoint(str(tmp_path)) is None


@pytest.mark.parametrize("ending,status", [("sys.exit(3)", 3), ("sys.exit(0)", 0),
                                           ("os.kill(os.getpid(), 9)", 137)])
def test_other_endings_keep_their_status_and_every_line(workdir, capsys, ending, status):
    """A coordination warning that is not followed by the fatal line is shown (after the
    child ends), with the child's own status, 128 + n for a signal."""
    program = child(f"""
        import os, sys
        sys.stderr.write("W1204 1 2 coordination_service_agent.cc:1] a warning\\n")
        sys.stderr.write("error: something the user can fix\\n")
        sys.stderr.flush()
        {ending}
    """)
    assert job_supervisor.supervise([], workdir, launch(), program=program) == status
    assert capsys.readouterr().err.splitlines() == [
        "W1204 1 2 coordination_service_agent.cc:1] a warning",
        "error: something the user can fix"]


def test_a_signal_to_the_supervisor_reaches_the_child_once(workdir, capfd):
    program = child("""
        import signal, sys, time
        got = []
        signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
        print("ready", flush=True)
        deadline = time.monotonic() + 20
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # a second signal would arrive here
        print(f"child got {len(got)} SIGTERM", flush=True)
        sys.exit(0 if got else 5)
    """)
    sender = threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGTERM))  # child is up
    sender.start()
    try:
        assert job_supervisor.supervise([], workdir, launch(), program=program) == 0
    finally:
        sender.cancel()
    assert "child got 1 SIGTERM" in capfd.readouterr().out
    assert signal.getsignal(signal.SIGTERM) is not None  # the test process's handler is back


def test_the_child_dies_with_its_supervisor(tmp_path):
    """SIGKILL of the supervising process (a host's process killed) kills the child too, so
    no orphan trains on alone."""
    pid_file = tmp_path / "child.pid"
    grandchild = (f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
                  "time.sleep(60)")
    supervisor = subprocess.Popen([sys.executable, "-c", (
        "import sys; from contrastive_jax.training.run.launch import job_supervisor; "
        "from contrastive_jax.training.run.launch.distributed import Launch; "
        f"sys.exit(job_supervisor.supervise([], {str(tmp_path)!r}, Launch(), "
        f"program=[sys.executable, '-c', {grandchild!r}]))")])
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline and supervisor.poll() is None
            time.sleep(0.02)
        pid = int(pid_file.read_text())
        supervisor.kill()
        supervisor.wait()
        deadline = time.monotonic() + 10
        while _alive(pid):
            assert time.monotonic() < deadline, "the child outlived its supervisor"
            time.sleep(0.02)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (killed, not yet reaped by init) is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("exception,status", [
    ("ValueError: UNKNOWN: Gloo AllGather failed: [pair.cc:538] Read error "
     "[127.0.0.1]:5526: Connection reset by peer", 75),
    ("ZeroDivisionError: division by zero", 1)])
def test_a_traceback_is_held_and_shown_unless_a_collective_lost_its_peer(workdir, capsys,
                                                                         exception, status):
    """A collective whose peer died fails in Python first (the service's report may not come
    before the child exits): that traceback is the lost host's; any other is shown whole."""
    traceback = f'Traceback (most recent call last):\n  File "x.py", line 1, in f\n{exception}\n'
    program = child(f"""
        import sys
        sys.stderr.write({MARKER!r} + {traceback!r})
        sys.exit(1)
    """)
    assert job_supervisor.supervise([], workdir, launch(1), program=program) == status
    err = capsys.readouterr().err
    if status == 75:
        assert err.splitlines() == [
            "error: the job lost a process: the connection to process 0, which coordinates "
            "the job, broke; process 1 stopped too (a host died, was preempted or was "
            "killed). Start every process again with the same command: the run resumes from "
            f"its last checkpoint (step 40 in {workdir})."]
    else:
        assert err == traceback


def test_a_fatal_report_before_the_job_met_is_a_start_up_error(workdir, capsys):
    """The service's abort while joining (no coordinator there, a process missing, an id
    twice): exit 2 and one line saying what to check, not 'lost a process'."""
    program = child("""
        import os, sys
        sys.stderr.write("F1204 03:08:55.9 20434 client.h:80] Terminating process because "
                         "the JAX distributed service detected fatal errors.\\n"
                         "RPC: /xla.coordination.CoordinationService/RegisterTask\\n")
        os.abort()
    """)
    assert job_supervisor.supervise([], workdir, launch(1), program=program) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: process 1 could not join the job: the coordinator at 127.0.0.1:1234 (process "
        "0) did not see all 2 processes within launch.initialization_timeout_s = 5 s. Start "
        "process 0 there and every other process with the same coordinator address and "
        "process count, each id once."]


def test_a_save_barrier_that_timed_out_names_the_process_that_never_came(workdir, capsys):
    """orbax's wait at a save's barrier ended (another process's write failed): one line
    naming it, exit 75."""
    traceback = ('Traceback (most recent call last):\n  File "multihost.py", line 309\n'
                 'jax.errors.JaxRuntimeError: DEADLINE_EXCEEDED: Barrier timed out. Id: '
                 '_async_write_complete.1::0.\n# of tasks that reached the barrier: 1/2.\n'
                 'The first task at the barrier: 0. Some timed out task names:\n1\n'
                 'TimeoutError: Timed out while waiting for async_write_complete barrier.\n')
    program = child(f"""
        import sys
        sys.stderr.write({MARKER!r} + {traceback!r})
        sys.exit(1)
    """)
    assert job_supervisor.supervise([], workdir, launch(0), program=program) == 75
    assert capsys.readouterr().err.splitlines() == [
        "error: process 1 did not finish writing a checkpoint within checkpoint_timeout_s "
        "(its own error says why: a full disk, a refused write); process 0 stopped too. Fix "
        "that host, then start every process again with the same command: the run resumes "
        f"from its last checkpoint (step 40 in {workdir})."]


def test_a_process_id_used_twice_is_named(workdir, capsys):
    """The service's report when a second process registers with a taken id: exit 2 and one
    line naming the id, for the processes that had joined and the one that could not."""
    report = ("E1204 04:18:43.5 4538 coordination_service.cc:518] [174] 1 unexpectedly tried "
              "to connect with a different incarnation. It has likely restarted.\n"
              "F1204 04:18:43.5 4546 client.h:80] Terminating process because the JAX "
              "distributed service detected fatal errors.\n")
    for marker in (MARKER, ""):
        program = child(f"""
            import os, sys
            sys.stderr.write({marker!r} + {report!r})
            sys.stderr.flush()
            os.abort()
        """)
        assert job_supervisor.supervise([], workdir, launch(0), program=program) == 2
        assert capsys.readouterr().err.splitlines() == [
            "error: process 1 of the job was started twice (a second process with that id "
            "registered while the first ran, or it restarted mid-job); process 0 stopped. "
            "Start every process once, each with its own process id, then the same command "
            "resumes from the last checkpoint."]
