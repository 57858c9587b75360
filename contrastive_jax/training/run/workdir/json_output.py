"""The JSON a run writes: strict (no bare ``NaN``) and, for whole files, atomic.

``results.json`` is written to a temporary file in the same directory, flushed to disk and
renamed over the old one, so a kill during the write leaves the previous file or the new one,
never a truncated one. On a remote workdir (``gs://``) the file is one upload, which the store
makes visible whole or not at all (an object has no partial state), so no rename is needed
(there is none). Non-finite floats (a diverged metric) become ``null``: Python's ``json``
would write bare ``NaN`` / ``Infinity``, which strict JSON readers reject.

A Ctrl-C during a command lets :func:`write_atomic` finish its file first
(:func:`contrastive_jax.interrupts.finish_before_interrupt`), so the command's exit leaves
no temporary file behind. :func:`unwritable` says, before any work, why a path given on the
command line (the plan's ``--json``) could not be written.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import uuid
from typing import Any

from etils import epath

from contrastive_jax.interrupts import finish_before_interrupt
from contrastive_jax.training.run.workdir.workdir_path import is_remote, write_probe


def strict(value: Any) -> Any:
    """``value`` with every non-finite float (Python or NumPy scalar) replaced by ``None``."""
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # NumPy / JAX scalars
        return strict(value.item())
    return value


def dumps(value: Any, **kwargs) -> str:
    """``json.dumps`` of :func:`strict` ``(value)``; never emits ``NaN`` or ``Infinity``."""
    return json.dumps(strict(value), allow_nan=False, **kwargs)


def write_atomic(path: str | os.PathLike, value: Any) -> None:
    """Write ``value`` as indented strict JSON to ``path`` atomically
    (:func:`write_text_atomic`)."""
    write_text_atomic(path, dumps(value, indent=2) + "\n")


def temporary_files(folder: str | os.PathLike, name: str) -> list[pathlib.Path]:
    """The temporary files :func:`write_text_atomic` of ``folder/name`` leaves when its
    process is killed mid-write (``.NAME.PID.HEX.tmp``)."""
    return sorted(pathlib.Path(folder).glob(f".{name}.*.tmp"))


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` atomically (local: a temporary file of this writer's own
    name, ``.NAME.PID.HEX.tmp`` beside it, fsync, rename; removed if the write fails; remote:
    one whole-object upload through :class:`etils.epath.Path`). A Ctrl-C that ends a command
    meanwhile waits for it (:func:`finish_before_interrupt`)."""
    with finish_before_interrupt():
        if is_remote(path):
            epath.Path(path).write_text(text)
            return
        path = pathlib.Path(path)
        # created with mode 0666 less the umask, as open() creates files (mkstemp's 0600 would
        # make a shared workdir's results unreadable to the others)
        tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "w", newline="") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            pathlib.Path(tmp).unlink(missing_ok=True)
            raise


def unwritable(path: str | os.PathLike) -> str | None:
    """Why :func:`write_atomic` could not write ``path``, in words that say what to change,
    or None when it can: checked before any work, so that a bad path is not found after it.

    Local: ``path`` must not be a folder (nor end with ``/``) or another kind of file than a
    regular one (a device such as ``/dev/null``, which the rename would replace), its folder
    must exist and take a new file (a probe file is created there and removed: this finds a
    missing permission, a read-only file system, a full inode table). Remote
    (``gs://...``): a probe object is written beside it and removed (credentials, bucket,
    permissions). A write can still fail later for a reason that comes later (the disk
    fills up, the file-size limit).
    """
    text = os.fspath(path)
    if not text.strip():
        return "the path is empty; give the path of a file"
    if is_remote(text):
        try:
            write_probe(epath.Path(text).parent)
        except Exception as err:  # the store's client raises its own kinds
            reason = getattr(err, "strerror", None) or f"{type(err).__name__}: {err}"
            return f"cannot write beside {text} ({reason}); choose another path"
        return None
    local = pathlib.Path(text)
    if text.endswith(("/", os.sep)) or local.is_dir():
        return f"{text} is a folder; give the path of a file (in it, or elsewhere)"
    if local.exists() and not local.is_file():
        return f"{text} is not a regular file; give the path of a file"
    folder = local.parent
    if not folder.is_dir():
        existing = next((p for p in folder.parents if p.exists()), None) \
            if not folder.exists() else folder
        if existing is not None and existing.exists() and not existing.is_dir():
            return f"{existing} is a file, not a folder; choose another path"
        return f"the folder {folder} does not exist; create it or choose another path"
    try:
        write_probe(folder)
    except OSError as err:
        return (f"cannot create a file in {folder} ({err.strerror}); make the folder "
                "writable or choose another path")
    return None
