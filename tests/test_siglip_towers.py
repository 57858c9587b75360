"""SigLIP's towers as open_clip builds them, and the other new tower / projection options
(contrastive_jax.training.models.encoders.transformer, models.dual_encoder).

In float64 the ViT with ``pool="map"`` equals a NumPy transcription of timm's
``VisionTransformer(class_token=False, global_pool='map')`` forward pass (its
``AttentionPoolLatent`` head), and the text tower with ``pool="last" | "first" | "eos"`` a
transcription of open_clip's ``TextTransformer`` (``no_causal_mask``, ``proj_bias``, or the
causal mask and a bias-free ``text_projection`` as in MetaCLIP 2's ``pool_type='eos'``), both
written in torch's tensor layout from randomly drawn weights that a small mapping here puts
into our parameters, to < 1e-10 relative. Also: ``norm_after_pool`` is timm's ``fc_norm``
(LayerNorm of the mean), the projections ``"none"`` / ``"linear_bias"``, the default configs'
parameter tree, bfloat16 and the gradient through the map head, and the errors.
"""

from math import erf

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models import build_encoder, build_model
from contrastive_jax.training.models.precision import layers_dtype
from contrastive_jax.training.models.scanned_layers import to_layout
from contrastive_jax.training.parameter_paths import leaves_by_path, nested

WIDTH, HEADS, HIDDEN, DEPTH = 16, 2, 40, 2  # HIDDEN: timm's int(16 * 2.5), not 4 * WIDTH
IMAGE, PATCH, CHANNELS = 8, 4, 3
VOCAB, TOKENS = 30, 7
EPS = 1e-6  # timm's and open_clip-SigLIP's LayerNorm epsilon


def rel_error(ours, reference) -> float:
    """``max |ours - reference| / max |reference|``."""
    ours, reference = np.asarray(ours, np.float64), np.asarray(reference, np.float64)
    return float(np.max(np.abs(ours - reference)) / np.max(np.abs(reference)))


def vit_block(**kw) -> dict:
    """open_clip's SigLIP image tower (a timm ViT), small."""
    return {"name": "vit", "image_size": IMAGE, "patch": PATCH, "in_channels": CHANNELS,
            "width": WIDTH, "depth": DEPTH, "heads": HEADS, "mlp_width": HIDDEN,
            "features": None, "class_token": False, "pool": "map", "activation": "gelu",
            "layer_norm_eps": EPS, **kw}


def text_block(**kw) -> dict:
    """open_clip's SigLIP text tower, small."""
    return {"name": "text_transformer", "vocab_size": VOCAB, "max_tokens": TOKENS,
            "width": WIDTH, "depth": DEPTH, "heads": HEADS, "mlp_width": HIDDEN,
            "features": None, "causal": False, "pool": "last", "activation": "gelu",
            "layer_norm_eps": EPS, **kw}


def siglip_block(text: dict | None = None, **kw) -> dict:
    return {"name": "dual_encoder", "embed_dim": WIDTH, "siglip": True,
            "sample_projection": "none", "text_projection": "linear_bias",
            "sample_encoder": vit_block(), "text_encoder": text or text_block(), **kw}


# ---------------------------------------------------------------- random torch-layout weights

def _draw(rng, shapes: dict) -> dict:
    """Random weights: LayerNorm weights near 1, everything else ``N(0, 0.3^2)``."""
    out = {}
    for name, shape in shapes.items():
        value = 0.3 * rng.standard_normal(shape)
        out[name] = 1.0 + value / 3 if "norm" in name and name.endswith(".weight") else value
    return out


