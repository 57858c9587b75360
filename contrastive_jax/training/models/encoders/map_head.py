"""SigLIP's image head: multihead attention pooling with one learned latent query ("MAP")."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models.encoders.activations import ACTIVATIONS, check_activation
from contrastive_jax.training.models.encoders.attention import attention_function, check_attention


class MapHead(nnx.Module):
    """Multihead attention pooling with one learned latent query ("MAP"), SigLIP's image head
    ([SigLIP]; timm's ``AttentionPoolLatent`` with ``latent_len=1``, q projection, q/k/v biases,
    no qk-norm and no position embedding, as open_clip's SigLIP towers use it, [OpenCLIP]).

    Input ``h (B, N, width)`` (the tower's normalised tokens), output ``(B, width)``::

        a = MHA(query = latent, key = value = h)     (B, 1, width), one query per example
        x = out(a)                                   the attention's output projection
        x = x + fc2(act(fc1(norm(x))))               no residual around the attention
        z = x[:, 0]

    ``MHA``: ``heads`` heads of ``width / heads``, ``softmax(q k^T / sqrt(width / heads)) v``
    by the kernel ``attention`` names (:mod:`.attention`; a float64 model stays float64).
    Parameters: ``latent (1, 1, width)``;
    ``attention/{query,key,value}/kernel (width, heads, width / heads)`` and ``bias (heads,
    width / heads)`` (timm's ``q.weight`` and the two halves of ``kv.weight``, rows ``[0, width)``
    the key and ``[width, 2 width)`` the value, each output index ``head * (width / heads) + d``);
    ``attention/out/kernel (heads, width / heads, width)``, ``bias (width,)`` (timm's ``proj``);
    ``norm`` (LayerNorm, epsilon ``layer_norm_eps``); ``fc1 (width, hidden)``, ``fc2 (hidden,
    width)`` with biases (timm's ``mlp``). ``activation``: a key of :data:`ACTIVATIONS`;
    ``dtype``: the compute dtype (:mod:`~contrastive_jax.training.models.precision`), as
    :class:`~.transformer.Block`. No dropout (timm's ``proj_drop`` is 0 in its ViTs).
    ``attention``: as :class:`~.transformer.Block`.
    """

    def __init__(self, width: int, heads: int, hidden: int, *, activation: str = "gelu",
                 layer_norm_eps: float = 1e-6, dtype=None, attention: str = "auto",
                 rngs: nnx.Rngs):
        if width % heads:
            raise ConfigError(f"width {width} must be a multiple of heads {heads}")
        # timm: trunc_normal_tf_(latent, std=width ** -0.5), truncated at 2 standard deviations
        self.latent = nnx.Param(width ** -0.5 * jax.random.truncated_normal(
            rngs.params(), -2.0, 2.0, (1, 1, width)))
        self.attention = nnx.MultiHeadAttention(
            heads, width, decode=False, rngs=rngs, keep_rngs=False, dtype=dtype,
            attention_fn=attention_function(check_attention(attention, dtype=dtype)))
        self.norm = nnx.LayerNorm(width, epsilon=layer_norm_eps, dtype=dtype, rngs=rngs)
        self.fc1 = nnx.Linear(width, hidden, dtype=dtype, rngs=rngs)
        self.fc2 = nnx.Linear(hidden, width, dtype=dtype, rngs=rngs)
        self.activation = check_activation(activation)

    def __call__(self, h: jax.Array) -> jax.Array:
        """``h (B, N, width)`` to ``(B, width)``."""
        query = jnp.broadcast_to(self.latent[...].astype(h.dtype), (h.shape[0], 1, h.shape[-1]))
        x = self.attention(query, h, h, deterministic=True)
        x = x + self.fc2(ACTIVATIONS[self.activation](self.fc1(self.norm(x))))
        return x[:, 0]
