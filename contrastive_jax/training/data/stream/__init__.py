"""Training straight from image-text shards (webdataset tars, parquet; local or ``gs://``),
without a conversion: ``data.source = "shards"``.

- :mod:`~contrastive_jax.training.data.stream.shard_list`: the patterns' shard list, checked,
  and which shards each reader (process x grain worker) reads in each epoch;
- :mod:`~contrastive_jax.training.data.stream.shard_stream`: one reader's exactly resumable
  stream (shards, shuffle buffer, skip counts, state);
- :mod:`~contrastive_jax.training.data.stream.heldout_shards`: held-out shards as a split;
- :mod:`~contrastive_jax.training.data.stream.stream_iterators`: the trainer's iterators.

References: docs/data.md, "Your own image-text shards".
"""

from contrastive_jax.training.data.stream.shard_stream import SKIP_REASONS, StreamSpec
from contrastive_jax.training.data.stream.stream_iterators import (
    StreamBatches,
    check_stream,
    heldout_source,
    stream_report,
    stream_train_iterator,
)

__all__ = ["SKIP_REASONS", "StreamBatches", "StreamSpec", "check_stream", "heldout_source",
           "stream_report", "stream_train_iterator"]
