"""The JSON a run writes: strict (no bare ``NaN``) and, for whole files, atomic.

``results.json`` is written to a temporary file in the same directory, flushed to disk and
renamed over the old one, so a kill during the write leaves the previous file or the new one,
never a truncated one. On a remote workdir (``gs://``) the file is one upload, which the store
makes visible whole or not at all (an object has no partial state), so no rename is needed
(there is none). Non-finite floats (a diverged metric) become ``null``: Python's ``json``
would write bare ``NaN`` / ``Infinity``, which strict JSON readers reject.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import uuid
from typing import Any

from etils import epath

from contrastive_jax.training.run.workdir.workdir_path import is_remote


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
    """Write ``value`` as indented strict JSON to ``path`` atomically (local: temporary file +
    fsync + rename; remote: one whole-object upload through :class:`etils.epath.Path`)."""
    if is_remote(path):
        epath.Path(path).write_text(dumps(value, indent=2) + "\n")
        return
    path = pathlib.Path(path)
    # created with mode 0666 less the umask, as open() creates files (mkstemp's 0600 would
    # make a shared workdir's results unreadable to the others)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(dumps(value, indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
