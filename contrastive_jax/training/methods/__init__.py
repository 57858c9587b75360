"""Contrastive methods, one module each; :func:`method_for` picks the one a config runs.

``config.method`` names it (``"simclr"``, ``"moco"``, ``"moco_v3"``, ``"clip"``, ``"siglip"``,
``"mi_critic"``); left empty, it follows ``config.loss.name`` (``nt_xent`` -> SimCLR, ``moco``,
``moco_v3``, ``clip``, ``siglip``). Each method owns its loss call, its settings (MoCo's
``config.moco`` block, MoCo v3's ``config.moco_v3``), its extra state and its hooks
(:class:`~contrastive_jax.training.methods.base.Method`).
"""

from __future__ import annotations

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.methods.base import (
    LossSettings,
    Method,
    MethodContext,
    temperature_of,
)
from contrastive_jax.training.methods.clip_siglip import CLIP, SigLIP
from contrastive_jax.training.methods.mi_critic import MICritic
from contrastive_jax.training.methods.moco_v3 import MoCoV3, MoCoV3Settings
from contrastive_jax.training.methods.momentum_contrast import MoCo, MoCoSettings
from contrastive_jax.training.methods.simclr import SimCLR

METHODS = {"simclr": SimCLR, "moco": MoCo, "moco_v3": MoCoV3, "clip": CLIP, "siglip": SigLIP,
           "mi_critic": MICritic}
BY_LOSS = {"nt_xent": "simclr", "moco": "moco", "moco_v3": "moco_v3", "clip": "clip",
           "siglip": "siglip"}


def method_for(config) -> Method:
    """The method a config runs, built from its settings (checked): the ``loss`` block, parsed
    here once (``method.loss_settings``), and the method's own block
    (:meth:`~contrastive_jax.training.methods.base.Method.from_config`)."""
    loss = LossSettings.from_config(config.loss)
    name = config.get("method") or BY_LOSS[loss.name]
    if name not in METHODS:
        raise ConfigError(f"unknown method {name!r}; valid: {sorted(METHODS)}")
    method = METHODS[name].from_config(config, loss)
    if loss.name not in method.losses:
        raise ConfigError(f"method {name!r} runs with loss.name in {list(method.losses)}; got "
                          f"loss.name={loss.name!r} (change config.method or config.loss.name)")
    method.check(config)
    return method


__all__ = ["BY_LOSS", "CLIP", "METHODS", "LossSettings", "MICritic", "Method", "MethodContext",
           "MoCo", "MoCoSettings", "MoCoV3", "MoCoV3Settings", "SigLIP", "SimCLR", "method_for",
           "temperature_of"]
