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

PROJECTIONS = ("linear", "linear_bias", "none")


def projection(option: str, value: str, features: int, embed_dim: int, dtype,
               rngs: nnx.Rngs) -> nnx.Linear | None:
    """One tower's projection to ``embed_dim`` as ``model.<option>`` = ``value`` says:
    ``"linear"``: ``x W``, ``W (features, embed_dim)`` (CLIP's bias-free ``proj`` /
    ``text_projection``); ``"linear_bias"``: ``x W + b`` (open_clip's ``nn.Linear``
    ``text_projection`` with ``proj_bias=True``, whose ``weight (embed_dim, features)`` is
    ``W^T``; SigLIP's text tower, [OpenCLIP]); ``"none"``: the identity, no parameter (the
    tower's ``features`` must be ``embed_dim``; open_clip's ``timm_proj='none'``). Unknown
    values and a ``"none"`` whose sizes differ are a :class:`ConfigError`."""
    if value not in PROJECTIONS:
        raise ConfigError(f"model.{option} must be one of {list(PROJECTIONS)}; got {value!r}")
    if value == "none":
        if features != embed_dim:
            raise ConfigError(f"model.{option}='none' (no projection) needs the tower's "
                              f"features to equal embed_dim; got features {features} and "
                              f"embed_dim {embed_dim}: set the tower's features to {embed_dim} "
                              f"or use 'linear'")
        return None
    return nnx.Linear(features, embed_dim, use_bias=value == "linear_bias", dtype=dtype,
                      rngs=rngs)


class DualEncoder(nnx.Module):
    """Two towers, each an encoder and a projection to ``embed_dim``, and the logit scale.

    ``sample_projection`` / ``text_projection`` (:func:`projection`): ``"linear"`` (default,
    bias-free: parameters ``sample_proj/kernel``, ``text_proj/kernel``), ``"linear_bias"``
    (also ``.../bias``) or ``"none"`` (no ``sample_proj`` / ``text_proj`` parameter at all; the
    embedding is the tower's output).

    ``log_scale`` is a learnable parameter initialised to ``log(1 / init_temperature)``
    (CLIP: ``init_temperature = 0.07``); the loss uses ``min(exp(log_scale), 100)`` and the
    trainer clamps the parameter at ``log 100`` after each update (docs/derivations.md §7.6). With
    ``siglip=True`` there is also a learnable ``bias`` (SigLIP: init ``log_scale = log 10``,
    ``bias = -10``, [SigLIP]). ``dtype``: the compute dtype of the projections
    (:mod:`.precision`; the towers get theirs from :func:`~.build_model`); the embeddings leave
    the module in float32 (or float64) whatever it is.
    """

    def __init__(self, sample_encoder: nnx.Module, text_encoder: nnx.Module, *,
                 embed_dim: int, init_temperature: float = 0.07, siglip: bool = False,
                 init_bias: float = -10.0, sample_projection: str = "linear",
                 text_projection: str = "linear", dtype=None, rngs: nnx.Rngs):
        if init_temperature <= 0:
            raise ConfigError(f"init_temperature must be > 0; got {init_temperature}")
        self.sample_encoder, self.text_encoder = sample_encoder, text_encoder
        self.sample_proj = projection("sample_projection", sample_projection,
                                      sample_encoder.features, embed_dim, dtype, rngs)
        self.text_proj = projection("text_projection", text_projection, text_encoder.features,
                                    embed_dim, dtype, rngs)
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
        return up_to_float32(_projected(self.sample_proj, apply_encoder(
            self.sample_encoder, sample, train, dropout_keys)))

    def embed_texts(self, tokens: jax.Array, *, train: bool = False,
                    dropout_keys: jax.Array | None = None) -> jax.Array:
        """``(B, embed_dim)`` embeddings of the token ids, float32."""
        return up_to_float32(_projected(self.text_proj, apply_encoder(
            self.text_encoder, tokens, train, dropout_keys)))

    def representations(self, sample: jax.Array) -> jax.Array:
        """Sample-tower representations ``(B, sample_encoder.features)`` (before the projection)
        in inference mode for probes, float32."""
        return up_to_float32(apply_encoder(self.sample_encoder, sample, False, None))


def _projected(proj: nnx.Linear | None, features: jax.Array) -> jax.Array:
    """``proj(features)``, or ``features`` for a projection ``"none"``."""
    return features if proj is None else proj(features)
