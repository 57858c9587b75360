"""The compute dtype of a model (``config.model.dtype``): mixed precision with float32 parameters.

``"float32"`` (the default) leaves every layer's dtype unset, so a layer computes in the dtype
of its parameters and inputs: float32 as built, float64 when a test casts the parameters to
float64 (the exactness tests), bit-identical to a model built without the setting.
``"bfloat16"`` makes every matmul, convolution and activation of the encoders and the
projection heads bfloat16, while

* parameters (and so the optimiser state) stay float32 (``param_dtype``): each layer casts its
  float32 parameters to bfloat16 when it applies them, and the gradient flowing back through
  that cast is float32;
* LayerNorm and BatchNorm take their mean and variance in float32 (Flax promotes the
  statistics to at least float32) and BatchNorm's running statistics are float32;
* attention's softmax is float32
  (:mod:`~contrastive_jax.training.models.encoders.attention`);
* the embeddings that leave the model for the loss are float32 (:func:`up_to_float32`), so the
  loss's log-sum-exp, softmax and logit scale keep float32 statistics.

This is the usual TPU recipe (big_vision, MaxText: bfloat16 compute, float32 master weights);
bfloat16 keeps float32's exponent range, so no loss scaling is needed
([MixedPrecision] in docs/references.md; its loss scaling is for float16 only).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from contrastive_jax.errors import ConfigError

COMPUTE_DTYPES = {"float32": None, "bfloat16": jnp.bfloat16}


def layers_dtype(name: str) -> jnp.dtype | None:
    """The layers' ``dtype`` for ``config.model.dtype = name``: ``None`` (the parameters' own,
    float32) for ``"float32"``, ``jnp.bfloat16`` for ``"bfloat16"``; anything else is a
    :class:`ConfigError` naming the valid names."""
    if not isinstance(name, str) or name not in COMPUTE_DTYPES:
        raise ConfigError(f"unknown model.dtype {name!r}; valid: {list(COMPUTE_DTYPES)} "
                          "(parameters stay float32 either way)")
    return COMPUTE_DTYPES[name]


def cast(x: jax.Array, dtype: jnp.dtype | None) -> jax.Array:
    """``x`` in the compute ``dtype``; unchanged when ``dtype`` is ``None`` (the default)."""
    return x if dtype is None else x.astype(dtype)


def up_to_float32(x: jax.Array) -> jax.Array:
    """``x`` in ``promote_types(x.dtype, float32)``: half precision up to float32 for the loss,
    float32 and float64 unchanged."""
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))
