"""ImageNet (ILSVRC-2012, TFDS ``imagenet2012``) as the SimCLR and MoCo templates read it.

The dataset must be prepared once as array_record in ``data.data_dir`` (TFDS needs the
manually downloaded ``ILSVRC2012_img_{train,val}.tar``: ``tfds build imagenet2012
--manual_dir=DIR --data_dir=DATA_DIR --file_format=array_record``); the trainer reads the
prepared folder, as the CLIP template reads ``coco_captions``. Training reads ``train``
(1,281,167 images), evaluation ``validation`` (50,000).

:func:`imagenet_data_config` is the ``data`` block of the templates
(``configs/simclr_resnet50_imagenet.py``, ``configs/moco_v2_resnet50_imagenet.py``,
``configs/moco_v3_vit_imagenet.py``): each training example decoded once (JPEGs at reduced size
where the crops allow) and cropped twice by the recipe's random resized crop to
``image_size`` in the input workers, uint8 to the device (the rest of the recipe runs there:
:func:`contrastive_jax.training.augmentations.recipe_augment_config`; why, measured:
docs/benchmarks.md "Image input for the SimCLR family at 224"); evaluation images are the
centre crop of the shorter side resized to ``image_size`` (bilinear).

The ``tiny`` variants read the mock copy (``python -m contrastive_jax.training.data.prepare
--mock imagenet2012 --data_dir=DIR``: 64 train and 32 validation images).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import ml_collections

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.data.pipeline import default_data_config

TRAIN_EXAMPLES = 1_281_167
"""Images of ``imagenet2012[train]`` (TFDS catalog, 5.1.0)."""
VALIDATION_EXAMPLES = 50_000
IMAGENET_MEAN = (0.485, 0.456, 0.406)
"""torchvision's ImageNet channel means and standard deviations (MoCo's normalisation)."""
IMAGENET_STD = (0.229, 0.224, 0.225)


def steps_for_epochs(epochs: float, batch: int, examples: int = TRAIN_EXAMPLES) -> int:
    """``ceil(epochs * examples / batch)``: the steps of ``epochs`` passes at global ``batch``."""
    if not epochs > 0 or isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigError(f"epochs must be > 0 and batch a positive integer; got epochs="
                          f"{epochs!r}, batch={batch!r}")
    return math.ceil(epochs * examples / batch)


def imagenet_data_config(augment: ml_collections.ConfigDict, batch: int, *,
                         normalize: bool) -> ml_collections.ConfigDict:
    """The ``data`` block for a recipe's ``augment`` (its ``size``, ``crop_scale`` and
    ``crop_ratio`` are the host crops'; two views per example) at global ``batch``;
    ``normalize``: ImageNet's mean and std applied on the device (MoCo), else pixels in
    [0, 1] (SimCLR's code). 24 input worker processes per host: the two crops of a 224-px
    view pair take about 1.9 ms of a core (docs/benchmarks.md), so a v4 host (4 chips) at
    the plan's stated MFU needs about 22 cores."""
    config = default_data_config()
    config.update({"name": "imagenet2012", "train_split": "train",
                   "eval_split": "validation", "batch_size": batch, "num_threads": 2,
                   "worker_count": 24, "prefetch": 4, "eval_batch_size": 2048})
    config.preprocess = {
        "name": "image", "image_key": "image", "image_size": augment.size, "views": 2,
        "crop": "random", "crop_scale": tuple(augment.crop_scale),
        "crop_ratio": tuple(augment.crop_ratio), "resize": "bilinear",
        "reduced_decode": True, "extra_features": ("label",),
        "mean": IMAGENET_MEAN if normalize else None,
        "std": IMAGENET_STD if normalize else None}
    return config


def make_tiny_data(config: ml_collections.ConfigDict) -> None:
    """The ``tiny`` variants' reading of the mock ``imagenet2012`` (64 images): global batch
    16 on the 8 CPU devices of the tests, no worker processes."""
    config.data.update({"batch_size": 16, "eval_batch_size": 16, "num_threads": 1,
                        "worker_count": 0, "prefetch": 1})


SMALL_BATCH = 256
SMALL_STEPS = 300


def make_small_run(config: ml_collections.ConfigDict, variant: Any,
                   fixed: Mapping[str, Any], *, normalize: bool) -> None:
    """The ``small`` variants (the recipe at CPU size, experiments/ssl_recipes.py): the generated
    ``shapes`` at 32 px (:mod:`~contrastive_jax.training.data.datasets.shapes`; two host crops
    per example, as the ImageNet reading) with ``config.augment`` (the recipe at
    ``shapes.SIZE``, set by the caller), batch :data:`SMALL_BATCH`, ``variant.steps`` or
    :data:`SMALL_STEPS` steps, float32, the linear probe and kNN on ``shapes`` every 75 steps.
    A variant setting of ``fixed`` (name: the template's default) given another value is a
    :class:`ConfigError`: the small variant sets it itself."""
    changed = sorted(k for k, default in fixed.items() if variant[k] != default)
    if changed:
        raise ConfigError(f"the small variant sets {changed} itself; leave them out (or "
                          "set the fields with --config.FIELD=VALUE)")
    config.data = imagenet_data_config(config.augment, SMALL_BATCH, normalize=normalize)
    config.data.update({"name": "shapes", "train_split": "train", "eval_split": "test",
                        "num_threads": 2, "worker_count": 0, "prefetch": 2,
                        "eval_batch_size": 500})
    config.total_steps = variant.steps or SMALL_STEPS
    config.model.dtype = "float32"
    config.evaluation.classification = True  # linear probe and kNN on shapes train/test
    config.evaluation.tasks = ()
    config.evaluation.every = 75
    config.log_every = 10
