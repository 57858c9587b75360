"""``data.source = "shards"``: the training and evaluation iterators of a streamed run.

Training: this process's readers (:mod:`~contrastive_jax.training.data.stream.shard_list`) ─
shuffle buffer ─ preprocess (:mod:`~contrastive_jax.training.data.stream.shard_stream`) ─
``batch(G / P)`` ─ grain worker processes (``data.worker_count``: one reader each) ─
global batches over the mesh. :class:`StreamBatches` is the iterator the trainer holds: its
``get_state`` / ``set_state`` are grain's (one JSON per process in the checkpoint), a restored
state of another shard list or reader count is refused in this process (a ConfigError, before
any worker starts), and :meth:`StreamBatches.report` sums the readers' skip counts.

Evaluation: the held-out shards (:mod:`~contrastive_jax.training.data.stream.heldout_shards`)
through the prepared path's evaluation pass. References: docs/data.md, "Your own image-text
shards".
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

import grain
import ml_collections
from jax.sharding import Mesh

from contrastive_jax.errors import ConfigError
from contrastive_jax.mesh import global_batch
from contrastive_jax.training.data.example_preprocessing import make_preprocess
from contrastive_jax.training.data.pipeline import (
    HostShard,
    grain_read_options,
    in_workers,
    per_host_batch_size,
)
from contrastive_jax.training.data.stream.heldout_shards import HeldoutShards
from contrastive_jax.training.data.stream.shard_list import check_readers, list_shards
from contrastive_jax.training.data.stream.shard_stream import (
    SKIP_REASONS,
    STATE_KIND,
    ShardStream,
    StreamSpec,
    check_stream_state,
)


def stream_spec(config: ml_collections.ConfigDict, shard: HostShard | None = None
                ) -> StreamSpec:
    """The :class:`StreamSpec` of a ``data`` block's ``shards`` for this process (``shard``,
    default JAX's): the shard list, checked, and the readers checked against it."""
    shard = shard or HostShard.from_jax()
    files = list_shards(config.shards, "data.shards", image_column=config.image_column,
                        caption_column=config.caption_column)
    if isinstance(config.shuffle_buffer, bool) or not isinstance(config.shuffle_buffer, int) \
            or config.shuffle_buffer < 1:
        raise ConfigError(f"data.shuffle_buffer must be an integer >= 1 (1: no shuffling of "
                          f"examples); got {config.shuffle_buffer!r}")
    check_readers(len(files), shard.count, config.worker_count)
    if config.num_epochs is not None:
        raise ConfigError("a stream of shards does not count epochs (data.num_epochs = "
                          f"{config.num_epochs}); leave it None and set total_steps")
    return StreamSpec(tuple(files), seed=config.seed, shuffle=config.shuffle,
                      buffer=config.shuffle_buffer, process=shard.index, processes=shard.count,
                      workers=config.worker_count, image_column=config.image_column,
                      caption_column=config.caption_column)


def stream_dataset(spec: StreamSpec, preprocess, *, global_batch_size: int,
                   read_options: grain.ReadOptions | None = None) -> grain.IterDataset:
    """This process's training batches ``(global_batch_size / P, ...)`` of the stream."""
    local = per_host_batch_size(global_batch_size, HostShard(spec.process, spec.processes))
    ds = ShardStream(spec, preprocess).batch(local, drop_remainder=True)
    return in_workers(ds, spec.workers, read_options)


class StreamBatches(grain.DatasetIterator):
    """The training iterator of a stream (module docstring)."""

    def __init__(self, batches: grain.DatasetIterator, spec: StreamSpec):
        super().__init__()
        self._batches = batches
        self._spec = spec

    def __next__(self) -> Any:
        return next(self._batches)

    def get_state(self) -> dict:
        return self._batches.get_state()

    def set_state(self, state: dict) -> None:
        readers = list(reader_states(state))
        if not readers:
            raise ConfigError("the checkpoint's data position is not a stream of shards: "
                              "resume with the data settings of the run that wrote it")
        for reader in readers:
            check_stream_state(reader, self._spec)
        self._batches.set_state(state)

    def report(self) -> dict[str, dict[str, int]]:
        """This process's input so far: ``{"skipped": reason -> count, "failed_shards":
        path -> failed reads}`` (:func:`stream_report` of the state)."""
        return stream_report(self.get_state())

    def close(self) -> None:
        close = getattr(self._batches, "close", None)
        if callable(close):
            close()


