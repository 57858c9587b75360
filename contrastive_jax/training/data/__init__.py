"""Input data: TFDS datasets built offline, grain pipelines sharded per host.

- :mod:`~contrastive_jax.training.data.prepare`: the package's datasets (``mnist1d``, ``digits``,
  ``digit_captions/{mnist1d,digits}``) built once into a TFDS data dir, offline (the command
  ``python -m contrastive_jax.training.data.prepare``).
- :mod:`~contrastive_jax.training.data.sources`: :func:`open_split`, one random-access source
  per split (any TFDS dataset prepared as array_record, or ``correlated_gaussians``).
- :mod:`~contrastive_jax.training.data.pipeline`: shuffled, repeated, per-host batches
  assembled into global ``jax.Array`` s, with a checkpointable iterator; padded evaluation
  passes.
- :mod:`~contrastive_jax.training.data.example_preprocessing`: what each example becomes on
  the way (``data.preprocess``: the standard features, or an image cropped and its caption
  tokenised).
- :mod:`~contrastive_jax.training.data.build_tokenizer`: the command that builds a SentencePiece
  model from a prepared dataset's captions.
- :mod:`~contrastive_jax.training.data.datasets`: the package's datasets themselves (the TFDS
  builders ``mnist1d``, ``digits``, ``digit_captions``; ``correlated_gaussians``, pairs with
  known mutual information).
- :mod:`~contrastive_jax.training.data.text`: text: caption templates and the word vocabulary,
  caption tokenizers (words, SentencePiece, CLIP's BPE), zero-shot prompts.
"""

from contrastive_jax.training.data.example_preprocessing import standard_preprocess
from contrastive_jax.training.data.pipeline import (
    HostShard,
    default_data_config,
    eval_dataset,
    eval_iterator,
    train_dataset,
    train_iterator,
)
from contrastive_jax.training.data.prepare import LOCAL_NAMES, default_data_dir, prepare
from contrastive_jax.training.data.sources import DatasetNotPreparedError, open_split

__all__ = [
    "LOCAL_NAMES",
    "DatasetNotPreparedError",
    "HostShard",
    "default_data_config",
    "default_data_dir",
    "eval_dataset",
    "eval_iterator",
    "open_split",
    "prepare",
    "standard_preprocess",
    "train_dataset",
    "train_iterator",
]
