"""One trainer per workdir: a second one stops with a message naming the first; a killed
holder leaves no stale lock."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from contrastive_jax.errors import WorkdirError
from contrastive_jax.training import train
from contrastive_jax.training.run.workdir.workdir_lock import LOCK_FILE, workdir_lock

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
import forked_command_lines  # noqa: E402
from test_reliability import command, quick  # noqa: E402
from xla_environment import child_environment  # noqa: E402

HOLDER = ("import sys; from contrastive_jax.training.run.workdir.workdir_lock import workdir_lock\n"
          "with workdir_lock(sys.argv[1]):\n"
          "    print('locked', flush=True)\n"
          "    sys.stdin.read()  # hold it until the test closes stdin or kills us\n")


def _hold(workdir: Path) -> subprocess.Popen:
    """A real process holding ``workdir``'s lock (it prints 'locked' once it does)."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(workdir)], cwd=REPO,
                              env=child_environment(), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_a_second_trainer_stops_naming_the_first_and_a_killed_one_leaves_no_lock(tmp_path):
    holder = _hold(tmp_path)
    try:
        info = json.loads((tmp_path / LOCK_FILE).read_text())
        assert info["pid"] == holder.pid
        with pytest.raises(WorkdirError, match=rf"in use by another trainer \(pid {holder.pid} "
                                               r"on host .*choose another --workdir"):
            train.train_and_evaluate(quick(), str(tmp_path))
        assert not (tmp_path / "checkpoints").exists()  # stopped before touching anything
        # the command line: exit 2, one paragraph
        cli = forked_command_lines.run(command(tmp_path, "--config.total_steps=2"))
        assert cli.returncode == 2, cli.stderr[-2000:]
        assert cli.stderr.startswith("error: workdir") and "Traceback" not in cli.stderr
    finally:
        os.kill(holder.pid, signal.SIGKILL)  # kill -9: no chance to clean up
        holder.wait()
    assert (tmp_path / LOCK_FILE).exists()  # the file stays; nothing holds it
    results = train.train_and_evaluate(quick(), str(tmp_path))  # the quick config's 6 steps
    assert results["steps"] == 6


def test_the_lock_is_released_when_the_block_ends_even_by_an_error(tmp_path):
    with pytest.raises(RuntimeError, match="boom"), workdir_lock(tmp_path):
        with pytest.raises(WorkdirError, match="in use"), workdir_lock(tmp_path):
            pass  # a second open file description: refused even within one process
        raise RuntimeError("boom")
    with workdir_lock(tmp_path):  # free again
        pass
