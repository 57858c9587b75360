"""Digits paired with captions, for CLIP-style training, zero-shot classification and retrieval.

Two configs, one per modality:

- ``digit_captions/mnist1d``: MNIST-1D signals (``signal`` (40, 1) float32, 4000 / 1000),
- ``digit_captions/digits``: the 8x8 digit images (``image`` (8, 8, 1) uint8, 1437 / 360),

the same samples and splits as ``mnist1d`` and ``digits``. Each example gets one caption: a
template of its modality (:data:`contrastive_jax.training.data.text.captions.TEMPLATES`) drawn
uniformly with a fixed seed per split and filled with the class name, e.g. "a plot of the digit
seven".

Features: the sample, ``label``, ``index`` (as in the unpaired set), ``caption``
(``MAX_TOKENS``,) int32 tokens, ``template`` (which template), ``caption_id``
(``template * 10 + label``: equal ids <=> identical caption text). Identical captions in one
batch are false negatives for InfoNCE (docs/derivations.md §5.4); ``caption_id`` lets a
multi-positive loss treat them as positives.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import tensorflow_datasets as tfds

from contrastive_jax.training.data.datasets.digits import digits_arrays
from contrastive_jax.training.data.datasets.mnist1d import LENGTH, mnist1d_arrays
from contrastive_jax.training.data.text.captions import (
    CLASS_NAMES,
    MAX_TOKENS,
    caption,
    caption_id,
    templates,
    tokenize,
)

TEMPLATE_SEEDS = {"train": 1, "test": 2}


class DigitCaptionsConfig(tfds.core.BuilderConfig):
    """One modality: ``modality`` is "signal" (MNIST-1D) or "image" (8x8 digits)."""

    def __init__(self, *, modality: str, **kwargs):
        super().__init__(**kwargs)
        self.modality = modality


class DigitCaptions(tfds.core.GeneratorBasedBuilder):
    """Digits (signals or images) paired with templated captions."""

    name = "digit_captions"
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES: ClassVar[dict[str, str]] = {
        "1.0.0": "8 templates per modality, drawn with seeds 1 (train), 2 (test)."}
    BUILDER_CONFIGS: ClassVar[list[tfds.core.BuilderConfig]] = [
        DigitCaptionsConfig(name="mnist1d", modality="signal",
                            description="MNIST-1D signals with captions."),
        DigitCaptionsConfig(name="digits", modality="image",
                            description="8x8 digit images with captions."),
    ]

    def _info(self) -> tfds.core.DatasetInfo:
        if self.builder_config.modality == "signal":
            sample = {"signal": tfds.features.Tensor(shape=(LENGTH, 1), dtype=np.float32)}
        else:
            sample = {"image": tfds.features.Tensor(shape=(8, 8, 1), dtype=np.uint8)}
        return tfds.core.DatasetInfo(
            builder=self,
            description=__doc__,
            features=tfds.features.FeaturesDict({
                **sample,
                "label": tfds.features.ClassLabel(names=CLASS_NAMES),
                "index": tfds.features.Scalar(dtype=np.int32),
                "caption": tfds.features.Tensor(shape=(MAX_TOKENS,), dtype=np.int32),
                "template": tfds.features.Scalar(dtype=np.int32),
                "caption_id": tfds.features.Scalar(dtype=np.int32),
            }),
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # generated locally
        modality = self.builder_config.modality
        if modality == "signal":
            arrays = {s: (x, y, np.arange(len(y))) for s, (x, y) in mnist1d_arrays().items()}
        else:
            arrays = digits_arrays()
        return {split: self._generate_examples(modality, split, *arrays[split])
                for split in arrays}

    def _generate_examples(self, modality, split, samples, labels, indices):
        key = "signal" if modality == "signal" else "image"
        rng = np.random.default_rng(TEMPLATE_SEEDS[split])
        temps = rng.integers(0, len(templates(modality)), size=len(labels))
        tokens = tokenize([caption(modality, int(t), int(y)) for t, y in zip(temps, labels,
                                                                               strict=True)])
        ids = caption_id(temps, labels)
        for x, y, i, t, tok, c in zip(samples, labels, indices, temps, tokens, ids,
                                      strict=True):
            yield int(i), {key: x, "label": int(y), "index": int(i), "caption": tok,
                           "template": int(t), "caption_id": int(c)}
