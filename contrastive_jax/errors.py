"""The errors this project raises for things a user can fix, one class per kind.

Every one is a :class:`ContrastiveJaxError`; the command line reports exactly these as a
one-paragraph ``error: ...`` and exit status 2, and lets anything else (a bug) raise with its
traceback. Each also derives from the built-in exception a Python user would expect
(``ValueError`` for bad settings and arguments), so ``except ValueError`` keeps working.
A write that the system refuses (disk full, file-size limit, read-only files) is the user's to
fix too: :func:`storage_cause` finds it in any exception's chain, and the command line reports
it the same way.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator

# set (to anything): a command raises a user's error, and prints a Ctrl-C's stacks, instead of
# its one line (contrastive_jax.command_line, contrastive_jax.interrupts)
TRACEBACK_ENV = "CONTRASTIVE_JAX_TRACEBACK"


class ContrastiveJaxError(Exception):
    """Base class: a problem with the user's input, settings, data or files, not a bug."""


class InputError(ContrastiveJaxError, ValueError):
    """An argument of a library function has the wrong rank, shape, dtype or value."""


class ConfigError(ContrastiveJaxError, ValueError):
    """A setting (config field, variant, command-line flag) that the user must change."""


class DataError(ContrastiveJaxError):
    """A dataset that is missing, unprepared or damaged."""


class DatasetNotPreparedError(DataError, FileNotFoundError):
    """A TFDS dataset is not prepared in the data dir, and nothing is downloaded at run time."""


class WorkdirError(ContrastiveJaxError, OSError):
    """The working directory cannot be created or written."""


class CheckpointError(ContrastiveJaxError, RuntimeError):
    """No checkpoint in the workdir can be restored into this run's state."""


class NonFiniteError(ContrastiveJaxError, RuntimeError):
    """Too many consecutive steps with a non-finite loss, gradient or update: the last of them
    is ``step``, and there were ``in_a_row`` (None when unknown)."""

    def __init__(self, message: str, *, step: int | None = None, in_a_row: int | None = None):
        super().__init__(message)
        self.step, self.in_a_row = step, in_a_row


# errno -> what to do about it, for writes that fail for a reason outside the program
STORAGE_ERRNOS = {
    errno.ENOSPC: "the disk is full: free space",
    errno.EDQUOT: "the disk quota is used up: free space or raise the quota",
    errno.EFBIG: "a file reached the file-size limit (`ulimit -f`): raise the limit",
    errno.EROFS: "the file system is read-only: choose a writable --workdir",
    errno.EACCES: "permission denied: make the workdir writable or choose another --workdir",
    errno.EPERM: "operation not permitted (read-only or immutable files?): make the workdir "
                 "writable or choose another --workdir",
}


def exception_chain(err: BaseException | None) -> Iterator[BaseException]:
    """``err`` and every exception it wraps (``__cause__``, ``__context__``, the members of an
    exception group), each once."""
    seen, todo = set(), [err]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__, *getattr(e, "exceptions", ())]


# TensorStore (orbax's array writer) reports an OS error inside its message, e.g.
# 'OUT_OF_RANGE: ... Failed writing: "PATH": ... File too large [os_error_code=\'27\']'
_OS_ERROR_CODE = re.compile(r"\[os_error_code='?(\d+)'?\]")
_FAILED_PATH = re.compile(r'Failed (?:writing|to write|opening)[^"]*"([^"]+)"')


def storage_cause(err: BaseException | None) -> OSError | None:
    """The first ``OSError`` in ``err``'s chain (``__cause__``, ``__context__``, exception
    groups) whose errno is one of :data:`STORAGE_ERRNOS` (disk full, file-size limit, read-only
    or forbidden files), or None: a failed write the user must fix, not a bug. An error of
    TensorStore (orbax's array writer, raised from its writer threads) that names such an OS
    error code counts too, as an ``OSError`` with that errno and the file it names."""
    for e in exception_chain(err):
        if isinstance(e, OSError):
            if e.errno in STORAGE_ERRNOS:
                return e
            continue
        code = _OS_ERROR_CODE.search(str(e))
        if code and int(code.group(1)) in STORAGE_ERRNOS:
            path = _FAILED_PATH.search(str(e))
            number = int(code.group(1))
            return OSError(number, os.strerror(number), path.group(1) if path else None)
    return None


def storage_message(cause: OSError, workdir: str | None = None) -> str:
    """One paragraph for a :func:`storage_cause`: the file (or else ``workdir``), the system's
    reason, the fix."""
    where = (f" {cause.filename}" if cause.filename
             else f" in the workdir {workdir}" if workdir else "")
    return (f"cannot write{where}: {cause.strerror or cause} ({STORAGE_ERRNOS[cause.errno]}). "
            "Then run the same command: the run resumes from its last complete checkpoint.")
