"""open_clip's SigLIP (a CustomTextCLIP with a timm VisionTransformer trunk and open_clip's
TextTransformer) as this project's dual encoder, through
contrastive_jax.training.models.converters.open_clip.tensor_layouts.

Parity without PyTorch: tests/fixtures/make_open_clip_siglip_fixture.py wrote a tiny randomly
initialised open_clip SigLIP (hub layout: open_clip_config.json, open_clip_model.safetensors)
and open_clip's outputs for fixed inputs. Here it is converted with a model block written by
hand for its config: float32 features and logits (with the bias) within 1e-5 of open_clip's,
float64 against a NumPy transcription of timm's trunk, its attention-pool head and open_clip's
text tower in torch's tensor layout; every way the tensors can fail to match names the tensor;
and the converted directory starts a LiT run (model.init_from, the image tower frozen,
SigLIP's loss).
"""

import json
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_clip_import import jitted_outputs, model_with, rel_error

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models.converters import converted_directory
from contrastive_jax.training.models.converters.open_clip import tensor_layouts
from contrastive_jax.training.models.converters.state_dict_files import load_state_dict
from contrastive_jax.training.parameter_paths import leaves_by_path

FIXTURE = pathlib.Path(__file__).resolve().parent / "fixtures" / "open_clip_tiny_siglip"
WEIGHTS = FIXTURE / "open_clip_model.safetensors"
LOGIT_SCALE, LOGIT_BIAS = 2.3, -4.7  # the fixture's
_TOWER = {"width": 16, "depth": 2, "heads": 2, "mlp_width": 59, "features": None,
          "activation": "gelu", "layer_norm_eps": 1e-6}
# the fixture's open_clip_config.json, by hand: timm trunk (img 16, patch 4, width 16, depth
# 2, heads 2, mlp_ratio 3.7362 -> int(16 * 3.7362) = 59, no class token, map head, exact GELU,
# eps 1e-6), timm_proj "none"; text: context 10, vocab 64, no causal mask, pool "last", eps
# 1e-6, exact GELU, nn.Linear projection with bias; init_logit_bias set
SIGLIP_BLOCK = {
    "name": "dual_encoder",
    "sample_encoder": {"name": "vit", "image_size": 16, "patch": 4, "in_channels": 3, **_TOWER,
                       "class_token": False, "pre_norm": False, "pool": "map",
                       "patch_bias": True},
    "text_encoder": {"name": "text_transformer", "vocab_size": 64, "max_tokens": 10, **_TOWER,
                     "causal": False, "pool": "last"},
    "embed_dim": 16, "siglip": True, "sample_projection": "none",
    "text_projection": "linear_bias", "init_temperature": math.exp(-LOGIT_SCALE),
    "init_bias": LOGIT_BIAS,
}
SIGLIP_PREPROCESS = {"mean": [0.5] * 3, "std": [0.5] * 3, "resize": "bicubic",
                     "resize_mode": "squash", "image_size": 16}


def reference():
    return np.load(FIXTURE / "outputs.npz")


def siglip_params():
    return tensor_layouts.params_from_state_dict(SIGLIP_BLOCK, load_state_dict(WEIGHTS))


def with_bias(model, outputs):
    x, y, scaled = outputs
    return x, y, scaled + model.bias[...]


def test_the_block_is_the_fixtures_config():
    """The hand-written block says what the fixture's open_clip config says."""
    cfg = json.loads((FIXTURE / "open_clip_config.json").read_text())
    vision, text, trunk = cfg["model_cfg"]["vision_cfg"], cfg["model_cfg"]["text_cfg"], \
        cfg["timm_model_args"]
    vit, txt = SIGLIP_BLOCK["sample_encoder"], SIGLIP_BLOCK["text_encoder"]
    assert (trunk["img_size"], trunk["patch_size"], trunk["embed_dim"], trunk["depth"],
            trunk["num_heads"], trunk["class_token"], trunk["global_pool"]) == (
        vit["image_size"], vit["patch"], vit["width"], vit["depth"], vit["heads"], False, "map")
    assert vision["timm_pool"] == "map" and vision["timm_proj"] == "none"
    assert int(vit["width"] * trunk["mlp_ratio"]) == vit["mlp_width"]
    assert (text["context_length"], text["vocab_size"], text["width"], text["heads"],
            text["layers"], text["pool_type"], text["no_causal_mask"], text["proj_bias"],
            text["norm_kwargs"]["eps"]) == (txt["max_tokens"], txt["vocab_size"], txt["width"],
                                            txt["heads"], txt["depth"], "last", True, True, 1e-6)
    assert int(txt["width"] * text["mlp_ratio"]) == txt["mlp_width"]
    assert cfg["model_cfg"]["embed_dim"] == SIGLIP_BLOCK["embed_dim"]