def reader_states(state: Any) -> Iterator[dict]:
    """The readers' states nested in a grain iterator state (by their ``kind``)."""
    if isinstance(state, Mapping):
        if state.get("kind") == STATE_KIND:
            yield state
            return
        for value in state.values():
            yield from reader_states(value)
    elif isinstance(state, list | tuple):
        for value in state:
            yield from reader_states(value)


def stream_report(state: Any) -> dict[str, dict[str, int]]:
    """The skip counts (every reason of :data:`~.shard_stream.SKIP_REASONS`, in its order)
    and the failed shards, summed over the readers of ``state``."""
    skipped, failed = Counter(), Counter()
    for reader in reader_states(state):
        skipped.update(reader["skipped"])
        failed.update(reader["failed"])
    return {"skipped": {reason: skipped[reason] for reason in SKIP_REASONS},
            "failed_shards": dict(sorted(failed.items()))}


def check_stream(config: ml_collections.ConfigDict,
                 shard: HostShard | None = None) -> StreamSpec:
    """The stream's :class:`StreamSpec` for this process, its settings and shards checked
    (the patterns, the readers, held-out shards apart from the training ones): a ConfigError
    saying what to change otherwise. ``config``: the ``data`` block."""
    from contrastive_jax.training.data.pipeline import checked_data_config

    config = checked_data_config(config)
    spec = stream_spec(config, shard)
    if config.heldout_shards:
        held = set(list_shards(config.heldout_shards, "data.heldout_shards",
                               image_column=config.image_column,
                               caption_column=config.caption_column))
        both = [f for f in spec.files if f in held]
        if both:
            raise ConfigError(f"{len(both)} shard(s) are in both data.shards and "
                              f"data.heldout_shards (first: {both[0]}): held-out shards must "
                              "not be trained on; change one of the patterns")
    return spec


def stream_train_iterator(config: ml_collections.ConfigDict, mesh: Mesh, *,
                          shard: HostShard | None = None) -> StreamBatches:
    """Global training batches of ``config.shards`` (``config``: the ``data`` block)."""
    spec = check_stream(config, shard)
    ds = stream_dataset(spec, make_preprocess(config, training=True),
                        global_batch_size=config.batch_size,
                        read_options=grain_read_options(config))
    return StreamBatches(iter(ds.map(functools.partial(global_batch, mesh=mesh))), spec)


@functools.lru_cache(maxsize=4)
def _heldout(patterns: str, image_column: str, caption_column: str) -> HeldoutShards:
    """The held-out shards of ``patterns``, indexed once per process."""
    files = list_shards(patterns, "data.heldout_shards", image_column=image_column,
                        caption_column=caption_column)
    return HeldoutShards(StreamSpec(tuple(files), image_column=image_column,
                                    caption_column=caption_column))


def heldout_source(config: ml_collections.ConfigDict, split: str | None = None
                   ) -> HeldoutShards:
    """The evaluation split of a stream: its held-out shards (indexed once per process).
    ``split``: the split an evaluation asks for; only ``data.eval_split`` (or None) exists."""
    if split not in (None, config.eval_split):
        raise ConfigError(f"a stream of shards has no split {split!r} to evaluate on (it reads "
                          "data.heldout_shards as its evaluation split): evaluations that read "
                          "the training split (evaluation.classification: linear probe, kNN) "
                          "do not apply; turn them off")
    if not config.heldout_shards:
        raise ConfigError("evaluating a stream of shards needs held-out shards: set "
                          "data.heldout_shards (patterns of shards training does not read), or "
                          "evaluation.enabled=False")
    return _heldout(config.heldout_shards, config.image_column, config.caption_column)
