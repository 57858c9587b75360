"""grain input pipelines: per-host shards of a TFDS split, assembled into global batches.

Training stream, for a split of ``n`` examples, seed ``s``, global batch ``G``, and ``P``
processes (``jax.process_count()``; this one is ``p = jax.process_index()``)::

    source ─ shuffle(s) ─ repeat ─ [p::P] ─ preprocess ─ batch(G / P) ─ prefetch ─ global_batch
    (one permutation per epoch,    (host p's      (NumPy: grain        (one jax.Array
     seed s + epoch, grain's        slice)         threads, or worker   sharded over "data")
     index shuffle)                                processes)

Positions ``k G .. (k + 1) G - 1`` of the shuffled, repeated stream form global batch ``k``;
host ``p`` reads the positions ``= p (mod P)`` of it. So the *set* of examples in global batch
``k`` is the same for any number of processes (only its row order differs), the hosts' shards
are disjoint, and over one epoch their union is the split. Every step's global batch is
assembled with :func:`contrastive_jax.mesh.global_batch` (rows of process ``p`` on its own
devices).

The returned iterators are grain ``DatasetIterator`` s: ``get_state()`` / ``set_state()`` (a
small JSON-able dict: the next position, and each worker's with ``data.worker_count > 0``)
restore the exact stream, and ``grain.checkpoint.CheckpointSave(iterator)`` saves them with
orbax (one file per process).

**Workers.** ``data.num_threads`` grain threads read and preprocess in this process;
``data.worker_count = k > 0`` runs the pipeline up to the batches in ``k`` worker processes
(grain's ``mp_prefetch``: worker ``i`` makes batches ``i, i + k, ...``, interleaved back in
order), for preprocessing that holds the GIL (image decoding and resizing). The batches, their
order and a resume are the same for any ``k``; a resumed run must keep the ``k`` of the run it
resumes (the saved state holds each worker's position).

Evaluation stream (:func:`eval_iterator`): one pass in the split's order, no shuffle, the last
global batch padded with zero examples and a boolean ``mask`` feature (False on padding), so
every host runs the same number of steps.

What each example becomes on the way (decoded, cropped, tokenised; the ``data.preprocess``
block): :mod:`~contrastive_jax.training.data.example_preprocessing`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Callable
from typing import Any

import grain
import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh

from contrastive_jax.errors import ConfigError
from contrastive_jax.interrupts import die_with_parent
from contrastive_jax.mesh import global_batch
from contrastive_jax.training.data.example_preprocessing import (
    Example,
    encoded_images,
    make_preprocess,
    standard_preprocess,
)
from contrastive_jax.training.data.sources import open_split


def default_data_config() -> ml_collections.ConfigDict:
    """The ``data`` block of a training config, with every field the pipeline reads."""
    return ml_collections.ConfigDict({
        "name": "mnist1d",             # TFDS name ("cifar10", "digit_captions/mnist1d", ...)
        "train_split": "train",
        "eval_split": "test",
        "data_dir": "",                # "" -> CONTRASTIVE_JAX_DATA_DIR or ~/.cache/...
        "batch_size": 512,             # global training batch (all processes together)
        "eval_batch_size": 1000,       # global evaluation batch
        "seed": 0,                     # shuffling seed (each epoch: seed + epoch)
        "shuffle": True,
        "num_epochs": ml_collections.FieldReference(None, field_type=int),  # None: forever
        "features": ml_collections.FieldReference(None, field_type=tuple),  # None: all
        "num_threads": 1,              # grain reader threads per process (or per worker)
        "worker_count": 0,             # grain worker processes per process (0: none)
        "prefetch": 2,                 # batches read ahead per process
        # correlated_gaussians only: dim and rho or mutual_information (nats)
        "options": {},
        # "standard" (keep data.features, uint8 images -> [0, 1]) or "image_text" (decode,
        # crop, resize to uint8, tokenise: image_text_preprocess's options; mean and std are
        # applied on the device: contrastive_jax.training.augmentations.pixels)
        "preprocess": {"name": "standard"},
        # "tfds" (a prepared dataset: data.name) or "shards" (a stream straight from
        # webdataset tars / parquet files: contrastive_jax.training.data.stream)
        "source": "tfds",
        "shards": "",                  # patterns, whitespace-separated ({00000..41407}, *)
        "heldout_shards": "",          # patterns of the shards evaluation reads
        "shuffle_buffer": 5000,        # examples per input reader (open_clip's 5000)
        "image_column": "jpg",         # parquet shards: the image bytes' column
        "caption_column": "caption",   # parquet shards: the caption's column
    })


@dataclasses.dataclass(frozen=True)
class HostShard:
    """This process's place among ``count`` processes (defaults: from JAX)."""

    index: int
    count: int

    @classmethod
    def from_jax(cls) -> HostShard:
        return cls(jax.process_index(), jax.process_count())

    def __post_init__(self):
        if not 0 <= self.index < self.count:
            raise ConfigError(f"process index {self.index} not in [0, {self.count})")


