"""The activations of the Transformer towers' MLPs (:mod:`.transformer`, :mod:`.map_head`), by
the name a config gives.

``gelu_tanh`` is this project's towers' default (Flax's ``nnx.gelu``); ``gelu`` and
``quick_gelu`` are the two that open_clip's checkpoints use ([OpenCLIP] in docs/references.md).
"""

from __future__ import annotations

import jax
from flax import nnx

from contrastive_jax.errors import ConfigError

ACTIVATIONS = {
    # Flax's default nnx.gelu: the tanh approximation (this project's towers before CLIP import)
    "gelu_tanh": lambda x: nnx.gelu(x, approximate=True),
    # the exact erf form, torch.nn.GELU's default (open_clip's models without quick_gelu)
    "gelu": lambda x: nnx.gelu(x, approximate=False),
    # x * sigmoid(1.702 x): OpenAI's CLIP checkpoints (open_clip's QuickGELU)
    "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
}


def check_activation(name: str) -> str:
    """``name`` if it is one of :data:`ACTIVATIONS`, else a :class:`ConfigError` listing them."""
    if name not in ACTIVATIONS:
        raise ConfigError(f"unknown activation {name!r}; valid: {sorted(ACTIVATIONS)}")
    return name
