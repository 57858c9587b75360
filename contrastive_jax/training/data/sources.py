"""Random-access sources for one split: TFDS ``data_source`` (array_record) or a generator.

Every dataset goes through :func:`open_split`: the package's own datasets are prepared on
first use (offline, see :mod:`contrastive_jax.training.data.prepare`); any other TFDS name
(``cifar10``,
``imagenet2012``, ``coco_captions``, or a dataset of your own) must already be prepared in
``data_dir`` as array_record files, exactly as on a pod. Those are opened from their prepared
folder alone (``tfds.builder_from_directory``: the ``dataset_info.json`` and ``features.json``
written by ``tfds build``), never through the dataset's TFDS code, so datasets whose builder
code needs TensorFlow (``coco_captions``) load without it. ``correlated_gaussians`` is
generated on the fly.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

import tensorflow_datasets as tfds
from etils import epath

from contrastive_jax.errors import (
    ConfigError,
    DataError,
    DatasetNotPreparedError,
    exception_chain,
)
from contrastive_jax.training.data.datasets.correlated_gaussians import (
    CorrelatedGaussians,
    correlation_for,
)
from contrastive_jax.training.data.prepare import is_local, prepare, resolve_data_dir

GENERATED = ("correlated_gaussians",)
STORAGE_TIMEOUT_S = 120.0  # the longest wait for a bucket's first answer (open_split)
STORAGE_TIMEOUT_ENV = "CONTRASTIVE_JAX_STORAGE_TIMEOUT_S"
RANDOM_ACCESS_FORMATS = ("array_record", "parquet")  # what tfds.data_source can read
# Options of the generated dataset (config fields ``data.<option>``); rho or mutual_information.
GAUSSIAN_OPTIONS = {"dim": 20, "rho": None, "mutual_information": None,
                    "num_examples": {"train": 100_000, "test": 10_000}}
GAUSSIAN_SPLIT_SEEDS = {"train": 0, "test": 1}


def prepare_command(name: str, data_dir: str) -> str:
    """The command that prepares ``name`` in ``data_dir``."""
    if is_local(name):
        return f"python -m contrastive_jax.training.data.prepare {name} --data_dir={data_dir}"
    return f"tfds build {name} --data_dir={data_dir} --file_format=array_record"


def open_split(name: str, split: str, data_dir: str | None = None,
               options: Mapping[str, Any] | None = None, *,
               decoders: Mapping[str, Any] | None = None, encoded_images: tuple[str, ...] = ()):
    """A random-access source (``len``, ``[i]`` -> dict of NumPy arrays) for ``name[split]``.

    ``split`` may be any TFDS split expression (``"train"``, ``"train[:90%]"``,
    ``"train+restval"``, ...). ``options`` only apply to generated datasets
    (``correlated_gaussians``: ``dim``, ``rho`` or ``mutual_information``, ``num_examples``).
    ``decoders``: TFDS decoders per feature, e.g. ``{"image": tfds.decode.SkipDecoding()}``
    to read captions without decoding images. ``encoded_images``: features read as their
    encoded bytes where they are TFDS ``Image`` features (a ``SkipDecoding`` decoder each; the
    image_text preprocessing decodes them itself). Errors:

    - :class:`DatasetNotPreparedError` naming the dataset, the data dir and the command that
      prepares it, when a TFDS dataset is not prepared (or not in array_record format);
    - ``ValueError`` for an unknown name or split;
    - :class:`DataError` when a ``gs://`` data dir does not answer within the bounded wait
      (:func:`within_timeout`: opening the split and reading its first record).
    """
    if name in GENERATED:
        return _gaussians(split, dict(options or {}))
    if options:
        raise ConfigError(f"options {sorted(options)} only apply to {GENERATED}; "
                         f"remove them for {name!r}")
    data_dir = resolve_data_dir(data_dir)
    if "://" in data_dir:  # a bucket: every remote call within a bounded wait
        try:
            return within_timeout(
                lambda: _first_read(_open(name, split, data_dir, decoders, encoded_images)),
                f"opening {name}[{split}] in {data_dir}")
        except DataError:
            raise
        except FileNotFoundError as err:  # the storage client's word for a missing bucket
            raise DatasetNotPreparedError(
                f"data_dir {data_dir} does not exist ({type(err).__name__}: {err}): check the "
                f"bucket's name, or copy the prepared dataset {name!r} there") from None
    return _open(name, split, data_dir, decoders, encoded_images)


def within_timeout(call: Callable[[], Any], what: str, seconds: float | None = None) -> Any:
    """``call()``, or a :class:`DataError` if it does not return within ``seconds`` (default
    ``$CONTRASTIVE_JAX_STORAGE_TIMEOUT_S``, else :data:`STORAGE_TIMEOUT_S`): a storage client
    that cannot reach its server retries for many minutes without a word. The call runs in a
    daemon thread, left behind on a timeout."""
    seconds = float(os.environ.get(STORAGE_TIMEOUT_ENV, STORAGE_TIMEOUT_S)
                    if seconds is None else seconds)
    box: dict[str, Any] = {}

    def run():
        try:
            box["value"] = call()
        except BaseException as err:  # handed to the caller's thread
            box["error"] = err

    thread = threading.Thread(target=run, daemon=True, name="storage-call")
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise DataError(
            f"{what} did not answer within {seconds:.0f} s. Check that the bucket exists and "
            "that this machine reaches Cloud Storage (network, credentials: `gcloud storage ls "
            f"{what.rsplit(' in ', 1)[-1]}`); {STORAGE_TIMEOUT_ENV}=SECONDS waits longer.")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _first_read(source):
    """``source``, after reading its first record (where a remote read would hang)."""
    if len(source):
        source[0]
    return source


def _open(name: str, split: str, data_dir: str, decoders, encoded_images):
    if is_local(name):
        builder = prepare(name, data_dir)
    else:
        builder = _prepared_builder(name, data_dir)
    unknown = [part for part in split_names(split) if part not in builder.info.splits]
    if unknown:
        raise ConfigError(f"dataset {name!r} has no split {unknown[0]!r} (in {split!r}); its "
                         f"splits: {sorted(builder.info.splits)}")
    features = builder.info.features
    skip = {key: tfds.decode.SkipDecoding() for key in encoded_images
            if key in features.keys() and isinstance(features[key], tfds.features.Image)}
    return builder.as_data_source(split=split, decoders={**skip, **(decoders or {})} or None)


def split_names(split: str) -> list[str]:
    """The split names in a TFDS split expression: ``"train[:90%]+restval"`` -> ``["train",
    "restval"]``."""
    return [part.split("[")[0].strip() for part in split.split("+")]


def prepared_dir(name: str, data_dir: str) -> epath.Path | None:
    """The folder ``tfds build`` wrote for ``name`` in ``data_dir``, or None.

    ``name`` is ``dataset[/config][:version]`` (``"coco_captions"``, ``"coco_captions/2014"``,
    ``"cifar10:3.0.2"``). The folder is ``data_dir/dataset/[config/]version`` holding a
    ``dataset_info.json``; without a config in the name, the dataset's only config folder is
    used (``coco_captions/2014``), and without a version the highest prepared one. Works on
    any ``etils.epath`` path (``gs://...``).
    """
    base, _, version = name.partition(":")
    dataset, _, config = base.partition("/")
    root = epath.Path(data_dir) / dataset
    if not root.is_dir():
        return None
    candidates = []  # (config folder, version folder)
    for first in root.iterdir():
        if not first.is_dir() or first.name.startswith("."):
            continue
        if (first / "dataset_info.json").exists() and not config:
            candidates.append(("", first))
        elif not config or first.name == config:
            candidates += [(first.name, v) for v in first.iterdir()
                           if v.is_dir() and (v / "dataset_info.json").exists()]
    candidates = [(c, v) for c, v in candidates
                  if not v.name.startswith("incomplete") and (not version or v.name == version)]
    if not candidates or len({c for c, _ in candidates}) > 1:
        return None
    return max(candidates, key=lambda cv: tfds.core.Version(cv[1].name))[1]


DAMAGED_RECORDS = ("Riegeli", "array_record", "ArrayRecord")  # in a reader's error message


def damaged_data_error(err: BaseException, name: str, data_dir: str | None = None
                       ) -> DataError | None:
    """A :class:`DataError` saying how to prepare ``name`` again, if ``err`` (or an exception
    in its chain) is a record reader's complaint about damaged files (a truncated or corrupted
    array_record file: "Corrupted Riegeli/records file: chunk data hash mismatch"); else None.
    Such damage only shows when the records are read, so the trainer converts it there."""
    for e in exception_chain(err):
        text = str(e)
        if any(marker in text for marker in DAMAGED_RECORDS) and not isinstance(e, DataError):
            data_dir = resolve_data_dir(data_dir)
            first = text.strip().splitlines()[0][:200] if text.strip() else type(e).__name__
            return DataError(
                f"the record files of dataset {name!r} in {data_dir} are damaged (truncated or "
                f"corrupted: {first}). Prepare it again with\n    "
                f"{prepare_command(name, data_dir)} --overwrite\nthen run the same command.")
    return None


def _prepared_builder(name: str, data_dir: str) -> tfds.core.DatasetBuilder:
    """The read-only builder of ``name`` prepared in ``data_dir`` (no dataset code runs)."""
    command = prepare_command(name, data_dir)
    folder = prepared_dir(name, data_dir)
    if folder is None:
        dataset = name.partition(":")[0].partition("/")[0]
        root = epath.Path(data_dir)
        present = sorted(p.name for p in root.iterdir() if p.is_dir()
                         and p.name != "downloads") if root.is_dir() else []
        if dataset not in tfds.list_builders(with_community_datasets=False) and not (
                root / dataset).exists():
            raise ConfigError(f"unknown dataset {name!r}: not a TFDS dataset and not found in "
                              f"data_dir {data_dir} (present there: {present})")
        raise DatasetNotPreparedError(
            f"dataset {name!r} is not prepared in data_dir {data_dir} (present there: "
            f"{present}; with several configs or none found, name one: 'dataset/config'), "
            "and this program never downloads. Prepare it on a machine with internet access "
            f"(and TensorFlow, which tfds build needs for some datasets) with\n    {command}\n"
            "and copy the folder into this data_dir, or set data.data_dir to where it is.")
    builder = tfds.builder_from_directory(folder)
    file_format = getattr(builder.info.file_format, "value", builder.info.file_format)
    if file_format not in RANDOM_ACCESS_FORMATS:
        raise DatasetNotPreparedError(
            f"dataset {name!r} in {data_dir} is prepared as {file_format or 'tfrecord'}, but "
            f"random access needs array_record. Re-prepare it with\n    {command} --overwrite")
    return builder


def _gaussians(split: str, options: dict[str, Any]) -> CorrelatedGaussians:
    unknown = set(options) - set(GAUSSIAN_OPTIONS)
    if unknown:
        raise ConfigError(f"unknown correlated_gaussians options {sorted(unknown)}; "
                         f"valid: {sorted(GAUSSIAN_OPTIONS)}")
    if split not in GAUSSIAN_SPLIT_SEEDS:
        raise ConfigError(f"correlated_gaussians has splits {sorted(GAUSSIAN_SPLIT_SEEDS)}; "
                         f"got {split!r}")
    opts = {**GAUSSIAN_OPTIONS, **{k: v for k, v in options.items() if v is not None}}
    if (opts["rho"] is None) == (opts["mutual_information"] is None):
        raise ConfigError("correlated_gaussians needs exactly one of data.rho and "
                         "data.mutual_information")
    rho = opts["rho"]
    if rho is None:
        rho = correlation_for(opts["mutual_information"], opts["dim"])
    num = opts["num_examples"]
    num = num[split] if isinstance(num, Mapping) else num
    return CorrelatedGaussians(int(num), int(opts["dim"]), float(rho),
                               seed=GAUSSIAN_SPLIT_SEEDS[split])
