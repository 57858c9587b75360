"""The augmentation functions' boundary checks: a batch of the kind's shape and a floating dtype,
one PRNG key; each mistake a :class:`~contrastive_jax.errors.ConfigError` saying what to change
(:mod:`~contrastive_jax.training.augmentations.views` calls them before any tracing)."""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp

from contrastive_jax.errors import ConfigError

Array = jax.Array


def check_augment_batch(kind: str, batch, views: bool = False) -> Array:
    """The batch as an array, or a ConfigError; ``views``: a ``(B, 2, H, W, C)`` batch of two
    views per example is accepted too (the views the input workers cropped)."""
    shape = tuple(jnp.shape(batch))
    if len(shape) == 5 and not views and kind == "image":
        raise ConfigError(f"a batch of two views per example {shape} needs an augment recipe "
                          "with crop='host' (recipe_augment_config(...))")
    if views and len(shape) == 5:
        if shape[1] != 2:
            raise ConfigError(f"a batch of views must be (batch, 2, height, width, channels); "
                              f"got shape {shape}")
        shape = (shape[0], *shape[2:])
    if kind == "signal" and len(shape) != 3:
        fix = {
            1: "add batch and channel axes (x[None, :, None])",
            2: "add a channel axis (batch[..., None])",
        }.get(len(shape), "pass one (length, channels) signal per row")
        raise ConfigError(f"signals must be (batch, length, channels); got shape {shape}: {fix}.")
    if kind == "image":
        if len(shape) != 4:
            fix = {
                2: "add batch and channel axes (x[None, ..., None])",
                3: "add a channel axis (batch[..., None]) for a batch of grayscale images, or a "
                "batch axis (x[None]) for one (H, W, C) image",
            }.get(len(shape), "pass one (height, width, channels) image per row")
            raise ConfigError(
                f"images must be (batch, height, width, channels); got shape {shape}: {fix}."
            )
        if shape[-1] not in (1, 3):
            hint = " (channels first? transpose to (B, H, W, C))" if shape[1] in (1, 3) else ""
            raise ConfigError(
                f"images must have 1 (grayscale) or 3 (RGB) channels last; got shape {shape} "
                f"with {shape[-1]} channels{hint}."
            )
    if math.prod(shape[1:]) == 0:
        raise ConfigError(f"every example must be non-empty; got shape {shape}.")
    dtype = jnp.result_type(batch)
    if not jnp.issubdtype(dtype, jnp.floating):
        what = " in [0, 1] (e.g. x / 255 for uint8 images)" if kind == "image" else ""
        raise ConfigError(
            f"{kind}s must be floating point; got dtype {dtype}. Cast them to float32{what}."
        )
    return jnp.asarray(batch)


def check_key(key) -> None:
    """A ConfigError unless ``key`` is one PRNG key (typed, or a raw ``uint32`` pair)."""
    if isinstance(key, numbers.Number) or not hasattr(key, "dtype"):
        raise ConfigError(f"key must be a JAX PRNG key such as jax.random.key(seed); got {key!r}.")
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        ok = key.ndim == 0
    else:
        ok = key.dtype == jnp.uint32 and key.ndim == 1
    if not ok:
        raise ConfigError(
            f"key must be one PRNG key (jax.random.key(seed)); got shape {key.shape}, dtype "
            f"{key.dtype}. Pass a single key: the batch functions split it into one per example."
        )