def test_float32_parity_with_open_clip():
    ref = reference()
    params = siglip_params()
    assert float(params["log_scale"]) == pytest.approx(LOGIT_SCALE)
    assert float(params["bias"]) == pytest.approx(LOGIT_BIAS)
    model = model_with(SIGLIP_BLOCK, params)
    x, y, logits = with_bias(model, jitted_outputs(model, ref["images"], ref["texts"]))
    assert x.dtype == y.dtype == jnp.float32
    errors = [rel_error(x, ref["image_features"]), rel_error(y, ref["text_features"]),
              rel_error(logits, ref["logits"])]
    assert max(errors) < 1e-5, errors
    # the text tower reads id 0 (inside caption 1) and the padding after the end id: no mask
    texts = np.array(ref["texts"])
    texts[0, -2] = 7  # a pad position of caption 0, before the last one it pools at
    changed = model.embed_texts(jnp.asarray(texts))
    assert rel_error(changed[0], y[0]) > 1e-4


def reference_forward(t: dict, images: np.ndarray, texts: np.ndarray, heads: int = 2):
    """SigLIP's forward pass in NumPy, float64, from the state dict in torch's layout: timm's
    VisionTransformer (patch_embed, pos_embed, Blocks with fused qkv, final norm) and its
    AttentionPoolLatent, open_clip's TextTransformer without mask, pooled at the last
    position, with the Linear text projection; exact GELU, LayerNorm eps 1e-6."""
    from math import erf

    def linear(x, name):
        return x @ t[name + ".weight"].T + t[name + ".bias"]

    def layer_norm(x, name):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + 1e-6) * t[name + ".weight"] + t[name + ".bias"]

    def gelu(x):
        return 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2)))

    def attend(q, k, v):  # (B, Tq, W), (B, Tk, W) -> (B, Tq, W)
        b, n, w = q.shape
        split = [a.reshape(b, a.shape[1], heads, w // heads).transpose(0, 2, 1, 3)
                 for a in (q, k, v)]
        s = split[0] @ split[1].transpose(0, 1, 3, 2) / np.sqrt(w // heads)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        return (p @ split[2]).transpose(0, 2, 1, 3).reshape(b, n, w)

    def mlp(x, fc1, fc2):
        return linear(gelu(linear(x, fc1)), fc2)

    w = t["visual.trunk.patch_embed.proj.weight"]  # (width, C, p, p)
    width, _, p, _ = w.shape
    b, size = images.shape[:2]
    g = size // p
    patches = images.reshape(b, g, p, g, p, -1).transpose(0, 1, 3, 5, 2, 4).reshape(b, g * g, -1)
    x = patches @ w.reshape(width, -1).T + t["visual.trunk.patch_embed.proj.bias"]
    x = x + t["visual.trunk.pos_embed"]
    i = 0
    while f"visual.trunk.blocks.{i}.norm1.weight" in t:
        s = f"visual.trunk.blocks.{i}."
        q, k, v = np.split(linear(layer_norm(x, s + "norm1"), s + "attn.qkv"), 3, axis=-1)
        x = x + linear(attend(q, k, v), s + "attn.proj")
        x = x + mlp(layer_norm(x, s + "norm2"), s + "mlp.fc1", s + "mlp.fc2")
        i += 1
    x = layer_norm(x, "visual.trunk.norm")
    s = "visual.trunk.attn_pool."
    q = np.broadcast_to(linear(t[s + "latent"], s + "q"), (b, 1, width))
    k, v = np.split(linear(x, s + "kv"), 2, axis=-1)
    o = linear(attend(q, k, v), s + "proj")
    image = (o + mlp(layer_norm(o, s + "norm"), s + "mlp.fc1", s + "mlp.fc2"))[:, 0]
    y = t["text.token_embedding.weight"][texts] + t["text.positional_embedding"]
    i = 0
    while f"text.transformer.resblocks.{i}.ln_1.weight" in t:
        s = f"text.transformer.resblocks.{i}."
        h = layer_norm(y, s + "ln_1")
        q, k, v = np.split(h @ t[s + "attn.in_proj_weight"].T + t[s + "attn.in_proj_bias"], 3,
                           axis=-1)
        y = y + linear(attend(q, k, v), s + "attn.out_proj")
        y = y + mlp(layer_norm(y, s + "ln_2"), s + "mlp.c_fc", s + "mlp.c_proj")
        i += 1
    text = linear(layer_norm(y, "text.ln_final")[:, -1], "text.text_projection")

    def unit(a):
        return a / np.linalg.norm(a, axis=-1, keepdims=True)

    logits = np.exp(t["logit_scale"]) * unit(image) @ unit(text).T + t["logit_bias"]
    return image, text, logits


def test_float64_equals_a_numpy_transcription():
    """In float64 the converted model (map head, text tower, logits with the bias) equals the
    transcription to < 1e-12; in float32 the transcription is open_clip's output to < 1e-5
    (so the transcription is open_clip's computation)."""
    from safetensors.numpy import load_file

    ref = reference()
    tensors = {k: v.astype(np.float64) for k, v in load_file(WEIGHTS).items()}
    images = ref["images"].astype(np.float64)
    want = reference_forward(tensors, images, ref["texts"])
    for got, key in zip(want, ("image_features", "text_features", "logits"), strict=True):
        assert rel_error(got, ref[key]) < 1e-5, key
    with jax.enable_x64(True):
        params = jax.tree.map(lambda a: np.asarray(a, np.float64), siglip_params())
        model = model_with(SIGLIP_BLOCK, params)
        got = with_bias(model, jitted_outputs(model, jnp.asarray(images),
                                              jnp.asarray(ref["texts"])))
        assert got[0].dtype == jnp.float64
        errors = [rel_error(a, b) for a, b in zip(got, want, strict=True)]
        assert max(errors) < 1e-12, errors


@pytest.mark.parametrize("edit,named", [
    (lambda t: t.__setitem__("visual.trunk.attn_pool.kv.weight",
                             t["visual.trunk.attn_pool.kv.weight"][:16]),
     r"tensor 'visual.trunk.attn_pool.kv.weight' has shape \(16, 16\); .* needs \(32, 16\)"),
    (lambda t: t.pop("visual.trunk.attn_pool.latent"),
     "the checkpoint has no tensor 'visual.trunk.attn_pool.latent'"),
    (lambda t: t.pop("text_projection.bias"),
     "the checkpoint has no tensor 'text.text_projection.bias'"),
    (lambda t: t.__setitem__("visual.trunk.blocks.0.ls1.gamma", np.ones(16, np.float32)),
     "tensor 'visual.trunk.blocks.0.ls1.gamma' of the checkpoint has no place"),
    (lambda t: t.__setitem__("visual.head.proj.weight", np.ones((16, 16), np.float32)),
     "tensor 'visual.head.proj.weight' of the checkpoint has no place"),
    (lambda t: t.__setitem__("positional_embedding", np.ones((12, 16), np.float32)),
     r"tensor 'text.positional_embedding' has shape \(12, 16\)"),
])
def test_mismatching_tensors_are_named(edit, named):
    tensors = load_state_dict(WEIGHTS)  # text tower without its "text." prefix, as read
    edit(tensors)
    with pytest.raises(ConfigError, match=named):
        tensor_layouts.params_from_state_dict(SIGLIP_BLOCK, tensors)


def test_both_directions_give_back_the_state_dict_bit_for_bit():
    from safetensors.numpy import load_file

    original = load_file(WEIGHTS)
    back = tensor_layouts.state_dict_from_params(SIGLIP_BLOCK, siglip_params())
    assert sorted(back) == sorted(original)
    for name, value in original.items():
        assert back[name].dtype == np.float32 and back[name].tobytes() == value.tobytes(), name
    params = siglip_params()
    params["sample_encoder"]["out"] = {"kernel": np.zeros((16, 8), np.float32)}
    with pytest.raises(ConfigError, match="parameter 'sample_encoder/out/kernel' has no "
                                          "open_clip counterpart"):
        tensor_layouts.state_dict_from_params(SIGLIP_BLOCK, params)


def lit_config(converted: pathlib.Path):
    """The pod template's tiny run with the converted SigLIP as the model, started from the
    converted directory with the image tower frozen (LiT), trained with SigLIP's loss."""
    from test_train import load_config

    config = load_config("clip_vit_b16_pod.py:tiny")
    config.model = {**SIGLIP_BLOCK, "init_from": {"path": str(converted)},
                    "frozen": "sample_encoder"}
    config.method = "siglip"
    config.loss = {"name": "siglip"}
    config.augment = None
    config.data.batch_size = 8
    config.data.preprocess.update({"image_size": 16, "max_tokens": 10, "vocab_size": 64,
                                   "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)})
    config.optimizer.update({"learning_rate": 1e-2, "weight_decay": 0.1})
    return config


def test_lit_run_from_the_converted_directory(tmp_path):
    """save_converted, then model.init_from loads every parameter bit for bit; one step with
    model.frozen = "sample_encoder": the image tower (and its map head) stays bit-identical,
    the text tower, its projection, the scale and the bias move, and the step's loss is
    SigLIP's on the loaded model's embeddings."""
    from contrastive_jax.losses.siglip import siglip_loss
    from contrastive_jax.mesh import make_mesh
    from contrastive_jax.training.methods import method_for
    from contrastive_jax.training.parameter_paths import path_name
    from contrastive_jax.training.run import init_from
    from contrastive_jax.training.step import train_step
    from contrastive_jax.training.step.state_sharding import state_shardings
    from contrastive_jax.training.step.train_state import create_state

    params = siglip_params()
    converted = tmp_path / "siglip"
    converted_directory.save_converted(converted, SIGLIP_BLOCK, params,
                                       preprocess=SIGLIP_PREPROCESS)
    config = lit_config(converted)
    method = method_for(config)
    assert method.name == "siglip"
    graphdef, state, tx = create_state(config, 10, method)
    state, messages = init_from.initialized_state(state, graphdef, config, method)
    assert any("converted checkpoint" in m for m in messages)

    def by_path(tree):
        return {path_name(p): np.asarray(a) for p, a in jax.tree_util.tree_leaves_with_path(tree)}

    before = by_path(state.params)
    saved = leaves_by_path(params)
    assert sorted(before) == sorted(saved)
    for path, value in saved.items():
        assert before[path].tobytes() == value.tobytes(), path
    rng = np.random.default_rng(0)
    batch = {"image": rng.integers(0, 256, (8, 16, 16, 3), dtype=np.uint8),
             "caption": rng.integers(0, 64, (8, 10)).astype(np.int32)}
    model = nnx.merge(graphdef, state.params, state.rest)
    pixels = (batch["image"] / np.float32(255) - np.float32(0.5)) / np.float32(0.5)
    want = siglip_loss(model.embed_samples(jnp.asarray(pixels)),
                       model.embed_texts(jnp.asarray(batch["caption"])),
                       model.log_scale[...], model.bias[...])
    mesh = make_mesh({"data": 8})
    state = jax.device_put(state, state_shardings(config.sharding, mesh, state))
    step = train_step.compiled_step(config, mesh, graphdef, state, tx, 10, method)
    new, metrics = step(state, batch)
    assert float(metrics["loss"]) == pytest.approx(float(want), rel=1e-5)
    assert "bias" in metrics and int(new.skipped) == 0
    after = by_path(new.params)
    for path, value in before.items():
        if path.startswith("sample_encoder/"):
            assert after[path].tobytes() == value.tobytes(), path
        else:
            assert not np.array_equal(after[path], value), path
    assert any(p.startswith("sample_encoder/map_head/") for p in before)
