"""One trainer per workdir: an exclusive lock on ``workdir/.lock`` held for the whole run
(and the same lock, :func:`folder_lock`, on the evaluation command's output folder).

Two trainers writing one workdir would save and delete each other's checkpoints. The lock is
``fcntl.flock`` on the file (process 0 takes it; the other processes of a multi-host run share
process 0's workdir). The operating system releases it when the holder exits in any way, so a
trainer killed with SIGKILL leaves no stale lock: the file stays, but nothing holds it, and the
next run takes it. The file names the holder (pid, host, start time) for the error message.
Remote workdirs (``gs://...``) have no advisory locks and are not locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pathlib
import socket
import time
from collections.abc import Callable, Iterator

import jax

from contrastive_jax.errors import ContrastiveJaxError, WorkdirError
from contrastive_jax.training.run.workdir.workdir_path import is_remote

LOCK_FILE = ".lock"


@contextlib.contextmanager
def workdir_lock(workdir: str | os.PathLike) -> Iterator[None]:
    """Hold ``workdir/.lock`` exclusively for the ``with`` block (on process 0, local paths).

    Raises :class:`~contrastive_jax.errors.WorkdirError`, naming the holder, if another
    process holds it.
    """
    if jax.process_index() != 0 or is_remote(workdir):
        yield
        return

    def refusal(holder: str) -> WorkdirError:
        return WorkdirError(
            f"workdir {workdir} is in use by another trainer ({holder}). Wait for it to "
            "finish, stop it, or choose another --workdir. (A trainer that was killed releases "
            "the lock by itself: there is nothing to delete.)")

    with folder_lock(workdir, refusal):
        yield


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike,
                refusal: Callable[[str], ContrastiveJaxError]) -> Iterator[None]:
    """Hold ``folder/.lock`` (a local folder that exists) exclusively for the ``with`` block,
    with ``fcntl.flock``: released by the operating system however the holder ends. The file
    names the holder (pid, host, start time); another process holding it raises
    ``refusal(holder)``, the holder as ``pid P on host H, started T``. Shared by the trainer's
    :func:`workdir_lock` and the evaluation command's output folder."""
    path = pathlib.Path(folder) / LOCK_FILE
    handle = open(path, "a+")  # held open for the whole block
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            raise refusal(_holder(handle.read())) from None
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}) + "\n")
        handle.flush()
        yield
    finally:
        handle.close()  # closing the file releases the lock


def _holder(text: str) -> str:
    """``pid P on host H, started T`` from the lock file's contents (or 'unknown holder')."""
    try:
        info = json.loads(text)
        return f"pid {info['pid']} on host {info['host']}, started {info['started']}"
    except (ValueError, KeyError, TypeError):
        return "unknown holder"
