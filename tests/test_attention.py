"""The towers' attention kernels (``model.attention``): the same numbers as the slow formula.

``einsum_attention`` is ``softmax(q k^T / sqrt(d)) v`` with the softmax in float64 for float64
inputs (a NumPy softmax to 1e-14); the ``"xla"`` kernel (``jax.nn.dot_product_attention``)
equals it in float32 to float32 rounding, with a padding mask, a causal mask and both; a
float64 model never takes jax.nn's float32 softmax. ``"auto"`` picks cuDNN only on a GPU with
half precision, a head width that is a multiple of 8 (<= 128) and even token counts under a
mask; ``"cudnn"`` where it cannot run is a ConfigError saying what to set. Whole towers with
the ``"xla"`` kernel in float32 equal the same towers in float64.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models import build_encoder, build_model
from contrastive_jax.training.models.encoders import attention as attn


def numpy_attention(q, k, v, mask):
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    logits = np.where(mask, logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", weights, v)


def inputs(t=5):
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(3, t, 2, 4)) for _ in range(3))
    padding = np.ones((3, 1, 1, t), bool)
    padding[1, ..., 3:] = False  # the second example's last keys are padding
    causal = (np.arange(t)[None, :] <= np.arange(t)[:, None])[None, None]
    return q, k, v, padding, causal


@pytest.mark.parametrize("masks", ["padding", "causal", "both"])
def test_einsum_attention_in_float64_is_the_formula(masks):
    q, k, v, padding, causal = inputs()
    mask = {"padding": padding, "causal": causal, "both": padding & causal}[masks]
    with jax.enable_x64(True):
        got = attn.einsum_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                                    None if masks == "causal" else jnp.asarray(padding),
                                    causal=masks != "padding")
        assert got.dtype == jnp.float64
    np.testing.assert_allclose(got, numpy_attention(q, k, v, mask), rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("masks", ["none", "padding", "causal", "both"])
def test_the_xla_kernel_equals_the_formula_in_float32_and_float64_keeps_float64(masks):
    q, k, v, padding, _ = inputs()
    mask = None if masks in ("none", "causal") else jnp.asarray(padding)
    causal = masks in ("causal", "both")
    fn = attn.attention_function("xla", causal=causal)
    f32 = [jnp.asarray(a, jnp.float32) for a in (q, k, v)]
    assert attn.implementation("xla", f32[0], f32[1], mask) == "xla"
    got = fn(*f32, mask=mask)
    want = attn.einsum_attention(*f32, mask, causal)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
    with jax.enable_x64(True):
        f64 = [jnp.asarray(a) for a in (q, k, v)]
        assert attn.implementation("xla", f64[0], f64[1], mask) == "einsum"
        got = fn(*f64, mask=mask)
        assert got.dtype == jnp.float64
        np.testing.assert_allclose(got, attn.einsum_attention(*f64, mask, causal), rtol=1e-15,
                                   atol=1e-16)


def test_auto_picks_cudnn_only_where_its_rules_allow():
    bf16 = jnp.zeros((2, 8, 2, 16), jnp.bfloat16)
    odd = jnp.zeros((2, 7, 2, 16), jnp.bfloat16)
    mask = jnp.ones((2, 1, 1, 8), bool)
    assert attn.cudnn_applies(bf16, bf16, None, backend="gpu")
    assert attn.cudnn_applies(bf16, bf16, mask, backend="gpu")
    assert attn.cudnn_applies(odd, odd, None, backend="gpu")  # no mask: any token count
    assert not attn.cudnn_applies(odd, odd, jnp.ones((2, 1, 1, 7), bool), backend="gpu")
    assert not attn.cudnn_applies(bf16, bf16, None, backend="cpu")
    assert not attn.cudnn_applies(bf16.astype(jnp.float32), bf16, None, backend="gpu")
    assert not attn.cudnn_applies(jnp.zeros((2, 8, 2, 12), jnp.bfloat16),
                                  jnp.zeros((2, 8, 2, 12), jnp.bfloat16), None, backend="gpu")
    assert attn.implementation("auto", bf16, bf16, None) == "xla"  # this machine: no GPU


def test_a_kernel_that_cannot_run_is_refused_with_what_to_set():
    with pytest.raises(ConfigError, match=r"unknown model\.attention 'flash'"):
        attn.check_attention("flash")
    with pytest.raises(ConfigError, match=r"needs an NVIDIA GPU.*set model\.attention = 'auto'"):
        attn.check_attention("cudnn", dtype=jnp.bfloat16, backend="cpu")
    with pytest.raises(ConfigError, match=r"model\.dtype = 'bfloat16'"):
        attn.check_attention("cudnn", dtype=None, backend="gpu")
    assert attn.check_attention("cudnn", dtype=jnp.bfloat16, backend="gpu") == "cudnn"
    config = {"name": "dual_encoder", "embed_dim": 8, "attention": "cudnn",
              "sample_encoder": {"name": "mlp", "in_features": 4, "features": 8},
              "text_encoder": {"name": "text_transformer", "vocab_size": 10, "max_tokens": 4,
                               "width": 8, "depth": 1, "heads": 2, "features": 8}}
    with pytest.raises(ConfigError, match="needs an NVIDIA GPU"):
        build_model(config, nnx.Rngs(0))


TEXT = {"name": "text_transformer", "vocab_size": 24, "max_tokens": 6, "width": 16,
        "depth": 2, "heads": 2, "mlp_ratio": 2, "features": 8}
VIT = {"name": "vit", "image_size": 8, "patch": 4, "in_channels": 1, "width": 16, "depth": 2,
       "heads": 2, "mlp_ratio": 2, "features": None, "pool": "map", "activation": "gelu"}


@pytest.mark.parametrize("tower", ["causal_mean_text", "argmax_text", "vit_map"])
def test_towers_with_the_xla_kernel_equal_their_float64_selves(tower):
    """A float32 tower (jax.nn's kernel) against the same parameters in float64 (the einsum
    formula): the padding and causal masks and the attention-pool head reach the kernel."""
    config = {"causal_mean_text": dict(TEXT, causal=True),
              "argmax_text": dict(TEXT, causal=True, pool="argmax"),
              "vit_map": VIT}[tower]
    rng = np.random.default_rng(1)
    if config["name"] == "vit":
        x = rng.normal(size=(4, 8, 8, 1))
    else:
        x = rng.integers(1, 24, (4, 6)).astype(np.int32)
        x[:2, 4:] = 0  # padded captions
    model = build_encoder(config, nnx.Rngs(0), attention="xla")
    graphdef, state = nnx.split(model)
    narrow = x.astype(np.float32) if x.dtype != np.int32 else x
    got = nnx.merge(graphdef, state)(jnp.asarray(narrow), train=False)
    with jax.enable_x64(True):
        wide = jax.tree.map(lambda a: a.astype(jnp.float64), state)
        want = nnx.merge(graphdef, wide)(jnp.asarray(x), train=False)
        assert want.dtype == jnp.float64
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