def per_host_batch_size(global_batch_size: int, shard: HostShard,
                        field: str = "data.batch_size") -> int:
    """``global_batch_size / shard.count``; a ConfigError naming both, and the config ``field``
    to change, when it does not divide."""
    if global_batch_size < 1 or global_batch_size % shard.count:
        raise ConfigError(f"global batch size {global_batch_size} must be a positive multiple "
                         f"of the process count {shard.count}; change {field}")
    return global_batch_size // shard.count


def train_dataset(source, *, global_batch_size: int, seed: int, shuffle: bool = True,
                  num_epochs: int | None = None, shard: HostShard | None = None,
                  preprocess: Callable[..., Example] | None = None,
                  read_options: grain.ReadOptions | None = None,
                  worker_count: int = 0) -> grain.IterDataset:
    """This host's training batches ``(global_batch_size / P, ...)`` as a grain IterDataset.

    ``source``: random access (``len``, ``[i]``), e.g. from :func:`open_split`. Each epoch is a
    fresh permutation (seed + epoch); ``num_epochs=None`` repeats forever. With a finite
    ``num_epochs`` the stream is cut to whole global batches, so every host gets the same
    number of batches. ``preprocess(example, epoch, position)`` sees the example's global
    stream position and its epoch (``position // len(source)``), the same for any process
    count. ``worker_count > 0``: the batches made in that many grain worker processes (the
    same batches; module docstring).
    """
    shard = shard or HostShard.from_jax()
    local = per_host_batch_size(global_batch_size, shard)
    if num_epochs is not None and num_epochs < 1:
        raise ConfigError(f"num_epochs must be >= 1 or None (forever); got {num_epochs}")
    if len(source) < global_batch_size:
        raise ConfigError(f"the split has {len(source)} examples, fewer than one global batch "
                         f"({global_batch_size}); lower data.batch_size")
    ds = grain.MapDataset.source(source)
    if shuffle:
        ds = ds.shuffle(seed=seed)
    ds = ds.repeat(num_epochs)
    if num_epochs is not None:
        ds = ds[: len(ds) // global_batch_size * global_batch_size]
    n = len(source)
    ds = ds.map_with_index(lambda position, example: (position, example))
    ds = ds[shard.index :: shard.count]
    preprocess = preprocess or standard_preprocess()
    ds = ds.map(lambda pair: preprocess(pair[1], epoch=pair[0] // n, position=pair[0]))
    ds = ds.batch(local, drop_remainder=True)
    return in_workers(ds.to_iter_dataset(read_options), worker_count, read_options)


def eval_dataset(source, *, global_batch_size: int, shard: HostShard | None = None,
                 preprocess: Callable[..., Example] | None = None,
                 read_options: grain.ReadOptions | None = None,
                 worker_count: int = 0) -> grain.IterDataset:
    """One pass over ``source`` in order; ``ceil(n / G)`` batches per host, padded, with ``mask``.

    Global batch ``k`` holds examples ``k G .. k G + G - 1`` (host ``p`` the ones ``= p mod P``);
    positions past the end are zero examples with ``mask = False``.
    """
    shard = shard or HostShard.from_jax()
    local = per_host_batch_size(global_batch_size, shard, "data.eval_batch_size")
    preprocess = preprocess or standard_preprocess()
    n = len(source)
    padded = math.ceil(n / global_batch_size) * global_batch_size
    blank = {k: np.zeros_like(v) for k, v in preprocess(source[0]).items()}

    def example(i: int) -> Example:
        if i < n:
            return {**preprocess(source[i]), "mask": np.True_}
        return {**blank, "mask": np.False_}

    ds = grain.MapDataset.range(padded)[shard.index :: shard.count].map(example)
    ds = ds.batch(local, drop_remainder=True).to_iter_dataset(read_options)
    return in_workers(ds, worker_count, read_options)


def in_workers(ds: grain.IterDataset, worker_count: int,
               read_options: grain.ReadOptions | None) -> grain.IterDataset:
    """``ds`` made in ``worker_count`` grain worker processes (0: in this one; grain's
    ``mp_prefetch``, each worker making every ``worker_count``-th element)."""
    if isinstance(worker_count, bool) or not isinstance(worker_count, int) or worker_count < 0:
        raise ConfigError(f"data.worker_count must be an integer >= 0; got {worker_count!r}")
    if worker_count == 0:
        return ds
    from absl import flags

    if not flags.FLAGS.is_parsed():  # grain's workers read its absl flags: their defaults
        flags.FLAGS.mark_as_parsed()  # where no absl.app parsed them (a notebook, a test)
    buffer = read_options.prefetch_buffer_size if read_options else 1
    # each worker is killed with this process, so a trainer killed with kill -9 leaves none
    return ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=worker_count,
                                                       per_worker_buffer_size=max(1, buffer)),
                          worker_init_fn=functools.partial(die_with_parent, os.getpid()))


def train_iterator(config: ml_collections.ConfigDict, mesh: Mesh, *,
                   shard: HostShard | None = None) -> grain.DatasetIterator:
    """Global training batches (dicts of ``jax.Array`` sharded over ``mesh``'s ``data`` axis).

    ``config``: the ``data`` block (:func:`default_data_config`). Checkpoint the iterator with
    ``grain.checkpoint.CheckpointSave`` / ``CheckpointRestore`` or ``get_state`` /
    ``set_state``.
    """
    config = checked_data_config(config)
    if config.source == "shards":
        from contrastive_jax.training.data.stream import stream_train_iterator

        return stream_train_iterator(config, mesh, shard=shard)
    source = open_split(config.name, config.train_split, config.data_dir or None,
                        config.options.to_dict() or None, encoded_images=encoded_images(config))
    ds = train_dataset(source, global_batch_size=config.batch_size, seed=config.seed,
                       shuffle=config.shuffle, num_epochs=config.num_epochs, shard=shard,
                       preprocess=make_preprocess(config, training=True),
                       read_options=grain_read_options(config), worker_count=config.worker_count)
    return iter(ds.map(functools.partial(global_batch, mesh=mesh)))


def eval_iterator(config: ml_collections.ConfigDict, mesh: Mesh, *,
                  split: str | None = None,
                  shard: HostShard | None = None) -> grain.DatasetIterator:
    """One padded pass over ``split`` (default ``config.eval_split``) as global batches."""
    config = checked_data_config(config)
    if config.source == "shards":
        from contrastive_jax.training.data.stream import heldout_source

        source = heldout_source(config, split)
    else:
        source = open_split(config.name, split or config.eval_split, config.data_dir or None,
                            config.options.to_dict() or None,
                            encoded_images=encoded_images(config))
    ds = eval_dataset(source, global_batch_size=config.eval_batch_size, shard=shard,
                      preprocess=make_preprocess(config),
                      read_options=grain_read_options(config), worker_count=config.worker_count)
    return iter(ds.map(functools.partial(global_batch, mesh=mesh)))


def grain_read_options(config: ml_collections.ConfigDict) -> grain.ReadOptions:
    """grain's read options of a ``data`` block (``num_threads``, ``prefetch``)."""
    return grain.ReadOptions(num_threads=config.num_threads,
                             prefetch_buffer_size=config.prefetch)


def checked_data_config(config: Any) -> ml_collections.ConfigDict:
    """The ``data`` block with every default filled in; a ConfigError naming unknown fields
    and bad batch sizes."""
    valid = default_data_config()
    unknown = sorted(set(config.keys()) - set(valid.keys()))
    if unknown:
        raise ConfigError(f"unknown data config fields {unknown}; valid: {sorted(valid.keys())}")
    given = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else dict(config)
    checked = ml_collections.ConfigDict({**valid.to_dict(), **given})
    if checked.source not in ("tfds", "shards"):
        raise ConfigError(f"data.source must be 'tfds' (a prepared dataset, data.name) or "
                          f"'shards' (a stream of data.shards); got {checked.source!r}")
    for field in ("batch_size", "eval_batch_size"):  # both checked before any training
        size = checked[field]
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(f"data.{field} must be a positive integer; got {size!r}")
    return checked
