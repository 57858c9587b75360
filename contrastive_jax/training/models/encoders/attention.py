"""Scaled dot-product attention for the Transformer towers (``config.model.attention``).

``softmax(q k^T / sqrt(d) + masked) v`` per head ([Transformer]), with ``query (B, T, heads,
d)``, ``key`` and ``value (B, S, heads, d)`` and an optional boolean ``mask`` broadcastable to
``(B, heads, T, S)`` (True: attend); ``causal`` adds ``key <= query``. Which kernel computes
it (``model.attention``):

* ``"xla"``: ``jax.nn.dot_product_attention(implementation="xla")``: XLA's fused einsums,
  logits in ``promote_types(dtype, float32)``, softmax in float32;
* ``"cudnn"``: ``jax.nn.dot_product_attention(implementation="cudnn")``: cuDNN's fused
  (flash) attention on an NVIDIA GPU, which never materialises the ``(B, heads, T, S)``
  scores; it needs a GPU, half-precision compute (``model.dtype = "bfloat16"``) and a head
  width that is a multiple of 8 (at most 128, or 256 from Hopper on), and with a mask an even
  number of tokens in training; a config that asks for it elsewhere is a
  :class:`ConfigError`, and a shape cuDNN refuses fails at compilation with cuDNN's reason;
* ``"auto"`` (default): cuDNN where those rules allow (a GPU, half precision, the head width,
  and even token counts when a mask is applied), else XLA. The choice is made per attention
  call when the step is traced (:func:`implementation`).

Float64 (the exactness tests cast the model to float64) always takes :func:`einsum_attention`,
the same formula with the softmax in float64: ``jax.nn.dot_product_attention`` takes the
softmax in float32 whatever the inputs, which would round a float64 model to float32. In
float32 the ``"xla"`` kernel equals :func:`einsum_attention` to float32 rounding
(tests/test_attention.py).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from contrastive_jax.errors import ConfigError

IMPLEMENTATIONS = ("xla", "cudnn", "auto")
HALF = (jnp.bfloat16, jnp.float16)


def check_attention(name: Any, *, dtype=None, backend: str | None = None) -> str:
    """``name`` if it is one of :data:`IMPLEMENTATIONS` and can run here, else a
    :class:`ConfigError` saying what to set: ``"cudnn"`` needs a GPU backend (``backend``,
    default JAX's) and half-precision compute (``dtype``, the layers' compute dtype)."""
    if not isinstance(name, str) or name not in IMPLEMENTATIONS:
        raise ConfigError(f"unknown model.attention {name!r}; valid: {list(IMPLEMENTATIONS)} "
                          "('auto': cuDNN on a GPU where it applies, else XLA)")
    if name == "cudnn":
        backend = jax.default_backend() if backend is None else backend
        if backend != "gpu":
            raise ConfigError(f"model.attention = 'cudnn' needs an NVIDIA GPU; JAX's backend "
                              f"here is {backend!r}: set model.attention = 'auto' or 'xla'")
        if dtype not in HALF:
            raise ConfigError("model.attention = 'cudnn' needs half-precision compute: set "
                              "model.dtype = 'bfloat16' (or model.attention = 'auto')")
    return name


def einsum_attention(query: jax.Array, key: jax.Array, value: jax.Array,
                     mask: jax.Array | None = None, causal: bool = False) -> jax.Array:
    """``softmax(q k^T / sqrt(d)) v`` with the logits and the softmax in
    ``promote_types(dtype, float32)`` (float64 stays float64), the slow obvious form."""
    dtype = jnp.promote_types(query.dtype, jnp.float32)
    logits = jnp.einsum("...qhd,...khd->...hqk", query, key).astype(dtype)
    logits = logits / jnp.sqrt(jnp.asarray(query.shape[-1], dtype))
    mask = _with_causal(mask, causal, query.shape[-3], key.shape[-3])
    if mask is not None:
        logits = jnp.where(mask, logits, jnp.finfo(dtype).min)
    weights = jax.nn.softmax(logits, axis=-1).astype(value.dtype)
    return jnp.einsum("...hqk,...khd->...qhd", weights, value)


def _with_causal(mask: jax.Array | None, causal: bool, t: int, s: int) -> jax.Array | None:
    if not causal:
        return mask
    order = (jnp.arange(s)[None, :] <= jnp.arange(t)[:, None])[None, None]  # key <= query
    return order if mask is None else mask & order


def cudnn_applies(query: jax.Array, key: jax.Array, mask: jax.Array | None,
                  backend: str | None = None) -> bool:
    """Whether ``"auto"`` picks cuDNN for these inputs: a GPU backend, half precision, a head
    width that is a multiple of 8 and at most 128 (every GPU generation cuDNN's fused kernel
    supports), and with a mask an even number of query and key tokens (cuDNN's rule for a
    bias in training)."""
    backend = jax.default_backend() if backend is None else backend
    d, t, s = query.shape[-1], query.shape[-3], key.shape[-3]
    return (backend == "gpu" and query.dtype in HALF and d % 8 == 0 and d <= 128
            and (mask is None or (t % 2 == 0 and s % 2 == 0)))


def implementation(name: str, query: jax.Array, key: jax.Array,
                   mask: jax.Array | None) -> str:
    """The kernel ``model.attention = name`` runs for these inputs: ``"einsum"`` for float64,
    else ``"xla"`` or ``"cudnn"`` (``"auto"``: :func:`cudnn_applies`)."""
    if query.dtype == jnp.float64:
        return "einsum"
    if name == "auto":
        return "cudnn" if cudnn_applies(query, key, mask) else "xla"
    return name


def attention_function(name: str, *, causal: bool = False):
    """The ``attention_fn`` for ``nnx.MultiHeadAttention``: attention as ``model.attention =
    name`` says (:func:`implementation`), with a causal mask when ``causal``."""
    def attend(query, key, value, bias=None, mask=None, **_):
        del bias  # no additive bias in these towers (MultiHeadAttention passes None)
        kernel = implementation(name, query, key, mask)
        if kernel == "einsum":
            return einsum_attention(query, key, value, mask, causal)
        if mask is not None:
            mask = jnp.broadcast_to(mask, (query.shape[0], mask.shape[1], query.shape[1],
                                           key.shape[1]))
        return jax.nn.dot_product_attention(query, key, value, mask=mask, is_causal=causal,
                                            implementation=kernel)

    return attend