def timm_weights(rng) -> dict:
    """A timm ``VisionTransformer(class_token=False, global_pool='map')`` state dict (what
    open_clip holds under ``visual.trunk.``), float64."""
    d, n = WIDTH, (IMAGE // PATCH) ** 2
    shapes = {"patch_embed.proj.weight": (d, CHANNELS, PATCH, PATCH),
              "patch_embed.proj.bias": (d,), "pos_embed": (1, n, d),
              "norm.weight": (d,), "norm.bias": (d,),
              "attn_pool.latent": (1, 1, d), "attn_pool.q.weight": (d, d),
              "attn_pool.q.bias": (d,), "attn_pool.kv.weight": (2 * d, d),
              "attn_pool.kv.bias": (2 * d,), "attn_pool.proj.weight": (d, d),
              "attn_pool.proj.bias": (d,), "attn_pool.norm.weight": (d,),
              "attn_pool.norm.bias": (d,), "attn_pool.mlp.fc1.weight": (HIDDEN, d),
              "attn_pool.mlp.fc1.bias": (HIDDEN,), "attn_pool.mlp.fc2.weight": (d, HIDDEN),
              "attn_pool.mlp.fc2.bias": (d,)}
    for i in range(DEPTH):
        b = f"blocks.{i}."
        shapes.update({b + "norm1.weight": (d,), b + "norm1.bias": (d,),
                       b + "attn.qkv.weight": (3 * d, d), b + "attn.qkv.bias": (3 * d,),
                       b + "attn.proj.weight": (d, d), b + "attn.proj.bias": (d,),
                       b + "norm2.weight": (d,), b + "norm2.bias": (d,),
                       b + "mlp.fc1.weight": (HIDDEN, d), b + "mlp.fc1.bias": (HIDDEN,),
                       b + "mlp.fc2.weight": (d, HIDDEN), b + "mlp.fc2.bias": (d,)})
    return _draw(rng, shapes)


def open_clip_text_weights(rng, *, proj_bias: bool) -> dict:
    """An open_clip ``TextTransformer`` state dict: ``text_projection`` an ``nn.Linear``
    ``(out, in)`` with bias (``proj_bias=True``, SigLIP) or a Parameter ``(in, out)``."""
    d = WIDTH
    shapes = {"token_embedding.weight": (VOCAB, d), "positional_embedding": (TOKENS, d),
              "ln_final.weight": (d,), "ln_final.bias": (d,)}
    if proj_bias:
        shapes.update({"text_projection.weight": (d, d), "text_projection.bias": (d,)})
    else:
        shapes["text_projection"] = (d, d)
    for i in range(DEPTH):
        b = f"transformer.resblocks.{i}."
        shapes.update({b + "ln_1.weight": (d,), b + "ln_1.bias": (d,),
                       b + "attn.in_proj_weight": (3 * d, d), b + "attn.in_proj_bias": (3 * d,),
                       b + "attn.out_proj.weight": (d, d), b + "attn.out_proj.bias": (d,),
                       b + "ln_2.weight": (d,), b + "ln_2.bias": (d,),
                       b + "mlp.c_fc.weight": (HIDDEN, d), b + "mlp.c_fc.bias": (HIDDEN,),
                       b + "mlp.c_proj.weight": (d, HIDDEN), b + "mlp.c_proj.bias": (d,)})
    return _draw(rng, shapes)


# ---------------------------------------------------------------- torch layout -> our params

def _dense(t, name):
    """torch ``nn.Linear`` ``weight (out, in)``, ``bias`` -> nnx ``kernel (in, out)``, ``bias``."""
    return {"kernel": t[name + ".weight"].T, "bias": t[name + ".bias"]}


def _norm(t, name):
    return {"scale": t[name + ".weight"], "bias": t[name + ".bias"]}


def _heads_in(weight, bias):
    """A ``(width, width)`` torch projection, output index ``head * head_dim + d`` ->
    nnx ``kernel (width, heads, head_dim)``, ``bias (heads, head_dim)``."""
    return {"kernel": weight.T.reshape(WIDTH, HEADS, -1), "bias": bias.reshape(HEADS, -1)}


def _attention(q, k, v, out_weight, out_bias):
    """q/k/v as ``(weight, bias)`` pairs and the output projection -> nnx MultiHeadAttention."""
    return {"query": _heads_in(*q), "key": _heads_in(*k), "value": _heads_in(*v),
            "out": {"kernel": out_weight.T.reshape(HEADS, -1, WIDTH), "bias": out_bias}}


def _fused(weight, bias, parts):
    """Split a fused ``(parts * width, width)`` projection (rows ``[i width, (i+1) width)``)."""
    return [(weight[i * WIDTH:(i + 1) * WIDTH], bias[i * WIDTH:(i + 1) * WIDTH])
            for i in range(parts)]


def vit_params(t: dict) -> dict:
    """timm's SigLIP trunk state dict -> our ViT's parameters (pure dict)."""
    blocks = {}
    for i in range(DEPTH):
        b = f"blocks.{i}."
        blocks[i] = {"norm1": _norm(t, b + "norm1"), "norm2": _norm(t, b + "norm2"),
                     "attention": _attention(*_fused(t[b + "attn.qkv.weight"],
                                                     t[b + "attn.qkv.bias"], 3),
                                             t[b + "attn.proj.weight"], t[b + "attn.proj.bias"]),
                     "fc1": _dense(t, b + "mlp.fc1"), "fc2": _dense(t, b + "mlp.fc2")}
    k, v = _fused(t["attn_pool.kv.weight"], t["attn_pool.kv.bias"], 2)
    head = {"latent": t["attn_pool.latent"],
            "attention": _attention((t["attn_pool.q.weight"], t["attn_pool.q.bias"]), k, v,
                                    t["attn_pool.proj.weight"], t["attn_pool.proj.bias"]),
            "norm": _norm(t, "attn_pool.norm"), "fc1": _dense(t, "attn_pool.mlp.fc1"),
            "fc2": _dense(t, "attn_pool.mlp.fc2")}
    return {"embed": {"kernel": t["patch_embed.proj.weight"].transpose(2, 3, 1, 0),
                      "bias": t["patch_embed.proj.bias"]},
            "positions": t["pos_embed"], "blocks": blocks, "norm": _norm(t, "norm"),
            "map_head": head}


def text_params(t: dict) -> dict:
    """open_clip's text state dict -> our TextTransformer's parameters (pure dict)."""
    blocks = {}
    for i in range(DEPTH):
        b = f"transformer.resblocks.{i}."
        blocks[i] = {"norm1": _norm(t, b + "ln_1"), "norm2": _norm(t, b + "ln_2"),
                     "attention": _attention(*_fused(t[b + "attn.in_proj_weight"],
                                                     t[b + "attn.in_proj_bias"], 3),
                                             t[b + "attn.out_proj.weight"],
                                             t[b + "attn.out_proj.bias"]),
                     "fc1": _dense(t, b + "mlp.c_fc"), "fc2": _dense(t, b + "mlp.c_proj")}
    return {"tokens": {"embedding": t["token_embedding.weight"]},
            "positions": t["positional_embedding"][None], "blocks": blocks,
            "norm": _norm(t, "ln_final")}


def text_proj_params(t: dict) -> dict:
    """open_clip's ``text_projection``: ``nn.Linear`` -> kernel ``weight.T`` and bias;
    Parameter ``(in, out)`` -> kernel as is."""
    if "text_projection.weight" in t:
        return _dense(t, "text_projection")
    return {"kernel": t["text_projection"]}


def set_params(model: nnx.Module, params: dict) -> nnx.Module:
    """``model`` holding ``params`` (one entry per block, as written here), moved into the
    model's layout of the blocks (scanned by default)."""
    state = nnx.state(model, nnx.Param)
    want = leaves_by_path(nnx.to_pure_dict(state))
    nnx.replace_by_pure_dict(state, nested(to_layout(leaves_by_path(params), want)))
    nnx.update(model, state)
    return model


def model_with(config: dict, params: dict, **settings) -> nnx.Module:
    """The model of ``config`` holding ``params`` (built with shapes only, then set)."""
    build = build_model if config["name"] == "dual_encoder" else build_encoder
    return set_params(nnx.eval_shape(lambda: build({**config, **settings}, nnx.Rngs(0))),
                      params)


@nnx.jit
def embeddings(model, images, texts):
    return model.embed_samples(images), model.embed_texts(texts)


@nnx.jit
def encoded(model, x):
    return model(x, train=False)


# ---------------------------------------------------------------- NumPy transcriptions (torch)

def _ln(x, t, name):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + EPS) * t[name + ".weight"] + t[name + ".bias"]


