"""One reader's stream of examples from image-text shards: exactly resumable.

A reader (:mod:`~contrastive_jax.training.data.stream.shard_list`: process ``p``'s grain
worker ``w``) reads its shards of each epoch one after the other, member by member (a tar's
members grouped by key, a parquet file's rows), into a shuffle buffer of ``B`` examples
(``data.shuffle_buffer``): once the buffer is full, each draw ``t`` reads the next example,
takes slot ``j_t`` of the buffer out and puts the new example there, with ``j_t`` drawn from
``(data.seed, r, t)``. Epochs follow each other without emptying the buffer (the stream is
endless; the run's length is ``total_steps``). What leaves the buffer is preprocessed as the
prepared path's examples are (``image_text`` or ``image``), with ``epoch`` the epoch its shard
was read in (caption choice) and ``position = t R + r`` (``R`` readers): a random crop drawn
from it is the same in a resumed run.

Examples are the converted datasets' (:mod:`~contrastive_jax.training.data.convert_shards`):
``image`` (encoded bytes), ``captions/text`` (one caption), ``image/filename``
(``SHARD/KEY``) and ``metadata``. Bad members are skipped and counted by reason
(:data:`SKIP_REASONS`); a shard that cannot be read after :data:`READ_ATTEMPTS` tries is
skipped for the epoch and named in the state's ``failed`` counts.

**State** (:meth:`ShardStreamIterator.get_state`, JSON): the epoch, the next shard of the
epoch's list, the shard being read and the ordinal of its next example, the buffer as
``(epoch, shard, ordinal)`` references, the draw count and the skip counts. A restored
iterator reads the buffer's examples again from their shards (one pass over each shard the
buffer holds) and continues the current shard at its ordinal, so it yields exactly what the
uninterrupted stream would have. References: docs/data.md, "Your own image-text shards".
"""

from __future__ import annotations

import dataclasses
import tarfile
import time
from collections import Counter
from collections.abc import Callable, Iterator

import grain
import numpy as np

from contrastive_jax.errors import ConfigError, ContrastiveJaxError, DataError
from contrastive_jax.training.data.shard_readers import (
    missing_part,
    parquet_examples,
    tar_examples,
)
from contrastive_jax.training.data.stream.shard_list import (
    reader_shards,
    shard_format,
    shards_digest,
)

SKIP_REASONS = ("no image", "no caption", "empty caption", "image undecodable",
                "truncated shard", "unreadable shard")
READ_ATTEMPTS = 3  # tries of a shard whose reading fails (network errors), then skipped
STATE_KIND = "image-text shards"  # marks a reader's state inside grain's nested state


@dataclasses.dataclass(frozen=True)
class StreamSpec:
    """What every reader of a run shares: the shard list and the settings."""

    files: tuple[str, ...]
    seed: int = 0
    shuffle: bool = True
    buffer: int = 5000
    process: int = 0
    processes: int = 1
    workers: int = 0  # grain worker processes per process (0: the reader is the process)
    image_column: str = "jpg"
    caption_column: str = "caption"
    key_column: str = "key"

    @property
    def readers(self) -> int:
        return self.processes * max(1, self.workers)

    @property
    def digest(self) -> str:
        return shards_digest(self.files)


def shard_items(path: str, spec: StreamSpec, start: int = 0,
                skipped: Counter | None = None) -> Iterator[tuple[int, dict | str]]:
    """``(ordinal, example)`` for the members of shard ``path`` from ordinal ``start`` on; in
    place of an example that lacks a part, the reason it is skipped (a string)."""
    skipped = Counter() if skipped is None else skipped
    shard = path.rsplit("/", 1)[-1]
    if shard_format(path) == "parquet":
        examples = parquet_examples(path, spec.image_column, spec.caption_column,
                                    spec.key_column, start)
        first = start
    else:
        examples, first = tar_examples(path, skipped), 0
    for ordinal, example in enumerate(examples, first):
        if ordinal < start:
            continue
        problem = missing_part(example)
        yield ordinal, problem or {
            "image": example.image, "captions": {"text": [example.caption.strip()]},
            "image/filename": f"{shard}/{example.key}", "metadata": example.metadata}


