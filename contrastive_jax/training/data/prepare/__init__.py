"""Build the package's own datasets into a TFDS data dir, once, offline.

``mnist1d``, ``digits``, ``digit_captions/{mnist1d,digits,canvas}`` and ``shapes`` are TFDS
builders whose data are generated or shipped by a package, so preparing them needs no network.
They are written as array_record files (random access, no TensorFlow needed to write or read) into
``data_dir/<name>/<version>/`` and reused afterwards.

Building is idempotent (a prepared dataset is left untouched) and safe to interrupt: TFDS
writes into ``incomplete.*`` folders and renames them only when every split is written; an
interrupted build leaves only such a folder, which the next build removes. A lock file
(``data_dir/<name>.lock``) serialises builds of one dataset by processes on one machine
(several hosts of a loopback run, parallel test workers).

Command line (the command named by the "not prepared" errors)::

    python -m contrastive_jax.training.data.prepare mnist1d digits digit_captions/mnist1d \\
        shapes [--data_dir=DIR]
    python -m contrastive_jax.training.data.prepare --mock coco_captions [--data_dir=DIR]
    python -m contrastive_jax.training.data.prepare --mock imagenet2012 [--data_dir=DIR]

``--mock NAME`` writes a tiny copy of ``coco_captions`` or ``imagenet2012`` with random examples
(the real builder's features and splits; :mod:`~contrastive_jax.training.data.mock_datasets`),
for the pod template's ``tiny`` variant and the ImageNet runs' tests.

The data dir is, in order: ``--data_dir`` / the config's ``data.data_dir``, the
``CONTRASTIVE_JAX_DATA_DIR`` environment variable, ``$XDG_CACHE_HOME/contrastive_jax/datasets``
(``~/.cache/contrastive_jax/datasets`` when unset).
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import logging
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import tensorflow_datasets as tfds
from absl import flags
from etils import epath

from contrastive_jax import command_line

# Importing the modules registers the builders with TFDS.
from contrastive_jax.errors import ConfigError, DataError
from contrastive_jax.training.data.datasets import digit_captions, digits, mnist1d, shapes

LOCAL_DATASETS = {
    "mnist1d": mnist1d.Mnist1d,
    "digits": digits.Digits,
    "digit_captions": digit_captions.DigitCaptions,
    "shapes": shapes.Shapes,
}
LOCAL_NAMES = ("mnist1d", "digits", "digit_captions/mnist1d", "digit_captions/digits",
               "digit_captions/canvas", "shapes")
DATA_DIR_ENV = "CONTRASTIVE_JAX_DATA_DIR"


def default_data_dir() -> str:
    """``$CONTRASTIVE_JAX_DATA_DIR``, else ``$XDG_CACHE_HOME`` (or ``~/.cache``) / contrastive_jax /
    datasets."""
    if os.environ.get(DATA_DIR_ENV):
        return os.environ[DATA_DIR_ENV]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "contrastive_jax", "datasets")


def resolve_data_dir(data_dir: str | None) -> str:
    """``data_dir`` if given, else :func:`default_data_dir`."""
    return data_dir if data_dir else default_data_dir()


def is_local(name: str) -> bool:
    """Whether ``name`` (``base`` or ``base/config``) is one of the package's own datasets."""
    return name.split("/")[0].split(":")[0] in LOCAL_DATASETS


def prepare(name: str, data_dir: str | None = None, *, verbose: bool = True,
            overwrite: bool = False) -> tfds.core.DatasetBuilder:
    """Prepare the package dataset ``name`` in ``data_dir`` unless it is already; its builder.

    ``name`` is one of :data:`LOCAL_NAMES`. Another TFDS name is a ValueError (those are
    prepared with ``tfds build``; this program never downloads). A damaged copy (files without
    ``dataset_info.json``, or no splits) is removed and generated again, with a message;
    ``overwrite`` regenerates it in any case (damaged record files are only found on reading).
    """
    if not is_local(name):
        raise ConfigError(f"{name!r} is not one of this package's datasets {list(LOCAL_NAMES)}; "
                         "prepare TFDS datasets with `tfds build NAME --data_dir=DIR "
                         "--file_format=array_record`")
    data_dir = resolve_data_dir(data_dir)
    with _quiet_tfds():
        builder = tfds.builder(name, data_dir=data_dir, file_format="array_record")
        ready = not overwrite and _complete(builder)
    if ready:
        return builder
    if "://" in data_dir:  # a bucket: read there, never built there (no lock, no rename)
        from contrastive_jax.errors import DatasetNotPreparedError

        raise DatasetNotPreparedError(
            f"dataset {name!r} is not prepared in data_dir {data_dir} "
            f"({_damage(builder) if epath.Path(builder.data_dir).exists() else 'not there'}); "
            "prepare it on a local disk and copy it:\n"
            f"    python -m contrastive_jax.training.data.prepare {name} --data_dir=DIR\n"
            f"    gcloud storage cp -r DIR/{name.split('/')[0]} {data_dir}/")
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    with _lock(Path(data_dir) / f"{name.replace('/', '.')}.lock"), _quiet_tfds():
        builder = tfds.builder(name, data_dir=data_dir, file_format="array_record")
        if not overwrite and _complete(builder):  # another process built it while we waited
            return builder
        version_dir = Path(builder.data_dir)
        if version_dir.exists():  # generated data: regenerated exactly, nothing is lost
            why = "--overwrite" if overwrite else "damaged: " + _damage(builder)
            if verbose:
                print(f"removing {name} in {version_dir} ({why}) to generate it again",
                      file=sys.stderr, flush=True)
            shutil.rmtree(version_dir)
            builder = tfds.builder(name, data_dir=data_dir, file_format="array_record")
        _remove_incomplete(version_dir)
        start = time.perf_counter()
        if verbose:
            print(f"preparing {name} in {data_dir} (once) ...", file=sys.stderr, flush=True)
        tfds.disable_progress_bar()  # our one line instead of TFDS's per-split bars
        builder.download_and_prepare(
            file_format="array_record",
            download_config=tfds.download.DownloadConfig(try_download_gcs=False))
        if not _complete(builder):
            raise DataError(f"preparing {name} in {data_dir} left an incomplete copy "
                            f"({_damage(builder)}); remove {version_dir} and try again")
        if verbose:
            print(f"prepared {name} in {time.perf_counter() - start:.1f} s",
                  file=sys.stderr, flush=True)
    return builder


