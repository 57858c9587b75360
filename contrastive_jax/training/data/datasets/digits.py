"""scikit-learn's bundled 8x8 handwritten digits (UCI optdigits test set) as a TFDS dataset.

1797 grey images with values 0..16, stored as ``(8, 8, 1)`` uint8 scaled to 0..255
(``round(v * 255 / 16)``). The split is fixed: a permutation of the 1797 examples by
``numpy.random.default_rng(0)``; its first 1437 (80 %) are ``train`` and the last 360 ``test``.
The data ship with scikit-learn, so nothing is downloaded.

Features: ``image`` (8, 8, 1) uint8, ``label`` (10 classes), ``index`` (row in
``sklearn.datasets.load_digits()``).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import tensorflow_datasets as tfds

from contrastive_jax.training.data.text.captions import CLASS_NAMES

NUM_TRAIN = 1437
SPLIT_SEED = 0


def digits_arrays() -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``{split: (images (n, 8, 8, 1) uint8, labels (n,), indices (n,))}`` with the fixed split."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)[..., None]
    order = np.random.default_rng(SPLIT_SEED).permutation(len(images))
    parts = {"train": order[:NUM_TRAIN], "test": order[NUM_TRAIN:]}
    return {s: (images[ix], digits.target[ix].astype(np.int64), ix) for s, ix in parts.items()}


class Digits(tfds.core.GeneratorBasedBuilder):
    """8x8 digits: 1437 train / 360 test images, 10 classes."""

    name = "digits"
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES: ClassVar[dict[str, str]] = {
        "1.0.0": "scikit-learn load_digits, split by default_rng(0), 1437/360."}

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=__doc__,
            features=tfds.features.FeaturesDict({
                "image": tfds.features.Tensor(shape=(8, 8, 1), dtype=np.uint8),
                "label": tfds.features.ClassLabel(names=CLASS_NAMES),
                "index": tfds.features.Scalar(dtype=np.int32),
            }),
            supervised_keys=("image", "label"),
            homepage="https://scikit-learn.org/stable/datasets/toy_dataset.html",
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # ships with scikit-learn
        arrays = digits_arrays()
        return {split: self._generate_examples(*arrays[split]) for split in arrays}

    def _generate_examples(self, images, labels, indices):
        for x, y, i in zip(images, labels, indices, strict=True):
            yield int(i), {"image": x, "label": int(y), "index": int(i)}
