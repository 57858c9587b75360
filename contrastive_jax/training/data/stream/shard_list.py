"""Which shards a stream reads, and which of them each reader takes in each epoch.

``data.shards`` holds one or more patterns (whitespace-separated): brace lists and ranges
(``{00000..41407}``), globs, local paths or ``gs://`` (:func:`~contrastive_jax.training.data.
shard_readers.input_files`). They expand, once, to the run's shard list ``S_0 .. S_{N-1}``
(in the patterns' order). A run has ``R = P W`` readers: ``P`` processes, each with ``W``
grain worker processes (``data.worker_count``, at least one reader per process). Reader
``r = p W + w`` reads, in epoch ``e``::

    order_e = permutation of 0..N-1 drawn from (data.seed, e)     (identity: data.shuffle=False)
    shards(r, e) = order_e[p::P][w::W]

so every epoch each shard is read by exactly one reader, and the readers' lists differ in
length by at most one. References: docs/data.md, "Your own image-text shards".
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
from etils import epath

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.data.shard_readers import input_files

TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
PARQUET_SUFFIXES = (".parquet",)


def split_patterns(patterns: str | Sequence[str], field: str = "data.shards") -> list[str]:
    """The patterns of a config field: a whitespace-separated string or a sequence."""
    items = patterns.split() if isinstance(patterns, str) else [str(p) for p in patterns]
    if not items:
        raise ConfigError(f"{field} is empty: give the shards' pattern, e.g. "
                          f"{field}='gs://BUCKET/laion/{{00000..41407}}.tar'")
    return items


def shard_format(path: str) -> str:
    """``"tar"`` or ``"parquet"`` by the file's name; a ConfigError otherwise."""
    name = path.lower()
    if name.endswith(TAR_SUFFIXES):
        return "tar"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    raise ConfigError(f"shard {path!r} is neither a webdataset tar ({', '.join(TAR_SUFFIXES)}) "
                      f"nor a parquet file: change the pattern so that it names only shards")


def list_shards(patterns: str | Sequence[str], field: str = "data.shards", *,
                image_column: str = "jpg", caption_column: str = "caption") -> list[str]:
    """The shard list of ``patterns``, checked: every name a tar or parquet file, the first
    tar a tar (its header), the first parquet file holding the two columns. A ConfigError
    saying what to change otherwise (a pattern matching nothing, a file of another kind)."""
    files = input_files(split_patterns(patterns, field), flag=field)
    kinds = [shard_format(f) for f in files]
    if "tar" in kinds:
        _check_tar(files[kinds.index("tar")])
    if "parquet" in kinds:
        check_parquet_columns(files[kinds.index("parquet")], image_column, caption_column)
    return files


def _check_tar(path: str) -> None:
    """A ConfigError if ``path`` (named ``.tar``) is not a tar: the magic of its first
    header (``ustar`` at byte 257; a gzip file's magic for ``.tar.gz``)."""
    with epath.Path(path).open("rb") as f:
        head = f.read(512)
    gzipped = head[:2] == b"\x1f\x8b"
    if (path.lower().endswith(".tar") and head[257:262] != b"ustar") or (
            path.lower().endswith((".tar.gz", ".tgz")) and not gzipped):
        raise ConfigError(f"shard {path} is not a tar file (its first bytes are not a tar "
                          "header): check data.shards")


def check_parquet_columns(path: str, image_column: str, caption_column: str) -> None:
    """A ConfigError naming the columns present and the field to set, if the parquet file
    ``path`` lacks ``image_column`` or ``caption_column`` (its footer only is read)."""
    try:
        import pyarrow.parquet as pq
    except ImportError as err:
        raise ConfigError("reading parquet shards needs pyarrow: pip install pyarrow") from err
    with epath.Path(path).open("rb") as f:
        try:
            names = pq.ParquetFile(f).schema_arrow.names
        except Exception as err:  # pyarrow's ArrowInvalid: not a parquet file
            raise ConfigError(f"shard {path} is not a parquet file ({err}): check "
                              "data.shards") from None
    for column, field in ((image_column, "data.image_column"),
                          (caption_column, "data.caption_column")):
        if column not in names:
            raise ConfigError(f"shard {path} has no column {column!r} (its columns: {names}); "
                              f"set {field}")


def check_readers(shards: int, processes: int, workers: int) -> None:
    """A ConfigError unless every reader gets a shard: ``shards >= processes * workers``."""
    readers = processes * max(1, workers)
    if shards < readers:
        raise ConfigError(
            f"{shards} shard(s) for {processes} process(es) x {max(1, workers)} input "
            f"worker(s) = {readers} readers: each reader needs at least one shard; give "
            f"at least {readers} shards or lower data.worker_count to "
            f"{max(1, shards // processes)}" if shards >= processes else
            f"{shards} shard(s) for {processes} processes: each process needs at least one "
            f"shard; give at least {processes} shards")


def epoch_order(count: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The shards' order in ``epoch`` (module docstring): a permutation of ``0..count-1``."""
    if not shuffle:
        return np.arange(count)
    return np.random.default_rng((seed, epoch)).permutation(count)


def reader_shards(count: int, seed: int, epoch: int, *, process: int, processes: int,
                  worker: int, workers: int, shuffle: bool = True) -> list[int]:
    """The shard indices reader ``(process, worker)`` reads in ``epoch``, in order."""
    order = epoch_order(count, seed, epoch, shuffle)
    return [int(i) for i in order[process::processes][worker::max(1, workers)]]


def shards_digest(files: Sequence[str]) -> str:
    """SHA-256 (first 16) of the shard list: what a resumed stream must read again."""
    return hashlib.sha256("\n".join(files).encode()).hexdigest()[:16]