def _linear(x, t, name):
    return x @ t[name + ".weight"].T + t[name + ".bias"]


def _gelu(x):  # torch nn.GELU(): the exact erf form
    return 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2)))


def _sdpa(q, k, v, additive=0.0):
    """``q (B, heads, L, hd)``, ``k, v (B, heads, S, hd)`` -> ``(B, L, heads * hd)``."""
    s = (q * q.shape[-1] ** -0.5) @ k.transpose(0, 1, 3, 2) + additive
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = p @ v
    return o.transpose(0, 2, 1, 3).reshape(o.shape[0], o.shape[2], -1)


def timm_vit(t: dict, images: np.ndarray, *, global_pool: str = "map",
             fc_norm: bool | None = None) -> np.ndarray:
    """timm's ``VisionTransformer(class_token=False, global_pool=..., num_classes=0)``
    ``forward`` for ``images (B, C, H, W)``: ``forward_features`` (patch_embed, _pos_embed,
    blocks, norm) then ``forward_head`` (pool: ``attn_pool`` or the mean; fc_norm)."""
    use_fc_norm = global_pool == "avg" if fc_norm is None else fc_norm
    b, c, h, _ = images.shape
    g = h // PATCH
    x = np.einsum("bcipjq,dcpq->bdij", images.reshape(b, c, g, PATCH, g, PATCH),
                  t["patch_embed.proj.weight"])
    x = x + t["patch_embed.proj.bias"][:, None, None]
    x = x.reshape(b, WIDTH, g * g).transpose(0, 2, 1)  # flatten(2).transpose(1, 2)
    x = x + t["pos_embed"]
    n = x.shape[1]
    for i in range(DEPTH):
        p = f"blocks.{i}."
        qkv = _linear(_ln(x, t, p + "norm1"), t, p + "attn.qkv")
        q, k, v = qkv.reshape(b, n, 3, HEADS, -1).transpose(2, 0, 3, 1, 4)
        x = x + _linear(_sdpa(q, k, v), t, p + "attn.proj")
        x = x + _linear(_gelu(_linear(_ln(x, t, p + "norm2"), t, p + "mlp.fc1")), t,
                        p + "mlp.fc2")
    if not use_fc_norm:
        x = _ln(x, t, "norm")
    if global_pool == "map":  # AttentionPoolLatent.forward, latent_len 1, pool 'token'
        latent = np.broadcast_to(t["attn_pool.latent"], (b, 1, WIDTH))
        q = _linear(latent, t, "attn_pool.q").reshape(b, 1, HEADS, -1).transpose(0, 2, 1, 3)
        kv = _linear(x, t, "attn_pool.kv").reshape(b, n, 2, HEADS, -1).transpose(2, 0, 3, 1, 4)
        y = _linear(_sdpa(q, kv[0], kv[1]), t, "attn_pool.proj")
        y = y + _linear(_gelu(_linear(_ln(y, t, "attn_pool.norm"), t, "attn_pool.mlp.fc1")),
                        t, "attn_pool.mlp.fc2")
        x = y[:, 0]
    else:  # global_pool_nlc 'avg'
        x = x.mean(1)
    if use_fc_norm:  # fc_norm holds the same LayerNorm ("norm" here)
        x = _ln(x, t, "norm")
    return x


