"""The learnable logit scale ``s = 1 / tau`` and its clip (docs/derivations.md §7.6)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

Array = jax.Array


def clip_active(log_scale: Array, max_scale: float) -> Array:
    """True where the clip binds: ``log_scale >= log(max_scale)``."""
    return jnp.asarray(log_scale) >= math.log(max_scale)


def logit_scale(log_scale: Array | float, max_scale: float = 100.0) -> Array:
    """``s = min(exp(log_scale), max_scale)``, active iff ``log_scale >= log(max_scale)``.

    Where it is active ``s`` is the constant ``max_scale`` and ``ds / dlog_scale = 0``, exactly
    (never NaN, even for a huge ``log_scale``). CLIP's cap of 100 means ``tau >= 0.01``
    (docs/derivations.md §7.6; [CLIP]).
    """
    log_scale = jnp.asarray(log_scale)
    active = clip_active(log_scale, max_scale)
    return jnp.where(active, max_scale, jnp.exp(jnp.where(active, 0.0, log_scale)))
