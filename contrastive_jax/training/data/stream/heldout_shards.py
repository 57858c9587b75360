"""Held-out shards as a random-access split: the evaluation data of a streamed run.

``data.heldout_shards`` names shards (patterns, as ``data.shards``) that training never reads.
They are indexed once (one pass: each good example's shard and ordinal, its image checked to
decode) and then read as a split of ``len`` examples in the shards' order, which the
evaluation pass (:func:`~contrastive_jax.training.data.pipeline.eval_dataset`) reads as it
reads a prepared dataset's held-out split. Reads are sequential, so one shard's examples are
kept at a time. References: docs/data.md, "Your own image-text shards".
"""

from __future__ import annotations

import io
from collections import Counter
from typing import Any

from contrastive_jax.errors import ConfigError, ContrastiveJaxError
from contrastive_jax.training.data.stream.shard_stream import StreamSpec, shard_items


class HeldoutShards:
    """``len`` and ``[i]`` over the good examples of ``spec.files``, in order; ``skipped``:
    the members left out, by reason (:data:`~.shard_stream.SKIP_REASONS`)."""

    def __init__(self, spec: StreamSpec):
        self._spec = spec
        self.skipped: Counter = Counter()
        self._index: list[tuple[int, int]] = []  # (shard, ordinal) of each good example
        for shard, path in enumerate(spec.files):
            try:
                for ordinal, item in shard_items(path, spec, 0, self.skipped):
                    if isinstance(item, str):
                        self.skipped[item] += 1
                    elif not _decodes(item["image"]):
                        self.skipped["image undecodable"] += 1
                    else:
                        self._index.append((shard, ordinal))
            except ContrastiveJaxError:
                raise
            except Exception:  # the shard cannot be read (further): what came before is kept
                self.skipped["unreadable shard"] += 1
        if not self._index:
            raise ConfigError(f"data.heldout_shards: no good example in its "
                              f"{len(spec.files)} shard(s) (skipped: {dict(self.skipped)})")
        self._cache: tuple[int, dict[int, dict]] | None = None

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, i: int) -> dict:
        shard, ordinal = self._index[i]
        if self._cache is None or self._cache[0] != shard:
            self._cache = (shard, {o: item for o, item in shard_items(
                self._spec.files[shard], self._spec) if not isinstance(item, str)})
        return self._cache[1][ordinal]

    def __getstate__(self) -> dict[str, Any]:  # sent to grain's workers without the cache
        return {**self.__dict__, "_cache": None}


def _decodes(data: bytes) -> bool:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
        return True
    except Exception:  # PIL raises many types for bytes that are not an image
        return False
