"""Pre-LayerNorm Transformer encoders: a ViT for images and a text tower for tokens."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models.dropout import ExampleDropout, fold_each
from contrastive_jax.training.models.precision import cast
from contrastive_jax.training.models.remat import checkpointed


def attention(query: jax.Array, key: jax.Array, value: jax.Array, bias=None,
              mask: jax.Array | None = None, **_) -> jax.Array:
    """Scaled dot-product attention ``softmax(q k^T / sqrt(d)) v`` with the softmax in
    ``promote_types(dtype, float32)``.

    ``query (..., T, heads, d)``, ``key`` and ``value (..., S, heads, d)``, ``mask``
    broadcastable to ``(..., heads, T, S)`` (True: attend). ``jax.nn.dot_product_attention``
    (Flax's default) always takes the softmax in float32, which rounds a float64 model to
    float32; here float64 stays float64 (the exactness tests of gradient accumulation rely on
    it) and half precision is still promoted to float32.
    """
    del bias  # no additive bias in these towers (MultiHeadAttention passes None)
    dtype = jnp.promote_types(query.dtype, jnp.float32)
    logits = jnp.einsum("...qhd,...khd->...hqk", query, key).astype(dtype)
    logits = logits / jnp.sqrt(jnp.asarray(query.shape[-1], dtype))
    if mask is not None:
        logits = jnp.where(mask, logits, jnp.finfo(dtype).min)
    weights = jax.nn.softmax(logits, axis=-1).astype(value.dtype)
    return jnp.einsum("...hqk,...khd->...qhd", weights, value)


class Block(nnx.Module):
    """``x + MHA(LN(x))``, then ``x + MLP(LN(x))`` (GELU, hidden ``mlp_ratio * width``).

    ``dtype``: the compute dtype (:mod:`.precision`; ``None``: the parameters' own); the
    parameters are float32 either way and LayerNorm's statistics and the softmax float32.
    """

    def __init__(self, width: int, heads: int, mlp_ratio: int, dropout: float, *,
                 dtype=None, rngs: nnx.Rngs):
        self.norm1 = nnx.LayerNorm(width, dtype=dtype, rngs=rngs)
        self.attention = nnx.MultiHeadAttention(heads, width, decode=False, rngs=rngs,
                                                keep_rngs=False, attention_fn=attention,
                                                dtype=dtype)
        self.norm2 = nnx.LayerNorm(width, dtype=dtype, rngs=rngs)
        self.fc1 = nnx.Linear(width, mlp_ratio * width, dtype=dtype, rngs=rngs)
        self.fc2 = nnx.Linear(mlp_ratio * width, width, dtype=dtype, rngs=rngs)
        self.dropout = ExampleDropout(dropout)

    def __call__(self, x: jax.Array, mask: jax.Array | None, *, train: bool,
                 dropout_keys: jax.Array | None) -> jax.Array:
        """``x (B, T, width)``; ``dropout_keys (B,)``: this block's per-example keys."""
        h = self.attention(self.norm1(x), mask=mask, deterministic=True)
        x = x + self.dropout(h, keys=fold_each(dropout_keys, 0), train=train)
        h = self.fc2(nnx.gelu(self.fc1(self.norm2(x))))
        return x + self.dropout(h, keys=fold_each(dropout_keys, 1), train=train)


def run_blocks(blocks, h: jax.Array, mask: jax.Array | None, *, train: bool,
               dropout_keys: jax.Array | None, remat_policy: str | None) -> jax.Array:
    """``h (B, T, width)`` through each :class:`Block` in turn (block ``i`` folds ``i`` into the
    dropout keys), each rematerialised under ``remat_policy`` (:mod:`.remat`; ``None``: off)."""
    def block_fn(block, h, mask, keys):
        return block(h, mask, train=train, dropout_keys=keys)

    step = checkpointed(block_fn, remat_policy)
    for depth, block in enumerate(blocks):
        h = step(block, h, mask, fold_each(dropout_keys, depth))
    return h


class ViT(nnx.Module):
    """Vision Transformer: ``patch x patch`` patches, learned positions, mean-pooled tokens.

    Input ``(B, H, W, C)``, output ``(B, features)`` in the compute dtype. Dropout
    (``dropout > 0`` and ``train``) needs ``dropout_keys``: one PRNG key per example
    (:mod:`.dropout`). ``dtype``: the compute dtype (:mod:`.precision`); ``remat_policy``: each
    block rematerialised under that policy (:mod:`.remat`; ``None``: off). Both are set from
    ``config.model`` by :func:`~contrastive_jax.training.models.build_model`.
    """

    def __init__(self, *, image_size: int, patch: int, in_channels: int = 3, width: int = 128,
                 depth: int = 4, heads: int = 4, mlp_ratio: int = 4, dropout: float = 0.0,
                 features: int = 128, dtype=None, remat_policy: str | None = None,
                 rngs: nnx.Rngs):
        if image_size % patch:
            raise ConfigError(f"image_size {image_size} must be a multiple of patch {patch}")
        self.embed = nnx.Conv(in_channels, width, (patch, patch), strides=patch,
                              padding="VALID", dtype=dtype, rngs=rngs)
        tokens = (image_size // patch) ** 2
        self.positions = nnx.Param(0.02 * jax.random.normal(rngs.params(), (1, tokens, width)))
        self.blocks = nnx.List([Block(width, heads, mlp_ratio, dropout, dtype=dtype, rngs=rngs)
                                for _ in range(depth)])
        self.norm = nnx.LayerNorm(width, dtype=dtype, rngs=rngs)
        self.out = nnx.Linear(width, features, dtype=dtype, rngs=rngs)
        self.image_size, self.in_channels, self.features = image_size, in_channels, features
        self.remat_policy = remat_policy

    def __call__(self, x: jax.Array, *, train: bool,
                 dropout_keys: jax.Array | None = None) -> jax.Array:
        if x.ndim != 4 or x.shape[1:] != (self.image_size, self.image_size, self.in_channels):
            raise ConfigError(f"ViT expects (batch, {self.image_size}, {self.image_size}, "
                             f"{self.in_channels}) images; got shape {x.shape}")
        h = self.embed(x)
        h = h.reshape(h.shape[0], -1, h.shape[-1]) + self.positions[...].astype(h.dtype)
        h = run_blocks(self.blocks, h, None, train=train, dropout_keys=dropout_keys,
                       remat_policy=self.remat_policy)
        return self.out(jnp.mean(self.norm(h), axis=1))


class TextTransformer(nnx.Module):
    """Text tower: token + position embeddings, Transformer blocks, mean over real tokens.

    Input ``(B, T)`` int token ids (0 = padding, masked out of attention and the mean),
    output ``(B, features)`` in the compute dtype. ``dtype`` and ``remat_policy`` as
    :class:`ViT`.
    """

    def __init__(self, *, vocab_size: int, max_tokens: int, width: int = 128, depth: int = 2,
                 heads: int = 4, mlp_ratio: int = 4, dropout: float = 0.0, features: int = 128,
                 dtype=None, remat_policy: str | None = None, rngs: nnx.Rngs):
        self.tokens = nnx.Embed(vocab_size, width, rngs=rngs)
        self.positions = nnx.Param(0.02 * jax.random.normal(rngs.params(),
                                                            (1, max_tokens, width)))
        self.blocks = nnx.List([Block(width, heads, mlp_ratio, dropout, dtype=dtype, rngs=rngs)
                                for _ in range(depth)])
        self.norm = nnx.LayerNorm(width, dtype=dtype, rngs=rngs)
        self.out = nnx.Linear(width, features, dtype=dtype, rngs=rngs)
        self.vocab_size, self.max_tokens, self.features = vocab_size, max_tokens, features
        self.dtype, self.remat_policy = dtype, remat_policy

    def __call__(self, tokens: jax.Array, *, train: bool,
                 dropout_keys: jax.Array | None = None) -> jax.Array:
        if tokens.ndim != 2 or tokens.shape[1] != self.max_tokens:
            raise ConfigError(f"TextTransformer expects (batch, {self.max_tokens}) token ids; "
                             f"got shape {tokens.shape}")
        if not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise ConfigError(f"token ids must be integers; got {tokens.dtype}")
        real = tokens != 0
        mask = real[:, None, None, :]  # (B, heads, query, key): attend to real tokens only
        # the lookup in the table's own dtype (nnx.Embed casts to the dtype it was built with,
        # which would turn a float64 model's gradient sums into float32 ones)
        # (then cast to the compute dtype; no-op by default)
        h = cast(jnp.take(self.tokens.embedding[...], tokens, axis=0) + self.positions[...],
                 self.dtype)
        h = run_blocks(self.blocks, h, mask, train=train, dropout_keys=dropout_keys,
                       remat_policy=self.remat_policy)
        h = self.norm(h) * real[..., None]
        return self.out(h.sum(1) / jnp.maximum(real.sum(1, keepdims=True), 1))
