"""Dropout with one key per example, so a model's randomness does not depend on the batch.

``nnx.Dropout`` draws one mask for the whole ``(B, ...)`` array from one key: the mask of
example ``b`` then depends on the batch it sits in. Gradient accumulation
(:mod:`contrastive_jax.training.step.accumulation`) runs the same examples as ``K`` micro-batches
and must draw the same masks as one batch, so here example ``b`` draws from its own key
``keys[b]``: ``mask_b ~ Bernoulli(1 - rate)`` over the example's shape, ``y_b = mask_b x_b /
(1 - rate)`` (inverted dropout, [Dropout] in docs/references.md).

Each dropout site gets its own stream by folding a site index into every example's key
(:func:`fold_each`): the towers fold in their index, each Transformer block its depth, each
site in a block its position.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
from flax import nnx

from contrastive_jax.errors import ConfigError


def fold_each(keys: jax.Array, index: int) -> jax.Array:
    """``fold_in(keys[b], index)`` for every example key ``keys (B,)``; ``None`` stays ``None``."""
    if keys is None:
        return None
    return jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, index)


def apply_encoder(encoder: nnx.Module, x: jax.Array, train: bool,
                  dropout_keys: jax.Array | None) -> jax.Array:
    """``encoder(x, train=train, dropout_keys=dropout_keys)`` for an encoder with dropout (one
    key per example, ``dropout_keys (B,)``), ``encoder(x, train=train)`` for one without (conv
    nets and MLPs take no keys)."""
    if "dropout_keys" in inspect.signature(encoder.__call__).parameters:
        return encoder(x, train=train, dropout_keys=dropout_keys)
    return encoder(x, train=train)


class ExampleDropout(nnx.Module):
    """Inverted dropout at ``rate``; example ``b``'s mask comes from ``keys[b]``."""

    def __init__(self, rate: float):
        if not 0.0 <= rate < 1.0:
            raise ConfigError(f"dropout rate must lie in [0, 1); got {rate}")
        self.rate = rate

    def __call__(self, x: jax.Array, *, keys: jax.Array | None, train: bool) -> jax.Array:
        """``x (B, ...)``; ``keys (B,)`` typed PRNG keys, needed when ``train`` and rate > 0."""
        if not train or self.rate == 0.0:
            return x
        if keys is None or keys.shape != x.shape[:1]:
            raise ConfigError(f"dropout in training needs one key per example: keys of shape "
                             f"({x.shape[0]},); got {None if keys is None else keys.shape}")
        keep = 1.0 - self.rate
        mask = jax.vmap(lambda k: jax.random.bernoulli(k, keep, x.shape[1:]))(keys)
        return jnp.where(mask, x / keep, jnp.zeros_like(x))
