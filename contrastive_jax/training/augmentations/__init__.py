"""Data augmentations in JAX: jit-able, one key per example, for 1-D signals and images.

``augment(batch, key, config)`` applies a random augmentation to every example and
``two_views(batch, key, config)`` gives SimCLR's positive pair ([SimCLR] §2.1;
docs/derivations.md §9.1 step 1); ``augment_each`` and ``two_views_each`` take one key per
example instead (the trainer's form: an example's views do not depend on its batch).
``default_augment_config`` returns the strengths, one float per op, 0 meaning off (the
identity). The per-example ops, each ``(x, key, strength) -> y``, live in
:mod:`contrastive_jax.training.augmentations.signal` (``(L, C)`` signals) and
:mod:`contrastive_jax.training.augmentations.image` (``(H, W, C)`` images in ``[0, 1]``), with
the deterministic ops they are built from.

``recipe_augment_config("simclr" | "moco_v2" | "moco_v3", image_size)`` returns the papers'
recipes at ImageNet scale with torchvision's semantics
(:mod:`contrastive_jax.training.augmentations.family`; the device crop:
:mod:`contrastive_jax.training.augmentations.crop`); the same four functions run them, on a
batch of images or of two views per example cropped by the input workers.
"""

from contrastive_jax.training.augmentations import crop, family, image, signal
from contrastive_jax.training.augmentations.family import RECIPES, recipe_augment_config
from contrastive_jax.training.augmentations.views import (
    IMAGE_OPS,
    KINDS,
    SIGNAL_OPS,
    augment,
    augment_each,
    default_augment_config,
    two_views,
    two_views_each,
)

__all__ = [
    "IMAGE_OPS",
    "KINDS",
    "RECIPES",
    "SIGNAL_OPS",
    "augment",
    "augment_each",
    "crop",
    "default_augment_config",
    "family",
    "image",
    "recipe_augment_config",
    "signal",
    "two_views",
    "two_views_each",
]
