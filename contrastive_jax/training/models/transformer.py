"""Pre-LayerNorm Transformer encoders: a ViT for images and a text tower for tokens."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from contrastive_jax.errors import ConfigError


class Block(nnx.Module):
    """``x + MHA(LN(x))``, then ``x + MLP(LN(x))`` (GELU, hidden ``mlp_ratio * width``)."""

    def __init__(self, width: int, heads: int, mlp_ratio: int, dropout: float, *,
                 rngs: nnx.Rngs):
        self.norm1 = nnx.LayerNorm(width, rngs=rngs)
        self.attention = nnx.MultiHeadAttention(heads, width, decode=False, rngs=rngs,
                                                keep_rngs=False)
        self.norm2 = nnx.LayerNorm(width, rngs=rngs)
        self.fc1 = nnx.Linear(width, mlp_ratio * width, rngs=rngs)
        self.fc2 = nnx.Linear(mlp_ratio * width, width, rngs=rngs)
        self.dropout = nnx.Dropout(dropout)

    def __call__(self, x: jax.Array, mask: jax.Array | None, *, train: bool,
                 rngs: nnx.Rngs | None) -> jax.Array:
        h = self.attention(self.norm1(x), mask=mask, deterministic=True)
        x = x + self.dropout(h, deterministic=not train, rngs=rngs)
        h = self.fc2(nnx.gelu(self.fc1(self.norm2(x))))
        return x + self.dropout(h, deterministic=not train, rngs=rngs)


class ViT(nnx.Module):
    """Vision Transformer: ``patch x patch`` patches, learned positions, mean-pooled tokens.

    Input ``(B, H, W, C)``, output ``(B, features)``. Dropout needs ``rngs`` when ``train``.
    """

    def __init__(self, *, image_size: int, patch: int, in_channels: int = 3, width: int = 128,
                 depth: int = 4, heads: int = 4, mlp_ratio: int = 4, dropout: float = 0.0,
                 features: int = 128, rngs: nnx.Rngs):
        if image_size % patch:
            raise ConfigError(f"image_size {image_size} must be a multiple of patch {patch}")
        self.embed = nnx.Conv(in_channels, width, (patch, patch), strides=patch,
                              padding="VALID", rngs=rngs)
        tokens = (image_size // patch) ** 2
        self.positions = nnx.Param(0.02 * jax.random.normal(rngs.params(), (1, tokens, width)))
        self.blocks = nnx.List([Block(width, heads, mlp_ratio, dropout, rngs=rngs)
                                for _ in range(depth)])
        self.norm = nnx.LayerNorm(width, rngs=rngs)
        self.out = nnx.Linear(width, features, rngs=rngs)
        self.image_size, self.in_channels, self.features = image_size, in_channels, features

    def __call__(self, x: jax.Array, *, train: bool, rngs: nnx.Rngs | None = None) -> jax.Array:
        if x.ndim != 4 or x.shape[1:] != (self.image_size, self.image_size, self.in_channels):
            raise ConfigError(f"ViT expects (batch, {self.image_size}, {self.image_size}, "
                             f"{self.in_channels}) images; got shape {x.shape}")
        h = self.embed(x)
        h = h.reshape(h.shape[0], -1, h.shape[-1]) + self.positions[...]
        for block in self.blocks:
            h = block(h, None, train=train, rngs=rngs)
        return self.out(jnp.mean(self.norm(h), axis=1))


class TextTransformer(nnx.Module):
    """Text tower: token + position embeddings, Transformer blocks, mean over real tokens.

    Input ``(B, T)`` int token ids (0 = padding, masked out of attention and the mean),
    output ``(B, features)``.
    """

    def __init__(self, *, vocab_size: int, max_tokens: int, width: int = 128, depth: int = 2,
                 heads: int = 4, mlp_ratio: int = 4, dropout: float = 0.0, features: int = 128,
                 rngs: nnx.Rngs):
        self.tokens = nnx.Embed(vocab_size, width, rngs=rngs)
        self.positions = nnx.Param(0.02 * jax.random.normal(rngs.params(),
                                                            (1, max_tokens, width)))
        self.blocks = nnx.List([Block(width, heads, mlp_ratio, dropout, rngs=rngs)
                                for _ in range(depth)])
        self.norm = nnx.LayerNorm(width, rngs=rngs)
        self.out = nnx.Linear(width, features, rngs=rngs)
        self.vocab_size, self.max_tokens, self.features = vocab_size, max_tokens, features

    def __call__(self, tokens: jax.Array, *, train: bool,
                 rngs: nnx.Rngs | None = None) -> jax.Array:
        if tokens.ndim != 2 or tokens.shape[1] != self.max_tokens:
            raise ConfigError(f"TextTransformer expects (batch, {self.max_tokens}) token ids; "
                             f"got shape {tokens.shape}")
        if not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise ConfigError(f"token ids must be integers; got {tokens.dtype}")
        real = tokens != 0
        mask = real[:, None, None, :]  # (B, heads, query, key): attend to real tokens only
        h = self.tokens(tokens) + self.positions[...]
        for block in self.blocks:
            h = block(h, mask, train=train, rngs=rngs)
        h = self.norm(h) * real[..., None]
        return self.out(h.sum(1) / jnp.maximum(real.sum(1, keepdims=True), 1))