class ShardStream(grain.IterDataset):
    """A reader's preprocessed examples (module docstring) as a grain ``IterDataset``.

    ``preprocess(example, epoch=, position=)``: the prepared path's
    (:func:`~contrastive_jax.training.data.example_preprocessing.make_preprocess`). In grain's
    worker processes (``mp_prefetch``) each worker takes its slice (``set_slice``): worker
    ``w`` of ``W`` is reader ``p W + w``."""

    def __init__(self, spec: StreamSpec, preprocess: Callable[..., dict]):
        super().__init__()
        self._spec = spec
        self._preprocess = preprocess
        self._worker = 0

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """grain's worker slicing: worker ``sl.start`` of ``sl.step``."""
        del sequential_slice
        if (sl.step or 1) != max(1, self._spec.workers):
            raise ConfigError(f"the stream was built for {self._spec.workers} input workers "
                              f"and grain runs {sl.step}")
        self._worker = sl.start or 0

    def __iter__(self) -> ShardStreamIterator:
        return ShardStreamIterator(self._spec, self._worker, self._preprocess)

    def __str__(self) -> str:
        return f"ShardStream({len(self._spec.files)} shards, buffer {self._spec.buffer})"


class ShardStreamIterator(grain.DatasetIterator):
    """The iterator of :class:`ShardStream`; ``get_state`` / ``set_state`` exact."""

    def __init__(self, spec: StreamSpec, worker: int, preprocess: Callable[..., dict]):
        super().__init__()
        self._spec = spec
        self._worker = worker
        self._reader = spec.process * max(1, spec.workers) + worker
        self._preprocess = preprocess
        self._order_cache: tuple[int, list[int]] | None = None
        self._reset()

    def _reset(self) -> None:
        self._epoch = 0
        self._next_shard = 0  # in the epoch's list of this reader's shards
        self._current: list[int] | None = None  # [shard, ordinal of its next example]
        self._items: Iterator | None = None
        self._attempts = 0
        self._buffer: list[tuple[tuple[int, int, int], dict]] = []
        self._draws = 0
        self._epoch_examples = 0
        self._skipped: Counter = Counter()
        self._failed: Counter = Counter()

    def _shards(self, epoch: int) -> list[int]:
        if self._order_cache is None or self._order_cache[0] != epoch:
            s = self._spec
            self._order_cache = (epoch, reader_shards(
                len(s.files), s.seed, epoch, process=s.process, processes=s.processes,
                worker=self._worker, workers=s.workers, shuffle=s.shuffle))
        return self._order_cache[1]

    def _open(self, shard: int, start: int) -> None:
        self._current = [shard, start]
        self._items = shard_items(self._spec.files[shard], self._spec, start, self._skipped)

    def _read(self) -> tuple[tuple[int, int, int], dict]:
        """The next good example of this reader and its ``(epoch, shard, ordinal)``."""
        while True:
            if self._items is None:
                shards = self._shards(self._epoch)
                if self._next_shard >= len(shards):
                    if not self._epoch_examples:
                        raise DataError(
                            f"input reader {self._reader} read no example from its "
                            f"{len(shards)} shard(s) in epoch {self._epoch} (failed: "
                            f"{dict(self._failed) or 'none'}; skipped: {dict(self._skipped)}):"
                            " check data.shards")
                    self._epoch, self._next_shard, self._epoch_examples = self._epoch + 1, 0, 0
                    continue
                self._next_shard += 1
                self._attempts = 0
                self._open(shards[self._next_shard - 1], 0)
            try:
                ordinal, item = next(self._items)
            except StopIteration:
                self._items = self._current = None
                continue
            except ContrastiveJaxError:
                raise
            except Exception as err:  # the shard cannot be read (further)
                self._failed_read(err)
                continue
            self._current[1] = ordinal + 1
            if isinstance(item, str):
                self._skipped[item] += 1
                continue
            self._epoch_examples += 1
            return (self._epoch, self._current[0], ordinal), item

    def _failed_read(self, err: Exception) -> None:
        """Try the shard again from where it failed, or give it up for this epoch."""
        self._attempts += 1
        transient = isinstance(err, OSError) and not isinstance(err, FileNotFoundError)
        if transient and self._attempts < READ_ATTEMPTS:
            time.sleep(min(2.0 ** self._attempts, 10.0))  # a network error: back off, retry
            self._open(*self._current)
            return
        path = self._spec.files[self._current[0]]
        self._skipped["unreadable shard"] += 1
        self._failed[path] += 1
        self._items = self._current = None

    def __next__(self) -> dict:
        while True:
            while len(self._buffer) < self._spec.buffer:
                self._buffer.append(self._read())
            incoming = self._read()
            draw = self._draws
            j = int(np.random.default_rng((self._spec.seed, self._reader, draw)).integers(
                len(self._buffer)))
            self._draws += 1
            (epoch, _, _), example = self._buffer[j]
            self._buffer[j] = incoming
            try:
                return self._preprocess(example, epoch=epoch,
                                        position=draw * self._spec.readers + self._reader)
            except ConfigError:
                raise
            except DataError:  # the image does not decode
                self._skipped["image undecodable"] += 1

    def get_state(self) -> dict:
        return {"kind": STATE_KIND, "shards": self._spec.digest,
                "readers": self._spec.readers, "epoch": self._epoch,
                "next_shard": self._next_shard,
                "current": None if self._current is None else list(self._current),
                "buffer": [list(ref) for ref, _ in self._buffer], "draws": self._draws,
                "epoch_examples": self._epoch_examples,
                "skipped": dict(sorted(self._skipped.items())),
                "failed": dict(sorted(self._failed.items()))}

    def set_state(self, state: dict) -> None:
        check_stream_state(state, self._spec)
        self._reset()
        self._epoch, self._next_shard = state["epoch"], state["next_shard"]
        self._draws, self._epoch_examples = state["draws"], state["epoch_examples"]
        self._skipped.update(state["skipped"])
        self._failed.update(state["failed"])
        self._buffer = reread_buffer([tuple(ref) for ref in state["buffer"]], self._spec)
        if state["current"] is not None:
            self._open(*state["current"])