def _complete(builder: tfds.core.DatasetBuilder) -> bool:
    """Prepared, with its ``dataset_info.json`` and at least one split of examples."""
    return builder.is_prepared() and not _damage(builder)


def _damage(builder: tfds.core.DatasetBuilder) -> str:
    """What is wrong with a prepared copy ('' if nothing visible without reading it)."""
    version_dir = epath.Path(builder.data_dir)  # local or gs://
    if not (version_dir / "dataset_info.json").exists():
        return "no dataset_info.json"
    splits = builder.info.splits
    if not splits or not all(info.num_examples for info in splits.values()):
        return "no splits recorded in dataset_info.json"
    missing = [name for info in splits.values() for name in info.filenames
               if not (version_dir / name).exists()]
    return f"missing record files {missing[:3]}" if missing else ""


def _remove_incomplete(version_dir: Path) -> None:
    """Remove the ``incomplete.*`` folders an interrupted build left beside ``version_dir``."""
    parent = version_dir.parent
    if parent.is_dir():
        for stale in parent.glob(f"incomplete.*_{version_dir.name}"):
            shutil.rmtree(stale, ignore_errors=True)


@contextlib.contextmanager
def _quiet_tfds():
    """TFDS's own lines off while it builds a local dataset: its "Downloading and preparing"
    (nothing is downloaded) and absl warnings about the folder it is about to write; this
    module prints one line of its own instead."""
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        absl_logger.setLevel(level)


@contextlib.contextmanager
def _lock(path: Path):
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


FLAGS = flags.FlagValues()  # this command's own (contrastive_jax.command_line)
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, f"TFDS data dir (default: ${DATA_DIR_ENV}, else "
    "$XDG_CACHE_HOME/contrastive_jax/datasets, ~/.cache when unset)", flag_values=FLAGS)
_OVERWRITE = flags.DEFINE_bool("overwrite", False,
                               "generate again even if prepared (damaged record files)",
                               flag_values=FLAGS)
_MOCK = flags.DEFINE_multi_string(
    "mock", None, "write a tiny copy of a real dataset with random examples (coco_captions, "
    "imagenet2012), for the pod template's tiny variant and tests", flag_values=FLAGS)
COMMAND = command_line.Command(
    program="python -m contrastive_jax.training.data.prepare", doc=__doc__, flag_values=FLAGS,
    positional="[NAME ...]")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m contrastive_jax.training.data.prepare [NAME ...] [--data_dir=DIR]``
    (``argv``: its arguments, ``sys.argv[1:]`` when None); the exit status, 2 with one line
    ``error: ...`` for a name that is not one of :data:`LOCAL_NAMES` or an unknown mock
    (:func:`contrastive_jax.command_line.run_command`)."""
    return command_line.run_command(COMMAND, _prepare_named, argv)


def _prepare_named(names: list[str]) -> None:
    """Prepare ``names`` (and the ``--mock`` datasets), printing each one's folder and
    splits."""
    mocks = _MOCK.value or []
    if mocks:
        from contrastive_jax.training.data import mock_datasets

        unknown = [m for m in mocks if m not in mock_datasets.MOCKS]
        if unknown:
            raise ConfigError(f"no mock of {unknown[0]!r}; mocks: {list(mock_datasets.MOCKS)}")
        data_dir = resolve_data_dir(_DATA_DIR.value)
        tfds.display_progress_bar(False)
        for name in mocks:
            with _quiet_tfds():
                builder = mock_datasets.prepare_mock(name, data_dir)
            splits = {s: info.num_examples for s, info in builder.info.splits.items()}
            print(f"{name} (mock, random examples): {builder.data_dir} {splits}")
    elif not names:
        names = list(LOCAL_NAMES)
    for name in names:
        if not is_local(name):
            raise ConfigError(f"{name!r} is not one of {list(LOCAL_NAMES)}; other TFDS "
                              "datasets are prepared with `tfds build NAME --data_dir=DIR "
                              "--file_format=array_record`")
    for name in names:
        builder = prepare(name, _DATA_DIR.value, overwrite=_OVERWRITE.value)
        splits = {s: info.num_examples for s, info in builder.info.splits.items()}
        print(f"{name}: {builder.data_dir} {splits}")
