"""Dropout with one key per example, so a model's randomness does not depend on the batch.

``nnx.Dropout`` draws one mask for the whole ``(B, ...)`` array from one key: the mask of
example ``b`` then depends on the batch it sits in. Gradient accumulation
(:mod:`contrastive_jax.training.step.accumulation`) runs the same examples as ``K`` micro-batches
and must draw the same masks as one batch, so here example ``b`` draws from its own key
``keys[b]``: ``mask_b ~ Bernoulli(1 - rate)`` over the example's shape, ``y_b = mask_b x_b /
(1 - rate)`` (inverted dropout, [Dropout] in docs/references.md).

Each dropout site gets its own stream by folding a site index into every example's key
(:func:`fold_each`): the towers fold in their index, each Transformer block its depth, each
site in a block its position; patch dropout (:func:`drop_patches`) folds in
:data:`PATCH_DROPOUT_SITE`.
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


# the dropout-key site of patch dropout: blocks fold in their index 0 .. depth - 1
PATCH_DROPOUT_SITE = 2**31 - 1


def check_patch_dropout(p) -> float:
    """``p`` as a float if ``0 <= p < 1``, else a :class:`ConfigError` saying what to set."""
    if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= p < 1.0:
        raise ConfigError(f"ViT patch_dropout is the fraction of patch tokens dropped in "
                          f"training and must lie in [0, 1) (0: off); got {p!r}")
    return float(p)


def kept_patches(patches: int, p: float) -> int:
    """``max(1, round((1 - p) patches))``: the patch tokens each example keeps under patch
    dropout ``p`` (196 patches: 98 at p = 0.5, 49 at p = 0.75)."""
    return max(1, round((1.0 - p) * patches))


def drop_patches(h: jax.Array, keys: jax.Array | None, kept: int, prefix: int) -> jax.Array:
    """Patch dropout ([FLIP]; a ViT's ``patch_dropout``): each example keeps ``kept`` patches.

    ``h (B, prefix + P, width)``: ``prefix`` leading tokens (the class token) always kept, then
    ``P`` patch tokens; ``keys (B,)``: one PRNG key per example. Example ``b`` draws
    ``u ~ U(0, 1)^P`` from ``fold_in(keys[b], PATCH_DROPOUT_SITE)`` and keeps the patches of
    the ``kept`` smallest ``u``, in their original order. Returns ``(B, prefix + kept,
    width)``. Each example's subset depends on its own key only, so micro-batches draw the
    subsets one batch does.
    """
    if keys is None or keys.shape != h.shape[:1]:
        raise ConfigError(f"patch dropout in training needs one key per example: keys of shape "
                          f"({h.shape[0]},); got {None if keys is None else keys.shape}")
    patches = h.shape[1] - prefix
    site = fold_each(keys, PATCH_DROPOUT_SITE)
    u = jax.vmap(lambda k: jax.random.uniform(k, (patches,)))(site)
    index = jnp.sort(jnp.argsort(u, axis=1)[:, :kept], axis=1) + prefix  # (B, kept)
    kept_tokens = jnp.take_along_axis(h, index[:, :, None], axis=1)
    return jnp.concatenate([h[:, :prefix], kept_tokens], axis=1)