def open_clip_text(t: dict, text: np.ndarray, *, pool: str, causal: bool,
                   eos_id: int | None = None) -> np.ndarray:
    """open_clip's ``TextTransformer.forward`` (no class embedding, no pad mask):
    ``_embeds``, the resblocks (``nn.MultiheadAttention`` with ``in_proj``; ``attn_mask`` the
    causal ``-inf`` upper triangle, or ``None`` with ``no_causal_mask``), ``ln_final``,
    ``text_global_pool``, ``text_projection``."""
    b, n = text.shape
    x = t["token_embedding.weight"][text] + t["positional_embedding"][:n]
    additive = np.triu(np.full((n, n), -np.inf), 1) if causal else 0.0
    for i in range(DEPTH):
        p = f"transformer.resblocks.{i}."
        qkv = _ln(x, t, p + "ln_1") @ t[p + "attn.in_proj_weight"].T + t[p + "attn.in_proj_bias"]
        q, k, v = (a.reshape(b, n, HEADS, -1).transpose(0, 2, 1, 3)
                   for a in np.split(qkv, 3, axis=-1))
        x = x + _linear(_sdpa(q, k, v, additive), t, p + "attn.out_proj")
        x = x + _linear(_gelu(_linear(_ln(x, t, p + "ln_2"), t, p + "mlp.c_fc")), t,
                        p + "mlp.c_proj")
    x = _ln(x, t, "ln_final")
    if pool == "first":
        pooled = x[:, 0]
    elif pool == "last":
        pooled = x[:, -1]
    elif pool == "argmax":
        pooled = x[np.arange(b), text.argmax(-1)]
    else:  # 'eos'
        pooled = x[np.arange(b), (text == eos_id).astype(np.int32).argmax(-1)]
    if "text_projection.weight" in t:
        return _linear(pooled, t, "text_projection")
    return pooled @ t["text_projection"]


