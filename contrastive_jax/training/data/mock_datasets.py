"""Tiny prepared copies of real TFDS datasets, with random examples: the pod template's ``tiny``
variant and its tests run on them with no download.

``python -m contrastive_jax.training.data.prepare --mock coco_captions --data_dir=DIR`` writes
``DIR/coco_captions/2014/1.1.0/``: the real ``coco_captions`` builder's name, config, version,
features and splits (train, restval, val, test; :data:`MOCK_SPLITS` examples each), as
array_record files that :func:`~contrastive_jax.training.data.sources.open_split` reads like
the real prepared dataset. The examples are ``tfds.testing``'s ``RandomFakeGenerator`` ones
(what ``tfds.testing.mock_data`` yields), made encodable without TensorFlow: images as PIL
images (JPEG-encoded), the sub-features of a sequence cut to one length, boxes ordered.

``tfds.testing.mock_data`` itself cannot serve here: it needs the dataset's TFDS code, and
``coco_captions``' code needs TensorFlow (its ``image/id`` feature is ``tf.int64``), which this
project does not depend on (the builder's ``_info`` is run with ``tf.int64`` read as
``np.int64``); and it patches the reader, so the trainer's real read of prepared files would go
untested.
"""

from __future__ import annotations

import types
from unittest import mock

import numpy as np
import tensorflow_datasets as tfds

MOCK_SPLITS = {"train": 24, "restval": 8, "val": 16, "test": 4}
MOCKS = ("coco_captions",)


def encodable(feature, value):
    """A ``RandomFakeGenerator`` value that ``feature`` can encode without TensorFlow."""
    from PIL import Image

    if isinstance(feature, tfds.features.Image):
        return Image.fromarray(np.asarray(value))
    if isinstance(feature, tfds.features.BBoxFeature):
        v = np.asarray(value)
        return np.concatenate([np.minimum(v[..., :2], v[..., 2:]),
                               np.maximum(v[..., :2], v[..., 2:])], axis=-1)
    if isinstance(feature, tfds.features.FeaturesDict):
        return {k: encodable(feature[k], v) for k, v in value.items()}
    if isinstance(feature, tfds.features.Sequence) and isinstance(
            feature.feature, tfds.features.FeaturesDict):
        n = min(len(v) for v in value.values())
        return {k: encodable(feature.feature[k], v[:n]) for k, v in value.items()}
    return value


def prepare_mock(name: str, data_dir: str) -> tfds.core.DatasetBuilder:
    """Write the mock copy of ``name`` (one of :data:`MOCKS`) into ``data_dir``; its builder."""
    if name not in MOCKS:
        raise ValueError(f"no mock of {name!r}; mocks: {list(MOCKS)}")
    from tensorflow_datasets.object_detection import coco, coco_captions
    from tensorflow_datasets.testing.mocking import RandomFakeGenerator

    with tfds.core.registered.skip_registration():
        class MockCocoCaptions(coco_captions.CocoCaptions):
            """The real builder (name, config 2014, version, features); mock examples."""

            name = "coco_captions"

            def _split_generators(self, dl_manager):
                return {split: self._generate_examples(split, n)
                        for split, n in MOCK_SPLITS.items()}

            def _generate_examples(self, split, n):
                examples = RandomFakeGenerator(self.info.features, n, seed=len(split))
                for i, example in enumerate(examples):
                    yield i, encodable(self.info.features, example)

    with mock.patch.object(coco, "tf", types.SimpleNamespace(int64=np.int64)):
        builder = MockCocoCaptions(data_dir=data_dir, file_format="array_record")
        builder.download_and_prepare()
    return builder
