"""Where a run's files live: a local folder or a Google Cloud Storage prefix, as an epath.

Every file the trainer reads or writes under ``--workdir`` (checkpoints, TensorBoard events,
``metrics.jsonl``, ``results.json``, ``config.json`` and its backups, the set-aside
checkpoints) goes through :class:`etils.epath.Path`: a local path uses the operating system as
before, ``gs://bucket/prefix`` goes through fsspec's ``gcsfs`` (the ``[gcs]`` extra), and orbax
writes the checkpoint arrays there with TensorStore's own ``gcs`` driver. Those are the two
kinds orbax can write checkpoints to (``orbax.checkpoint._src.serialization.tensorstore_utils``
sends ``gs://`` to TensorStore's ``gcs`` kvstore and anything else to its ``file`` kvstore), so
another scheme (``s3://``, ``az://``, ``hf://``) is refused at start with what to do instead.

Remote objects differ from files (docs/reliability.md, "Remote workdirs"): there is no
``flock`` (no workdir lock), no rename (``results.json`` is one upload, which GCS makes appear
whole or not at all), no append (``metrics.jsonl`` and the TensorBoard event file are written
as parts of bounded size, the current one uploaded whole at each flush:
:mod:`~contrastive_jax.training.run.progress`).
"""

from __future__ import annotations

import importlib.util
import os

from etils import epath

from contrastive_jax.errors import ConfigError, WorkdirError

REMOTE_SCHEMES = ("gs",)  # what orbax's TensorStore checkpoints can be written to besides files


def is_remote(path: str | os.PathLike) -> bool:
    """Whether ``path`` names remote storage (``scheme://...``) rather than a local path."""
    return "://" in os.fspath(path)


def workdir_path(workdir: str | os.PathLike) -> epath.Path:
    """``workdir`` as an :class:`etils.epath.Path`, checked: a local path (kept as given,
    relative or not) or ``gs://bucket[/prefix]`` with ``gcsfs`` installed.

    Raises :class:`~contrastive_jax.errors.WorkdirError` for an empty workdir and
    :class:`~contrastive_jax.errors.ConfigError` for a scheme orbax cannot write checkpoints
    to, a ``gs://`` path without a bucket, or ``gs://`` without the ``[gcs]`` extra.
    """
    text = os.fspath(workdir)
    if not text.strip():
        raise WorkdirError("--workdir is empty; give the directory for checkpoints and results")
    if not is_remote(text):
        return epath.Path(text)
    scheme, _, rest = text.partition("://")
    if scheme not in REMOTE_SCHEMES:
        raise ConfigError(
            f"--workdir={text}: a remote workdir must be gs://bucket/path (orbax writes "
            f"checkpoints to local paths and Google Cloud Storage only, not {scheme}://). "
            "Mount that storage as a local folder (a FUSE mount) and give its path instead.")
    if not rest.split("/")[0]:
        raise ConfigError(f"--workdir={text} names no bucket; use gs://BUCKET/path")
    if importlib.util.find_spec("gcsfs") is None:
        raise ConfigError(
            f"--workdir={text} needs the Google Cloud Storage client gcsfs: install this "
            "package with the gcs extra (pip install -e '.[train,gcs]')")
    return epath.Path(text)


def absolute(workdir: str | os.PathLike) -> epath.Path:
    """:func:`workdir_path`, made absolute with symbolic links resolved if local (orbax needs
    absolute checkpoint paths)."""
    path = workdir_path(workdir)
    return path if is_remote(path) else epath.Path(os.path.realpath(os.fspath(path)))


def write_probe(folder: str | os.PathLike | epath.Path) -> None:
    """Create ``folder`` (with its parents) and write and delete a small file of a unique name
    in it: what a folder that will be written must allow, found before any work. Raises what
    the storage raises (``OSError`` locally, with its errno; a storage client's own errors for
    a remote folder); each caller says it in its own words."""
    import uuid

    path = epath.Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    probe = path / f".write-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    probe.write_text("{}\n")
    probe.unlink()
