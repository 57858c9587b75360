"""Pixels on the device: uint8 in, the model's input out.

The host sends images as uint8 (a quarter of float32's bytes over the host-to-device link;
docs/data.md "Host pipeline"); the train step and the evaluation turn them into what the
image tower reads, in this order::

    uint8 (B, H, W, C) --unit_range--> float32 in [0, 1] --augmentations--> --normalize--> model

The augmentations (:mod:`contrastive_jax.training.augmentations.image`) act on ``[0, 1]``
images, so the per-channel normalisation comes after them, as in torchvision's and open_clip's
``Compose([..., ToTensor(), Normalize(mean, std)])``.

``pixels`` is ``None`` (no normalisation: the tower reads ``[0, 1]``, the default) or a pair
``(mean, std)`` of per-channel tuples from ``data.preprocess.mean`` / ``.std``
(:func:`pixel_normalization`). CLIP's values (OpenAI's, also open_clip's for its OpenAI and
LAION checkpoints) are :data:`CLIP_MEAN` and :data:`CLIP_STD`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from contrastive_jax.errors import ConfigError

Pixels = tuple[tuple[float, ...], tuple[float, ...]] | None

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
"""Per-channel (R, G, B) mean and standard deviation of CLIP's training images, on ``[0, 1]``
pixels ([CLIP]'s released preprocessing; open_clip's ``OPENAI_DATASET_MEAN`` / ``_STD``)."""


def unit_range(x: jax.Array) -> jax.Array:
    """uint8 ``x`` -> float32 ``x / 255`` in ``[0, 1]``; a floating ``x`` is returned as it is
    (the standard preprocessing already scaled it on the host)."""
    if x.dtype == jnp.uint8:
        return x.astype(jnp.float32) / jnp.float32(255.0)
    return x


def normalize(x: jax.Array, pixels: Pixels) -> jax.Array:
    """``(x - mean) / std`` over the last (channel) axis; ``pixels=None`` returns ``x``.

    ``x``: ``(..., C)`` floating, ``C = len(mean)``.
    """
    if pixels is None:
        return x
    mean, std = (jnp.asarray(v, x.dtype) for v in pixels)
    if x.shape[-1] != mean.shape[0]:
        raise ValueError(f"data.preprocess.mean/std have {mean.shape[0]} channels; the images "
                         f"have {x.shape[-1]} (shape {x.shape})")
    return (x - mean) / std


def model_input(x: jax.Array, pixels: Pixels) -> jax.Array:
    """``normalize(unit_range(x), pixels)``: the model's input when no augmentation runs
    (evaluation)."""
    return normalize(unit_range(x), pixels)


def pixel_normalization(preprocess: Mapping[str, Any] | None) -> Pixels:
    """``(mean, std)`` from a ``data.preprocess`` block's ``mean`` and ``std`` (both or
    neither), or ``None``. A ConfigError names the field for a missing partner, a length that
    differs, or a ``std`` that is not positive."""
    preprocess = dict(preprocess or {})
    mean, std = preprocess.get("mean"), preprocess.get("std")
    if mean is None and std is None:
        return None
    if mean is None or std is None:
        raise ConfigError("set both data.preprocess.mean and data.preprocess.std (per-channel "
                          "values on [0, 1] pixels), or neither")
    mean, std = _floats(mean, "mean"), _floats(std, "std")
    if len(mean) != len(std):
        raise ConfigError(f"data.preprocess.mean has {len(mean)} channels and .std "
                          f"{len(std)}; give one value per channel to both")
    if not all(np.isfinite(mean)) or not all(s > 0 and np.isfinite(s) for s in std):
        raise ConfigError(f"data.preprocess.mean must be finite and .std positive; got "
                          f"mean={mean}, std={std}")
    return mean, std


def _floats(values: Any, field: str) -> tuple[float, ...]:
    if isinstance(values, str | bytes) or not isinstance(values, Sequence | np.ndarray):
        raise ConfigError(f"data.preprocess.{field} must be a list of per-channel numbers "
                          f"(e.g. CLIP's {list(CLIP_MEAN if field == 'mean' else CLIP_STD)}); "
                          f"got {values!r}")
    try:
        return tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise ConfigError(f"data.preprocess.{field} must be numbers; got {values!r}") from None
