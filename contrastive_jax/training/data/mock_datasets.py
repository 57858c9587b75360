"""Tiny prepared copies of real TFDS datasets, with random examples: the pod template's ``tiny``
variant, the ImageNet runs' tests and their evaluation run on them with no download.

``python -m contrastive_jax.training.data.prepare --mock NAME --data_dir=DIR`` writes the real
builder's name, config, version, features and splits, with :data:`MOCK_SIZES` examples per
split, as array_record files that :func:`~contrastive_jax.training.data.sources.open_split`
reads like the real prepared dataset:

- ``coco_captions``: ``DIR/coco_captions/2014/1.1.0/`` (train, restval, val, test;
  :data:`MOCK_SPLITS`). The examples are ``tfds.testing``'s ``RandomFakeGenerator`` ones (what
  ``tfds.testing.mock_data`` yields), made encodable without TensorFlow: images as PIL images
  (JPEG-encoded), the sub-features of a sequence cut to one length, boxes ordered.
- ``imagenet2012``: ``DIR/imagenet2012/5.1.0/`` (train, validation; :data:`IMAGENET_SPLITS`):
  ``image`` (JPEG), ``label`` (``ClassLabel`` of the 1,000 WordNet ids), ``file_name``. The
  labels cycle through the few classes of :data:`IMAGENET_CLASSES` (each split holds every one
  several times, so a kNN or linear probe has neighbours and rows of each class); an image is
  its class's colour, shifted per image, plus noise (:func:`imagenet_example`), of a random
  size in :data:`IMAGENET_SIDES` per side (at least 64 pixels: a 224 template's random resized
  crop upsamples any crop of it). The real builder reads the manual download
  (``ILSVRC2012_img_train.tar``); the mock's split generators replace that.

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
IMAGENET_SPLITS = {"train": 64, "validation": 32}
IMAGENET_CLASSES = (0, 1, 417, 999)  # TFDS label ids: tench, goldfish, balloon, toilet tissue
IMAGENET_SIDES = (64, 160)  # each side drawn uniformly from [64, 160]
MOCKS = ("coco_captions", "imagenet2012")
MOCK_SIZES = {"coco_captions": MOCK_SPLITS, "imagenet2012": IMAGENET_SPLITS}


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
    if name == "imagenet2012":
        return _prepare_imagenet(data_dir)
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


def imagenet_example(split: str, index: int) -> dict:
    """Example ``index`` of the mock ``imagenet2012[split]``: ``{"image": PIL RGB image,
    "label": int, "file_name": str}``. The label is ``IMAGENET_CLASSES[index % 4]``; the image
    its class's colour (drawn in [60, 160) per channel by ``default_rng(label)``) shifted by an
    offset of the image in [-40, 40] per channel, plus noise in [0, 48) per pixel, so that the
    classes overlap; its sides and noise from ``default_rng((split's index, index))``."""
    from PIL import Image

    rng = np.random.default_rng((tuple(IMAGENET_SPLITS).index(split), index))
    label = IMAGENET_CLASSES[index % len(IMAGENET_CLASSES)]
    height, width = rng.integers(IMAGENET_SIDES[0], IMAGENET_SIDES[1] + 1, size=2)
    colour = np.random.default_rng(label).integers(60, 160, size=3) + rng.integers(-40, 41, 3)
    pixels = colour + rng.integers(0, 48, size=(height, width, 3))
    name = (f"{_wordnet_ids()[label]}_{index}.JPEG" if split == "train"
            else f"ILSVRC2012_val_{index + 1:08d}.JPEG")
    return {"image": Image.fromarray(pixels.astype(np.uint8)), "label": label,
            "file_name": name}


def _wordnet_ids() -> list[str]:
    from tensorflow_datasets.datasets.imagenet2012 import imagenet_common

    with open(imagenet_common.label_names_file()) as f:
        return f.read().split()


def _prepare_imagenet(data_dir: str) -> tfds.core.DatasetBuilder:
    from tensorflow_datasets.datasets.imagenet2012 import imagenet2012_dataset_builder as real

    with tfds.core.registered.skip_registration():
        class MockImagenet2012(real.Builder):
            """The real builder (name, version 5.1.0, features); mock examples instead of the
            manual download."""

            name = "imagenet2012"

            def _split_generators(self, dl_manager):
                return {split: self._generate_examples(split, n)
                        for split, n in IMAGENET_SPLITS.items()}

            def _generate_examples(self, split, n):  # the real one reads a tar archive
                for i in range(n):
                    yield i, imagenet_example(split, i)

    builder = MockImagenet2012(data_dir=data_dir, file_format="array_record")
    builder.download_and_prepare()
    return builder
