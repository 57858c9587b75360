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
"""

from contrastive_jax.training.augmentations import image, signal
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
    "SIGNAL_OPS",
    "augment",
    "augment_each",
    "default_augment_config",
    "image",
    "signal",
    "two_views",
    "two_views_each",
]
