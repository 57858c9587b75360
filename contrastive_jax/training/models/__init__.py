"""Flax NNX models: encoders, projection heads, SimCLR / MoCo, the CLIP dual encoder.

:func:`build_model` makes the model a config's ``model`` block describes::

    model.name = "simclr" | "moco"       encoder + projection head (MoCo: + key copy, queue)
                 "dual_encoder"          sample tower + text tower + logit scale (CLIP, SigLIP)
    model.encoder / sample_encoder / text_encoder = {"name": one of ENCODERS, **its kwargs}
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from flax import nnx

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models.dual_encoder import DualEncoder
from contrastive_jax.training.models.heads import ProjectionHead
from contrastive_jax.training.models.mlp import MLPEncoder
from contrastive_jax.training.models.resnet import ResNet
from contrastive_jax.training.models.signal_cnn import SignalCNN
from contrastive_jax.training.models.simclr import SimCLR
from contrastive_jax.training.models.transformer import TextTransformer, ViT

ENCODERS = {"signal_cnn": SignalCNN, "resnet": ResNet, "vit": ViT,
            "text_transformer": TextTransformer, "mlp": MLPEncoder}
MODELS = ("simclr", "moco", "dual_encoder")
MODEL_KEYS = {
    "simclr": {"name", "encoder", "head", "learn_temperature", "init_temperature"},
    "moco": {"name", "encoder", "head", "learn_temperature", "init_temperature", "momentum",
             "queue_size"},
    "dual_encoder": {"name", "sample_encoder", "text_encoder", "embed_dim", "init_temperature",
                     "siglip", "init_bias"},
}


def build_encoder(config: Mapping[str, Any], rngs: nnx.Rngs) -> nnx.Module:
    """``ENCODERS[config["name"]](**rest)``; unknown names or arguments say what is valid."""
    config = dict(config)
    name = config.pop("name", None)
    if name not in ENCODERS:
        raise ConfigError(f"unknown encoder {name!r}; valid: {sorted(ENCODERS)}")
    return _construct(ENCODERS[name], config, rngs, f"encoder {name!r}")


def build_model(config: Mapping[str, Any], rngs: nnx.Rngs) -> nnx.Module:
    """The model of a config's ``model`` block (see the module docstring)."""
    config = dict(config)
    name = config.get("name")
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; valid: {list(MODELS)}")
    unknown = sorted(set(config) - MODEL_KEYS[name])
    if unknown:
        raise ConfigError(f"model {name!r}: unknown settings {unknown}; valid: "
                         f"{sorted(MODEL_KEYS[name])}")
    if name != "dual_encoder":
        encoder = build_encoder(config["encoder"], rngs)
        head = dict(config.get("head", {}))
        head = ProjectionHead(encoder.features, head.pop("hidden", 256), head.pop("out", 128),
                              rngs=rngs, **head)
        options = {k: config[k] for k in ("learn_temperature", "init_temperature")
                   if k in config}
        return SimCLR(encoder, head, **options)
    sample = build_encoder(config["sample_encoder"], rngs)
    text = build_encoder(config["text_encoder"], rngs)
    options = {k: config[k] for k in ("embed_dim", "init_temperature", "siglip", "init_bias")
               if k in config}
    return DualEncoder(sample, text, rngs=rngs, **options)


def _construct(cls, kwargs: dict, rngs: nnx.Rngs, what: str):
    params = inspect.signature(cls.__init__).parameters
    valid = sorted(p for p in params if p not in ("self", "rngs"))
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise ConfigError(f"{what}: unknown arguments {unknown}; valid: {valid}")
    return cls(**kwargs, rngs=rngs)


__all__ = ["ENCODERS", "DualEncoder", "MLPEncoder", "ProjectionHead", "ResNet", "SignalCNN",
           "SimCLR", "TextTransformer", "ViT", "build_encoder", "build_model"]
