"""Digits paired with captions, for CLIP-style training, zero-shot classification and retrieval.

Three configs:

- ``digit_captions/mnist1d``: MNIST-1D signals (``signal`` (40, 1) float32, 4000 / 1000),
- ``digit_captions/digits``: the 8x8 digit images (``image`` (8, 8, 1) uint8, 1437 / 360),
- ``digit_captions/canvas``: each 8x8 digit resized (bicubic) to a random size of
  ``CANVAS_DIGIT`` pixels and pasted at a random place of a ``CANVAS`` x ``CANVAS`` black canvas
  with faint noise (``image`` (48, 48, 3) uint8, grey in RGB; ``PLACEMENTS`` placements of each
  digit: 2874 / 720): an image-text task for a ViT whose patches matter (read at 32 x 32 with
  patch 4 it has 64 patches, the digit in 4-25 of them) and whose lower resolutions lose
  detail (at 16 x 16 the digit is 4-8 pixels across); its ``caption`` is the text, for
  ``data.preprocess`` ``image_text`` (the pod's path: resize on the host, tokenise);
  ``index`` is the digit's row, ``canvas`` the canvas's place in :func:`canvas_images`.

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
CANVAS = 48
CANVAS_DIGIT = (12, 24)  # the pasted digit's side in pixels, uniform in [12, 24]
PLACEMENTS = 2
CANVAS_NOISE = 8.0  # std of the background noise, of 255


def canvas_images(images: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(canvases (n * PLACEMENTS, CANVAS, CANVAS, 3) uint8, source rows (n * PLACEMENTS,))``:
    ``PLACEMENTS`` canvases of each ``(8, 8, 1)`` uint8 digit in ``images`` (module docstring),
    drawn from ``numpy.random.default_rng(seed)``."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = np.empty((len(images) * PLACEMENTS, CANVAS, CANVAS, 3), np.uint8)
    rows = np.repeat(np.arange(len(images)), PLACEMENTS)
    for k, row in enumerate(rows):
        side = int(rng.integers(CANVAS_DIGIT[0], CANVAS_DIGIT[1] + 1))
        top, left = rng.integers(0, CANVAS - side + 1, size=2)
        digit = Image.fromarray(images[row, :, :, 0]).resize((side, side), Image.BICUBIC)
        canvas = rng.normal(0.0, CANVAS_NOISE, (CANVAS, CANVAS))
        canvas[top:top + side, left:left + side] += np.asarray(digit, np.float64)
        out[k] = np.clip(np.round(canvas), 0, 255).astype(np.uint8)[..., None]
    return out, rows


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
        DigitCaptionsConfig(name="canvas", modality="canvas",
                            description="8x8 digits pasted on 48x48 canvases, text captions."),
    ]

    def _info(self) -> tfds.core.DatasetInfo:
        if self.builder_config.modality == "canvas":
            return tfds.core.DatasetInfo(
                builder=self, description=__doc__,
                features=tfds.features.FeaturesDict({
                    "image": tfds.features.Tensor(shape=(CANVAS, CANVAS, 3), dtype=np.uint8),
                    "label": tfds.features.ClassLabel(names=CLASS_NAMES),
                    "index": tfds.features.Scalar(dtype=np.int32),
                    "canvas": tfds.features.Scalar(dtype=np.int32),
                    "caption": tfds.features.Text(),
                    "template": tfds.features.Scalar(dtype=np.int32),
                }))
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
        elif modality == "canvas":
            return {split: self._generate_canvases(split, *arrays)
                    for split, arrays in digits_arrays().items()}
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

    def _generate_canvases(self, split, images, labels, indices):
        canvases, rows = canvas_images(images, TEMPLATE_SEEDS[split] + 100)
        rng = np.random.default_rng(TEMPLATE_SEEDS[split])
        temps = rng.integers(0, len(templates("image")), size=len(rows))
        for k, (row, t) in enumerate(zip(rows, temps, strict=True)):
            yield k, {"image": canvases[k], "label": int(labels[row]),
                      "index": int(indices[row]), "canvas": k, "caption": caption("image", int(t),
                                                                     int(labels[row])),
                      "template": int(t)}
