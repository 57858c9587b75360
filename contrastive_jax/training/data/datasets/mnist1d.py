"""MNIST-1D (Greydanus 2020) as a TFDS dataset, generated locally: the default data.

The ``mnist1d`` package from PyPI generates the standard set (its default arguments: 5000
signals of length 40, 10 classes, seed 42; the first 4000 are ``train``, the last 1000
``test``) from ten 1-D digit templates by padding, translation, scaling, shear, correlated and
i.i.d. noise. Nothing is downloaded. Signals are standardised over the whole set (mean 0,
std 1) by the generator and stored as ``(40, 1)`` float32 (length, channels).

Features: ``signal`` (40, 1) float32, ``label`` (10 classes), ``index`` (position in the
generator's output, unique per split).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import tensorflow_datasets as tfds

from contrastive_jax.training.data.text.captions import CLASS_NAMES

LENGTH = 40


def mnist1d_arrays() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{"train": (signals (4000, 40, 1), labels), "test": (signals (1000, 40, 1), labels)}``.

    Runs the ``mnist1d`` package's generator with its standard arguments (seed 42). The
    generator seeds NumPy's global random state; that state is restored afterwards.
    """
    from mnist1d.data import get_dataset_args, make_dataset

    state = np.random.get_state()  # noqa: NPY002 (the generator uses the legacy global state)
    try:
        data = make_dataset(get_dataset_args())
    finally:
        np.random.set_state(state)  # noqa: NPY002
    return {
        "train": (data["x"].astype(np.float32)[..., None], data["y"].astype(np.int64)),
        "test": (data["x_test"].astype(np.float32)[..., None], data["y_test"].astype(np.int64)),
    }


class Mnist1d(tfds.core.GeneratorBasedBuilder):
    """MNIST-1D: 4000 train / 1000 test signals of length 40, 10 classes."""

    name = "mnist1d"
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES: ClassVar[dict[str, str]] = {
        "1.0.0": "mnist1d package defaults (seed 42), 4000/1000 split."}

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=__doc__,
            features=tfds.features.FeaturesDict({
                "signal": tfds.features.Tensor(shape=(LENGTH, 1), dtype=np.float32),
                "label": tfds.features.ClassLabel(names=CLASS_NAMES),
                "index": tfds.features.Scalar(dtype=np.int32),
            }),
            supervised_keys=("signal", "label"),
            homepage="https://github.com/greydanus/mnist1d",
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # generated locally
        arrays = mnist1d_arrays()
        return {split: self._generate_examples(*arrays[split]) for split in arrays}

    def _generate_examples(self, signals, labels):
        for i, (x, y) in enumerate(zip(signals, labels, strict=True)):
            yield i, {"signal": x, "label": int(y), "index": i}