def inputs(rng):
    images = rng.standard_normal((3, CHANNELS, IMAGE, IMAGE))  # torch layout (B, C, H, W)
    texts = rng.integers(1, VOCAB, (4, TOKENS))
    texts[0, 4:] = 0  # id 0 is a real token to these pools: never masked
    texts[1, 2] = texts[1, 5] = 2  # eos_id 2: the first one counts
    texts[2, -1] = 2
    texts[3] = np.where(texts[3] == 2, 3, texts[3])  # no eos: position 0
    return images, texts


# ---------------------------------------------------------------- tests

def test_siglip_towers_float64_equal_timm_and_open_clip():
    rng = np.random.default_rng(0)
    images, texts = inputs(rng)
    tv, tt = timm_weights(rng), open_clip_text_weights(rng, proj_bias=True)
    with jax.enable_x64(True):
        params = {"sample_encoder": vit_params(tv), "text_encoder": text_params(tt),
                  "text_proj": text_proj_params(tt), "log_scale": np.float64(np.log(10.0)),
                  "bias": np.float64(-10.0)}
        model = model_with(siglip_block(), params)
        x, y = embeddings(model, jnp.asarray(images.transpose(0, 2, 3, 1)), jnp.asarray(texts))
        assert x.dtype == y.dtype == jnp.float64
        want_x = timm_vit(tv, images)
        want_y = open_clip_text(tt, texts, pool="last", causal=False)
    assert rel_error(x, want_x) < 1e-10
    assert rel_error(y, want_y) < 1e-10
    # the reference tells the pools apart: the mean pool is far off
    assert rel_error(x, timm_vit(tv, images, global_pool="avg", fc_norm=False)) > 1e-2


@pytest.mark.parametrize("pool,causal,eos_id,proj_bias", [
    ("first", False, None, True),
    ("eos", True, 2, False),  # MetaCLIP 2 ("worldwide"): causal mask, eos pool, no bias
    ("eos", False, 2, True),
])
def test_text_pools_float64_equal_open_clip(pool, causal, eos_id, proj_bias):
    rng = np.random.default_rng(1)
    _, texts = inputs(rng)
    tt = open_clip_text_weights(rng, proj_bias=proj_bias)
    text = text_block(pool=pool, causal=causal, eos_id=eos_id)
    config = {"name": "dual_encoder", "embed_dim": WIDTH, "sample_encoder": vit_block(),
              "text_encoder": text, "sample_projection": "none",
              "text_projection": "linear_bias" if proj_bias else "linear"}
    with jax.enable_x64(True):
        shapes = nnx.eval_shape(lambda: build_model(config, nnx.Rngs(0)))
        params = jax.tree.map(lambda a: np.zeros(a.shape, np.float64),
                              nnx.to_pure_dict(nnx.state(shapes, nnx.Param)))
        params.update(text_encoder=text_params(tt), text_proj=text_proj_params(tt))
        model = model_with(config, params)
        y = nnx.jit(lambda m, t: m.embed_texts(t))(model, jnp.asarray(texts))
        assert y.dtype == jnp.float64
    want = open_clip_text(tt, texts, pool=pool, causal=causal, eos_id=eos_id)
    assert rel_error(y, want) < 1e-10
    other = "last" if pool != "last" else "first"
    assert rel_error(y, open_clip_text(tt, texts, pool=other, causal=causal)) > 1e-2


