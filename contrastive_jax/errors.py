"""The errors this project raises for things a user can fix, one class per kind.

Every one is a :class:`ContrastiveJaxError`; the command line reports exactly these as a
one-paragraph ``error: ...`` and exit status 2, and lets anything else (a bug) raise with its
traceback. Each also derives from the built-in exception a Python user would expect
(``ValueError`` for bad settings and arguments), so ``except ValueError`` keeps working.
"""

from __future__ import annotations


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