def check_stream_state(state: dict, spec: StreamSpec) -> None:
    """A ConfigError unless a saved reader state is of this run's shard list and readers."""
    if state.get("kind") != STATE_KIND:
        raise ConfigError("the checkpoint's data position is not an image-text shard stream's: "
                          "resume with the data settings of the run that wrote it")
    if state["shards"] != spec.digest:
        raise ConfigError("the checkpoint was written by a run on another shard list (data.shards"
                          " expands to other files): resume with the same data.shards, or "
                          "start a new workdir")
    if state["readers"] != spec.readers:
        raise ConfigError(f"the checkpoint's stream has {state['readers']} readers (processes "
                          f"x data.worker_count) and this run {spec.readers}: resume with the "
                          "same process count and data.worker_count")


def reread_buffer(refs: list[tuple[int, int, int]], spec: StreamSpec
                  ) -> list[tuple[tuple[int, int, int], dict]]:
    """The buffer's examples read again from their shards: one pass over each shard."""
    wanted: dict[int, set[int]] = {}
    for _, shard, ordinal in refs:
        wanted.setdefault(shard, set()).add(ordinal)
    found: dict[tuple[int, int], dict] = {}
    for shard, ordinals in wanted.items():
        try:
            for ordinal, item in shard_items(spec.files[shard], spec, min(ordinals)):
                if ordinal in ordinals and not isinstance(item, str):
                    found[shard, ordinal] = item
                if ordinal >= max(ordinals):
                    break
        except (OSError, tarfile.TarError) as err:
            raise DataError(f"resuming the stream needs shard {spec.files[shard]} again, and it "
                            f"cannot be read ({type(err).__name__}: {err})") from err
    missing = [ref for ref in refs if (ref[1], ref[2]) not in found]
    if missing:
        raise DataError(f"resuming the stream needs example {missing[0][2]} of shard "
                        f"{spec.files[missing[0][1]]}, which it no longer holds: the shards "
                        "changed since the checkpoint")
    return [(ref, found[ref[1], ref[2]]) for ref in refs]