def test_norm_after_pool_is_the_layer_norm_of_the_mean():
    rng = np.random.default_rng(2)
    images, _ = inputs(rng)
    tv = timm_weights(rng)
    params = vit_params(tv)
    del params["map_head"]
    with jax.enable_x64(True):
        x = jnp.asarray(images.transpose(0, 2, 3, 1))
        after = encoded(model_with(vit_block(pool="mean", norm_after_pool=True), params), x)
        before = encoded(model_with(vit_block(pool="mean"), params), x)
    # timm global_pool='avg': fc_norm (norm after the mean) by default, fc_norm=False before
    assert rel_error(after, timm_vit(tv, images, global_pool="avg")) < 1e-10
    assert rel_error(before, timm_vit(tv, images, global_pool="avg", fc_norm=False)) < 1e-10
    assert rel_error(after, before) > 1e-2


def test_projections_none_and_linear_bias():
    config = siglip_block(text_encoder=text_block(features=12))
    model = build_model(config, nnx.Rngs(0))
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    assert "sample_proj" not in params  # "none": no parameter at all
    assert {k: v.shape for k, v in params["text_proj"].items()} == {"kernel": (12, WIDTH),
                                                                      "bias": (WIDTH,)}
    model.text_proj.bias[...] = jnp.arange(WIDTH, dtype=jnp.float32) / 4
    images = jax.random.normal(jax.random.key(0), (2, IMAGE, IMAGE, CHANNELS))
    texts = jax.random.randint(jax.random.key(1), (2, TOKENS), 0, VOCAB)
    x, y = embeddings(model, images, texts)
    # "none": the embedding is the tower's output itself (in one program: the same numbers)
    x_again, image_tower = nnx.jit(lambda m, a: (m.embed_samples(a), m.sample_encoder(
        a, train=False)))(model, images)
    np.testing.assert_array_equal(x_again, image_tower)
    assert rel_error(x, image_tower) < 1e-6
    # "linear_bias": tower @ kernel + bias
    tower = encoded(model.text_encoder, texts)
    want = tower @ model.text_proj.kernel[...] + model.text_proj.bias[...]
    assert rel_error(y, want) < 1e-6
    assert rel_error(y - tower @ model.text_proj.kernel[...], model.text_proj.bias[...]) < 1e-5


def _tree(config) -> dict:
    """``{path: shape}`` of the parameters of the model of ``config`` (shapes only)."""
    model = nnx.eval_shape(lambda: build_model(config, nnx.Rngs(0)))
    leaves = jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    return {jax.tree_util.keystr(path): leaf.shape for path, leaf in leaves}


@pytest.mark.parametrize("vision,text", [
    ({"name": "vit", "image_size": 8, "patch": 4, "width": 16, "depth": 1, "heads": 2,
      "features": 24},
     {"name": "text_transformer", "vocab_size": 40, "max_tokens": 12, "width": 16, "depth": 1,
      "heads": 2, "features": 20}),
    ({"name": "vit", "image_size": 8, "patch": 4, "width": 16, "depth": 1, "heads": 2,
      "features": None, "class_token": True, "pre_norm": True, "pool": "token"},
     {"name": "text_transformer", "vocab_size": 40, "max_tokens": 12, "width": 16, "depth": 1,
      "heads": 2, "features": None, "causal": True, "pool": "argmax"}),
])
def test_default_configs_keep_their_parameter_tree(vision, text):
    config = {"name": "dual_encoder", "embed_dim": 8, "sample_encoder": vision,
              "text_encoder": text}
    explicit = {**config, "sample_projection": "linear", "text_projection": "linear",
                "sample_encoder": {"norm_after_pool": False, "pool": "mean", **vision},
                "text_encoder": {"eos_id": None, **text}}
    tree = _tree(config)
    assert tree == _tree(explicit)
    # what existing checkpoints hold: bias-free projections, no attention-pool head
    assert tree["['sample_proj']['kernel']"] == (vision["features"] or 16, 8)
    assert tree["['text_proj']['kernel']"] == (text["features"] or 16, 8)
    assert not [p for p in tree if "map_head" in p or p.endswith("_proj']['bias']")]


def vit_with(params: dict, *, dtype=None, remat_policy: str | None = None) -> nnx.Module:
    """The SigLIP ViT holding ``params``, with the model-wide settings ``build_model`` would
    pass (compute dtype, remat policy)."""
    return set_params(nnx.eval_shape(lambda: build_encoder(
        vit_block(), nnx.Rngs(0), dtype=dtype, remat_policy=remat_policy)), params)


