"""CLIP's dual encoder: a sample tower and a text tower into one embedding space ([CLIP];
docs/derivations.md §8)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models.dropout import apply_encoder, fold_each
from contrastive_jax.training.models.precision import up_to_float32


class DualEncoder(nnx.Module):
    """Two towers, each an encoder and a linear projection to ``embed_dim``, and the logit scale.

    ``log_scale`` is a learnable parameter initialised to ``log(1 / init_temperature)``
    (CLIP: ``init_temperature = 0.07``); the loss uses ``min(exp(log_scale), 100)`` and the
    trainer clamps the parameter at ``log 100`` after each update (docs/derivations.md §7.6). With
    ``siglip=True`` there is also a learnable ``bias`` (SigLIP: init ``log_scale = log 10``,
    ``bias = -10``, Zhai et al. 2023). ``dtype``: the compute dtype of the projections
    (:mod:`.precision`; the towers get theirs from :func:`~.build_model`); the embeddings leave
    the module in float32 (or float64) whatever it is.
    """

    def __init__(self, sample_encoder: nnx.Module, text_encoder: nnx.Module, *,
                 embed_dim: int, init_temperature: float = 0.07, siglip: bool = False,
                 init_bias: float = -10.0, dtype=None, rngs: nnx.Rngs):
        if init_temperature <= 0:
            raise ConfigError(f"init_temperature must be > 0; got {init_temperature}")
        self.sample_encoder, self.text_encoder = sample_encoder, text_encoder
        self.sample_proj = nnx.Linear(sample_encoder.features, embed_dim, use_bias=False,
                                      dtype=dtype, rngs=rngs)
        self.text_proj = nnx.Linear(text_encoder.features, embed_dim, use_bias=False,
                                    dtype=dtype, rngs=rngs)
        self.log_scale = nnx.Param(jnp.asarray(math.log(1.0 / init_temperature), jnp.float32))
        self.bias = nnx.Param(jnp.asarray(init_bias, jnp.float32)) if siglip else None
        self.embed_dim = embed_dim

    def __call__(self, sample: jax.Array, tokens: jax.Array, *, train: bool,
                 dropout_keys: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """``(x, y)`` embeddings ``(B, embed_dim)`` of the samples and the captions;
        ``dropout_keys (B,)``: one key per pair (the towers fold in 0 and 1)."""
        return (self.embed_samples(sample, train=train, dropout_keys=fold_each(dropout_keys, 0)),
                self.embed_texts(tokens, train=train, dropout_keys=fold_each(dropout_keys, 1)))

    def embed_samples(self, sample: jax.Array, *, train: bool = False,
                      dropout_keys: jax.Array | None = None) -> jax.Array:
        """``(B, embed_dim)`` embeddings of the samples, float32."""
        return up_to_float32(self.sample_proj(apply_encoder(self.sample_encoder, sample, train,
                                                         dropout_keys)))

    def embed_texts(self, tokens: jax.Array, *, train: bool = False,
                    dropout_keys: jax.Array | None = None) -> jax.Array:
        """``(B, embed_dim)`` embeddings of the token ids, float32."""
        return up_to_float32(self.text_proj(apply_encoder(self.text_encoder, tokens, train,
                                                       dropout_keys)))

    def features(self, sample: jax.Array) -> jax.Array:
        """Sample-tower representations ``(B, sample_encoder.features)`` (before the projection)
        in inference mode for probes, float32."""
        return up_to_float32(apply_encoder(self.sample_encoder, sample, False, None))
