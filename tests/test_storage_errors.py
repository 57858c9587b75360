"""Writes the system refuses (file-size limit, read-only checkpoints, disk full) end a run with
exit 2 and one paragraph, at once, and a rerun of the same config finishes once the cause is
fixed (the command's exit status and message are checked in a child process, forked by
tests/forked_command_lines.py's server, the reruns and first runs in this process)."""

import contextlib
import errno
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from contrastive_jax.errors import storage_cause, storage_message
from contrastive_jax.training import train

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
import forked_command_lines  # noqa: E402
from test_reliability import command, quick  # noqa: E402
from trained_workdirs import simclr_quick_workdir  # noqa: E402


def test_storage_cause_walks_the_exception_chain():
    full = OSError(errno.ENOSPC, "No space left on device", "/w/checkpoints/4/state")
    try:
        try:
            raise full
        except OSError as inner:
            raise RuntimeError("orbax: commit failed") from inner
    except RuntimeError as outer:
        assert storage_cause(outer) is full
    tensorstore = ValueError(  # orbax's array writer, from its writer threads
        'OUT_OF_RANGE: Error writing "params.w/0" in OCDBT database at local file "/w/ck/": '
        'Failed writing: "/w/ck/d/89ab": Failed to write 114536 bytes to file 11: File too '
        "large [os_error_code='27']")
    cause = storage_cause(tensorstore)
    assert (cause.errno, cause.filename) == (errno.EFBIG, "/w/ck/d/89ab")
    assert storage_cause(ValueError("DATA_LOSS: [os_error_code='2']")) is None  # not a refusal
    group = ExceptionGroup("writes", [ValueError("x"), OSError(errno.EFBIG, "File too large")])
    assert storage_cause(TimeoutError("wait")) is None
    assert storage_cause(group).errno == errno.EFBIG
    assert storage_cause(OSError(errno.ENOENT, "No such file")) is None  # not a refusal
    assert storage_message(full) == (
        "cannot write /w/checkpoints/4/state: No space left on device (the disk is full: free "
        "space). Then run the same command: the run resumes from its last complete checkpoint.")
    assert "in the workdir /w" in storage_message(OSError(errno.EFBIG, "File too large"), "/w")


# 16 KiB: a file orbax writes itself fails (an OSError); 12 KiB: one of TensorStore's, from
# orbax's writer threads (a ValueError naming the OS error code, with a traceback from each
# pending write and "Event loop is closed" from each late callback before it was handled)
@pytest.mark.parametrize("kib", [16, 12], ids=["orbax-file", "tensorstore-writer"])
def test_a_file_size_limit_during_a_save_is_one_paragraph_and_the_rerun_resumes(tmp_path,
                                                                               capsys, kib):
    """The command under a file-size limit: exit 2, one line. The rerun of the same config
    (in this process: the workdir is the subject, not the process) finishes."""
    from contrastive_jax.training.data import open_split

    open_split("mnist1d", "train")  # prepared (in the session's data dir) before the limit
    args = command(tmp_path, "--config.total_steps=6", "--config.checkpoint_every=3")
    limited = forked_command_lines.run(args, file_size_limit=kib * 1024)  # as ulimit -f
    assert limited.returncode == 2, limited.stderr[-3000:]
    errors = [line for line in limited.stderr.splitlines() if line.strip()
              and "Warning" not in line and "warn(" not in line]
    assert len(errors) == 1, limited.stderr[-3000:]  # no orbax tracebacks either
    assert errors[0].startswith("error: cannot write") and "file-size limit" in errors[0]
    capsys.readouterr()
    rerun = train.train_and_evaluate(quick(total_steps=6, checkpoint_every=3, log_every=1),
                                     str(tmp_path))
    assert rerun["steps"] == 6 and "done in" in capsys.readouterr().out


@contextlib.contextmanager
def _unwritable(folder: Path):
    """Make ``folder`` refuse new files: its mode (a normal user), the immutable attribute
    (root, on file systems that have it), or else replace it by a plain file."""
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    how = "mode"
    if os.access(folder, os.W_OK):  # root ignores the mode
        folder.chmod(0o755)
        if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0:
            how = "immutable"
        else:
            for child in folder.iterdir():
                subprocess.run(["rm", "-rf", str(child)], check=True)
            folder.rmdir()
            folder.write_text("not a folder")
            how = "file"
    try:
        yield how
    finally:
        if how == "immutable":
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        elif how == "mode":
            folder.chmod(0o755)


def test_a_read_only_checkpoint_folder_is_refused_at_start(tmp_path):
    # a 6-step run's workdir (tests/trained_workdirs.py); the command would resume it
    simclr_quick_workdir(tmp_path)
    with _unwritable(tmp_path / "checkpoints"):
        # it used to wait 300 s for orbax's directory creation and then print a TimeoutError
        run = forked_command_lines.run(command(tmp_path, "--config.total_steps=9",
                                               "--config.checkpoint_every=3"), timeout=120)
    assert run.returncode == 2, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    assert "error: the checkpoint folder" in run.stderr and "is not writable" in run.stderr