def test_map_head_in_bfloat16_and_under_remat():
    rng = np.random.default_rng(3)
    images, _ = inputs(rng)
    params = jax.tree.map(lambda a: np.asarray(a, np.float32), vit_params(timm_weights(rng)))
    x = jnp.asarray(images.transpose(0, 2, 3, 1), jnp.float32)
    full = encoded(vit_with(params), x)
    half = encoded(vit_with(params, dtype=layers_dtype("bfloat16"),
                            remat_policy="nothing_saveable"), x)
    assert half.dtype == jnp.bfloat16 and full.dtype == jnp.float32
    assert rel_error(half, full) < 3e-2


def test_gradient_through_the_map_head_float64():
    rng = np.random.default_rng(4)
    images, _ = inputs(rng)
    tv = timm_weights(rng)
    with jax.enable_x64(True):
        x = jnp.asarray(images.transpose(0, 2, 3, 1))
        w = jnp.asarray(rng.standard_normal((len(images), WIDTH)))

        def functions(policy):
            graphdef, params = nnx.split(vit_with(vit_params(tv), remat_policy=policy))

            def loss(p):
                return jnp.sum(nnx.merge(graphdef, p)(x, train=False) * w)

            return params, jax.jit(jax.grad(loss)), jax.jit(loss)

        params, grad, loss = functions(None)
        _, grad_remat, _ = functions("nothing_saveable")
        g, g_remat = grad(params), grad_remat(params)
        head = lambda s: s["map_head"]  # noqa: E731
        assert float(jnp.abs(head(g)["latent"][...]).max()) > 0
        # relative to the whole gradient: a key bias's is 0 exactly (softmax ignores a shift
        # of all logits), i.e. roundoff only
        flat = lambda tree: np.concatenate([np.ravel(a) for a in jax.tree.leaves(tree)])  # noqa: E731
        assert rel_error(flat(g_remat), flat(g)) < 1e-10
        # a directional derivative along a random direction of the head's parameters:
        # fourth-order central difference (its error falls as h^4: 7e-9 at h = 1e-3, 2e-12 at
        # h = 1e-4, where roundoff, ~1e-16 / h, is still below it)
        keys = iter(jax.random.split(jax.random.key(5), 64))
        direction = jax.tree.map(lambda a: jax.random.normal(next(keys), a.shape, a.dtype),
                                 head(params))
        exact = sum(jnp.vdot(a, b) for a, b in zip(jax.tree.leaves(head(g)),
                                                   jax.tree.leaves(direction), strict=True))

        def moved(h):
            out = jax.tree.map(lambda a: a, params)
            out["map_head"] = jax.tree.map(lambda a, d: a + h * d, head(params), direction)
            return loss(out)

        step = 1e-4
        numeric = (8 * (moved(step) - moved(-step)) - (moved(2 * step) - moved(-2 * step))) / (
            12 * step)
    assert abs(float(numeric) - float(exact)) / abs(float(exact)) < 1e-10


@pytest.mark.parametrize("build,config,match", [
    (build_encoder, vit_block(pool="avg"), r"ViT pool must be one of \['mean', 'token', "
                                           r"'map'\]; got 'avg'"),
    (build_encoder, vit_block(norm_after_pool=True),
     r"norm_after_pool=True .* pool='mean' only; got pool='map'"),
    (build_encoder, text_block(pool="cls"),
     r"pool must be one of \['mean', 'argmax', 'last', 'first', 'eos'\]; got 'cls'"),
    (build_encoder, text_block(pool="eos"), r"pool='eos' .* set eos_id"),
    (build_encoder, text_block(pool="eos", eos_id=VOCAB), r"eos_id must be a token id in "
                                                          r"\[0, 30\) .* got 30"),
    (build_encoder, text_block(eos_id=2), r"eos_id=2 is used by pool='eos' only; got "
                                          r"pool='last'"),
    (build_model, siglip_block(text_projection="affine"),
     r"model.text_projection must be one of \['linear', 'linear_bias', 'none'\]; got 'affine'"),
    (build_model, siglip_block(embed_dim=24),
     r"model.sample_projection='none' .* got features 16 and embed_dim 24"),
])
def test_config_errors_name_the_option_and_what_is_valid(build, config, match):
    with pytest.raises(ConfigError, match=match):
        nnx.eval_shape(lambda: build(config, nnx.Rngs(0)))
