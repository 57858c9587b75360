"""Importing big_vision SigLIP .npz checkpoints
(contrastive_jax.training.models.converters.big_vision_import).

tests/fixtures/make_big_vision_fixture.py wrote a small randomly initialised open_clip SigLIP
in big_vision's .npz layout (checked there through open_clip's own reader,
load_big_vision_weights) and open_clip's float64 outputs for fixed inputs. Here: with
activation="gelu" the import computes what open_clip computes; with the default "gelu_tanh"
(big_vision's own nn.gelu) it differs from open_clip by a measured amount and equals a float64
NumPy transcription of big_vision's forward pass; the scanned and prefix-free layouts give the
same parameters; every way the file can fail to match names the .npz key; the command line
writes a directory that load_converted reads back. No PyTorch is needed.
"""

import json
import math
import pathlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models import build_model
from contrastive_jax.training.models.converters import (
    big_vision_import,
    big_vision_npz,
    pretrained_source,
)


def model_and_params(path, **kwargs):
    """``(model block, params)`` of :func:`big_vision_import.convert_npz`'s source record."""
    source = big_vision_import.convert_npz(path, **kwargs)
    assert source.kind == "big_vision" and source.has_weights
    return source.model, source.params


FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
CHECKPOINT = FIXTURES / "big_vision_tiny_siglip.npz"
OUTPUTS = FIXTURES / "big_vision_tiny_siglip_outputs.npz"
HEADS = {"vision_heads": 2, "text_heads": 2}  # the fixture's (its widths are no variant's)


def rel_error(ours, reference) -> float:
    """``max |ours - reference| / max |reference|``."""
    ours, reference = np.asarray(ours, np.float64), np.asarray(reference, np.float64)
    return float(np.max(np.abs(ours - reference)) / np.max(np.abs(reference)))


def model_with(config, params, **settings):
    """The model of ``config`` holding ``params`` (built with shapes only, then every
    parameter set)."""
    model = nnx.eval_shape(lambda: build_model({**config, **settings}, nnx.Rngs(0)))
    state = nnx.state(model, nnx.Param)
    nnx.replace_by_pure_dict(state, params)
    nnx.update(model, state)
    return model


def normalise(a):
    return a / jnp.linalg.norm(a, axis=-1, keepdims=True)


@nnx.jit
def jitted_outputs(model, images, texts):
    """Image and text embeddings and SigLIP's logits ``exp(t) cos + b``, one jitted program."""
    x, y = model.embed_samples(images), model.embed_texts(texts)
    return x, y, jnp.exp(model.log_scale[...]) * normalise(x) @ normalise(y).T + model.bias[...]


def reference():
    return dict(np.load(OUTPUTS))


def as_float64(params):
    return jax.tree.map(lambda a: np.asarray(a, np.float64), params)


def test_exact_gelu_computes_what_open_clip_computes():
    """activation="gelu" is open_clip's reading of the file: float32 within 1e-5 of open_clip's
    float64 outputs (measured ~1.3e-7), float64 within 1e-12 (measured ~5e-16)."""
    ref = reference()
    config, params = model_and_params(CHECKPOINT, activation="gelu", **HEADS)
    assert config["sample_encoder"]["activation"] == config["text_encoder"]["activation"] == "gelu"
    x, y, logits = jitted_outputs(model_with(config, params),
                                  jnp.asarray(ref["images"], jnp.float32), ref["texts"])
    assert x.dtype == y.dtype == jnp.float32
    errors = [rel_error(x, ref["image_features"]), rel_error(y, ref["text_features"]),
              rel_error(logits, ref["logits_per_image"])]
    assert max(errors) < 1e-5, errors
    with jax.enable_x64(True):
        x, y, logits = jitted_outputs(model_with(config, as_float64(params)),
                                      jnp.asarray(ref["images"]), jnp.asarray(ref["texts"]))
        assert x.dtype == jnp.float64
        errors = [rel_error(x, ref["image_features"]), rel_error(y, ref["text_features"]),
                  rel_error(logits, ref["logits_per_image"])]
    assert max(errors) < 1e-12, errors


def test_default_tanh_gelu_differs_from_open_clip_by_a_measured_amount():
    """The default is big_vision's own nn.gelu (tanh approximation): on the fixture it moves
    the image features by 3.1e-5, the text features by 9.3e-5 and the logits by 6.7e-5
    relative to open_clip's exact-GELU reading (measured): a real choice, and a small one."""
    ref = reference()
    config, params = model_and_params(CHECKPOINT, **HEADS)
    assert config["sample_encoder"]["activation"] == config["text_encoder"]["activation"] \
        == "gelu_tanh"
    with jax.enable_x64(True):  # the difference itself, without float32 rounding
        x, y, logits = jitted_outputs(model_with(config, as_float64(params)),
                                      jnp.asarray(ref["images"]), jnp.asarray(ref["texts"]))
        errors = [rel_error(x, ref["image_features"]), rel_error(y, ref["text_features"]),
                  rel_error(logits, ref["logits_per_image"])]
    assert all(1e-6 < e < 1e-3 for e in errors), errors
    assert errors == pytest.approx([3.07e-5, 9.28e-5, 6.70e-5], rel=0.01)


def big_vision_forward(w: dict, images: np.ndarray, texts: np.ndarray, heads: int = 2
                       ) -> tuple[np.ndarray, np.ndarray]:
    """big_vision's SigLIP forward pass in NumPy, float64, from the .npz arrays by their names
    (models/vit.py: conv stem, learned posemb, Encoder1DBlock = x + MHA(LN x), x + MLP(LN x)
    with nn.gelu (tanh), encoder_norm, MAPHead; text_transformer.py: Embed, pos_embedding,
    the same Encoder, the last position; heads as nn.Dense with bias). Flax's LayerNorm eps
    1e-6; Flax's attention scales the query by 1 / sqrt(head_dim)."""
    def dense(x, name):
        return x @ w[name + "/kernel"] + w[name + "/bias"]

    def layer_norm(x, name):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + 1e-6) * w[name + "/scale"] + w[name + "/bias"]

    def gelu(x):  # flax.linen.gelu(approximate=True)
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))

    def mlp(x, name):
        return dense(gelu(dense(x, name + "/Dense_0")), name + "/Dense_1")

    def attention(inputs_q, inputs_kv, name):
        q, k, v = (np.einsum("bld,dhk->blhk", x, w[f"{name}/{n}/kernel"]) + w[f"{name}/{n}/bias"]
                   for n, x in (("query", inputs_q), ("key", inputs_kv), ("value", inputs_kv)))
        s = np.einsum("bqhk,bshk->bhqs", q / np.sqrt(q.shape[-1]), k)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        o = np.einsum("bhqs,bshk->bqhk", p, v)
        return np.einsum("bqhk,hkd->bqd", o, w[name + "/out/kernel"]) + w[name + "/out/bias"]

    def encoder(x, base):
        i = 0
        while f"{base}/encoderblock_{i}/LayerNorm_0/scale" in w:
            s = f"{base}/encoderblock_{i}/"
            y = layer_norm(x, s + "LayerNorm_0")
            x = x + attention(y, y, s + "MultiHeadDotProductAttention_0")
            x = x + mlp(layer_norm(x, s + "LayerNorm_1"), s + "MlpBlock_0")
            i += 1
        return layer_norm(x, base + "/encoder_norm")

    p = "params/img"
    kernel = w[p + "/embedding/kernel"]  # (patch, patch, C, width)
    patch, _, channels, width = kernel.shape
    b, size = images.shape[:2]
    g = size // patch
    patches = images.reshape(b, g, patch, g, patch, channels).transpose(0, 1, 3, 2, 4, 5)
    x = patches.reshape(b, g * g, -1) @ kernel.reshape(-1, width) + w[p + "/embedding/bias"]
    x = encoder(x + w[p + "/pos_embedding"], p + "/Transformer")
    m = p + "/MAPHead_0"
    probe = np.broadcast_to(w[m + "/probe"], (b, 1, width))
    x = attention(probe, x, m + "/MultiHeadDotProductAttention_0")
    image = (x + mlp(layer_norm(x, m + "/LayerNorm_0"), m + "/MlpBlock_0"))[:, 0]
    if p + "/head/kernel" in w:
        image = dense(image, p + "/head")
    p = "params/txt"
    y = w[p + "/Embed_0/embedding"][texts] + w[p + "/pos_embedding"]
    text = dense(encoder(y, p + "/Encoder_0")[:, -1], p + "/head")
    return image, text


def with_image_head(arrays: dict) -> dict:
    """The fixture plus an image head ``img/head`` (out_dim given as an int in big_vision's
    two_towers: a Dense on the MAP head's output; the released SigLIP files have none)."""
    rng = np.random.default_rng(0)
    width = arrays["params/img/embedding/kernel"].shape[-1]
    return {**arrays, "params/img/head/kernel": rng.normal(0, 0.3, (width, 16)),
            "params/img/head/bias": rng.normal(0, 0.1, (16,))}


@pytest.mark.parametrize("image_head", [False, True])
def test_float64_equals_numpy_transcription_of_big_vision(tmp_path, image_head):
    """The default import (tanh GELU) equals big_vision's forward pass written out in NumPy
    from the arrays by name, in float64 (features < 1e-10 relative); with an image head the
    sample projection is "linear_bias"."""
    arrays = {k: v.astype(np.float64) for k, v in np.load(CHECKPOINT).items()}
    path = CHECKPOINT
    if image_head:
        arrays = with_image_head(arrays)
        path = tmp_path / "with_head.npz"
        np.savez(path, **{k: v.astype(np.float32) for k, v in arrays.items()})
        arrays = {k: v.astype(np.float32).astype(np.float64) for k, v in arrays.items()}
    ref = reference()
    config, params = model_and_params(path, **HEADS)
    assert config["sample_projection"] == ("linear_bias" if image_head else "none")
    with jax.enable_x64(True):
        x, y, logits = jitted_outputs(model_with(config, as_float64(params)),
                                      jnp.asarray(ref["images"]), jnp.asarray(ref["texts"]))
    want_x, want_y = big_vision_forward(arrays, ref["images"], ref["texts"])
    assert rel_error(x, want_x) < 1e-10
    assert rel_error(y, want_y) < 1e-10
    n = lambda a: a / np.linalg.norm(a, axis=-1, keepdims=True)  # noqa: E731
    want = np.exp(arrays["params/t"][0]) * n(want_x) @ n(want_y).T + arrays["params/b"][0]
    assert rel_error(logits, want) < 1e-10


def test_converted_config_is_siglip():
    config, params = model_and_params(CHECKPOINT, **HEADS)
    vision, text = config["sample_encoder"], config["text_encoder"]
    assert {k: vision[k] for k in ("image_size", "patch", "in_channels", "width", "depth",
                                   "heads", "mlp_width")} == {
        "image_size": 16, "patch": 4, "in_channels": 3, "width": 16, "depth": 2, "heads": 2,
        "mlp_width": 48}
    assert (vision["pool"], vision["class_token"], vision["pre_norm"], vision["patch_bias"],
            vision["features"]) == ("map", False, False, True, None)
    assert {k: text[k] for k in ("vocab_size", "max_tokens", "width", "depth", "heads",
                                 "mlp_width")} == {
        "vocab_size": 32, "max_tokens": 8, "width": 12, "depth": 2, "heads": 2, "mlp_width": 24}
    assert (text["pool"], text["causal"], text["features"]) == ("last", False, None)
    assert vision["layer_norm_eps"] == text["layer_norm_eps"] == 1e-6
    assert (config["embed_dim"], config["sample_projection"], config["text_projection"],
            config["siglip"]) == (16, "none", "linear_bias", True)
    assert float(params["log_scale"]) == pytest.approx(2.3)
    assert float(params["bias"]) == pytest.approx(-1.7)
    assert config["init_temperature"] == pytest.approx(math.exp(-2.3))
    assert config["init_bias"] == pytest.approx(-1.7)
    assert params["sample_encoder"]["map_head"]["latent"].shape == (1, 1, 16)
    assert params["text_proj"]["kernel"].shape == (12, 16)


def scanned(arrays: dict) -> dict:
    """big_vision's scan=True layout: ``encoderblock_{i}/X`` stacked as ``encoderblock/X``."""
    out, stacks = {}, {}
    for name, value in arrays.items():
        head, sep, rest = name.partition("encoderblock_")
        if not sep:
            out[name] = value
            continue
        index, _, leaf = rest.partition("/")
        stacks.setdefault(f"{head}encoderblock/{leaf}", {})[int(index)] = value
    return {**out, **{n: np.stack([s[i] for i in range(len(s))]) for n, s in stacks.items()}}


@pytest.mark.parametrize("layout", ["scanned", "no_prefix", "scanned_no_prefix", "bfloat16"])
def test_other_layouts_give_the_same_parameters(tmp_path, layout):
    """A scanned checkpoint (one ``encoderblock`` per tower with a leading depth axis), names
    without the ``params/`` prefix, and bfloat16 arrays (stored by NumPy as 2-byte void; equal
    to the float32 parameters rounded to bfloat16)."""
    import ml_dtypes

    arrays = dict(np.load(CHECKPOINT))
    if "scanned" in layout:
        arrays = scanned(arrays)
        assert "params/img/Transformer/encoderblock/LayerNorm_0/scale" in arrays
    if "no_prefix" in layout:
        arrays = {k.removeprefix("params/"): v for k, v in arrays.items()}
    if layout == "bfloat16":
        arrays = {k: v.astype(ml_dtypes.bfloat16) for k, v in arrays.items()}
    path = tmp_path / f"{layout}.npz"
    np.savez(path, **arrays)
    config, params = model_and_params(CHECKPOINT, **HEADS)
    got_config, got = model_and_params(path, **HEADS)
    assert got_config == config or layout == "bfloat16"
    want = params
    if layout == "bfloat16":
        want = jax.tree.map(lambda a: np.asarray(a.astype(ml_dtypes.bfloat16), np.float32),
                            params)
    flat_got = jax.tree_util.tree_leaves_with_path(got)
    assert len(flat_got) == len(jax.tree.leaves(want))
    for (path_, a), b in zip(flat_got, jax.tree.leaves(want), strict=True):
        assert a.dtype == np.float32
        np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path_))


def edited(tmp_path, edit) -> pathlib.Path:
    arrays = dict(np.load(CHECKPOINT))
    edit(arrays)
    path = tmp_path / "edited.npz"
    np.savez(path, **arrays)
    return path


BLOCK = "params/txt/Encoder_0/encoderblock_1/"


@pytest.mark.parametrize("edit,named", [
    (lambda a: a.pop(BLOCK + "MlpBlock_0/Dense_1/bias"),
     f"no array '{BLOCK}MlpBlock_0/Dense_1/bias'"),
    (lambda a: a.__setitem__(BLOCK + "MlpBlock_0/Dense_0/kernel",
                             a[BLOCK + "MlpBlock_0/Dense_0/kernel"][:, :20]),
     rf"'{BLOCK}MlpBlock_0/Dense_0/kernel' has shape \(12, 20\); .* needs \(12, 24\)"),
    (lambda a: a.__setitem__("params/img/Transformer/encoderblock_0/LayerScale_0/gamma",
                             np.ones(16, np.float32)),
     "array 'params/img/Transformer/encoderblock_0/LayerScale_0/gamma' of the checkpoint "
     "has no place"),
    (lambda a: a.__setitem__("opt/step", np.ones((), np.float32)),
     "array 'opt/step' of the checkpoint has no place"),
    (lambda a: a.pop("params/t"), "no array 'params/t'"),
    (lambda a: a.__setitem__("params/img/pos_embedding", a["params/img/pos_embedding"][:, :-1]),
     r"'params/img/pos_embedding' has shape \(1, 15, 16\): not \(1, a square grid"),
    (lambda a: a.__setitem__("params/img/cls", np.zeros((1, 1, 16), np.float32)),
     "'params/img/cls': an image tower with a class token"),
    (lambda a: [a.pop(k) for k in list(a) if "MAPHead_0" in k],
     "no array 'params/img/MAPHead_0/probe': only image towers pooled by a MAP head"),
    (lambda a: a.__setitem__("params/img/MAPHead_0/MultiHeadDotProductAttention_0/key/kernel",
                             np.zeros((16, 4, 4), np.float32)),
     r"'params/img/MAPHead_0/MultiHeadDotProductAttention_0/key/kernel' has shape "
     r"\(16, 4, 4\)"),
])
def test_mismatching_checkpoint_names_the_npz_key(tmp_path, edit, named):
    with pytest.raises(ConfigError, match=named):
        big_vision_import.convert_npz(edited(tmp_path, edit), **HEADS)


def test_a_scanned_stack_of_another_depth_names_the_npz_key(tmp_path):
    arrays = scanned(dict(np.load(CHECKPOINT)))
    name = "params/txt/Encoder_0/encoderblock/LayerNorm_1/bias"
    arrays[name] = arrays[name][:1]
    path = tmp_path / "scanned.npz"
    np.savez(path, **arrays)
    with pytest.raises(ConfigError, match=r"scanned text blocks do not share one leading depth "
                                          r"axis: .* 'params/txt/Encoder_0/encoderblock/"
                                          r"LayerNorm_1/bias' \(1, 12\)"):
        big_vision_import.convert_npz(path, **HEADS)
    arrays = scanned(dict(np.load(CHECKPOINT)))
    arrays["params/img/Transformer/encoderblock_0/LayerNorm_0/scale"] = np.ones(16, np.float32)
    np.savez(path, **arrays)
    with pytest.raises(ConfigError, match="both a scanned stack"):
        big_vision_import.convert_npz(path, **HEADS)
    arrays = scanned(dict(np.load(CHECKPOINT)))  # a missing array: the stack's key
    del arrays["params/img/Transformer/encoderblock/MlpBlock_0/Dense_1/bias"]
    np.savez(path, **arrays)
    with pytest.raises(ConfigError, match="no array 'params/img/Transformer/encoderblock/"
                                          "MlpBlock_0/Dense_1/bias'"):
        big_vision_import.convert_npz(path, **HEADS)


def test_unreadable_files_name_the_file(tmp_path):
    data = CHECKPOINT.read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[:len(data) // 2])
    (tmp_path / "random.npz").write_bytes(np.random.default_rng(0).bytes(3000))
    np.save(tmp_path / "single.npy", np.zeros(3))
    np.savez(tmp_path / "objects.npz", a=np.array([{"x": 1}], dtype=object))
    for name, match in (("cut.npz", "cannot be read|not a readable .npz"),
                        ("random.npz", "not a readable .npz"),
                        ("single.npy", "single .npy array"),
                        ("objects.npz", "cannot be read"),
                        ("missing.npz", "does not exist")):
        with pytest.raises(ConfigError, match=match) as info:
            big_vision_import.convert_npz(tmp_path / name, **HEADS)
        assert name in str(info.value)


def test_heads_from_big_vision_variants_with_a_warning_or_an_error_naming_the_flag():
    arrays = big_vision_npz.load_npz(CHECKPOINT)
    with pytest.raises(ConfigError, match=r"vision width 16 is none of big_vision's variants"
                                          r".*set --vision_heads"):
        big_vision_npz.npz_architecture(arrays, text_heads=2)
    with pytest.raises(ConfigError, match="text heads = 5 must be a positive divisor of the "
                                          "text width 12; set --text_heads"):
        big_vision_npz.npz_architecture(arrays, vision_heads=2, text_heads=5)
    with pytest.raises(ConfigError, match="vision heads = 3 must be a positive divisor"):
        big_vision_import.convert_npz(CHECKPOINT, vision_heads=3, text_heads=2)
    # shapes of a SigLIP B/16 (widths 768): 12 heads, with a warning naming the variant
    zeros = np.zeros
    wide = big_vision_npz.Arrays({
        "img/embedding/kernel": zeros((16, 16, 3, 768), np.float32),
        "img/pos_embedding": zeros((1, 196, 768), np.float32),
        "img/Transformer/encoderblock_0/MlpBlock_0/Dense_0/kernel": zeros((768, 3072),
                                                                          np.float32),
        "img/MAPHead_0/probe": zeros((1, 1, 768), np.float32),
        "txt/Embed_0/embedding": zeros((32, 768), np.float32),
        "txt/pos_embedding": zeros((1, 64, 768), np.float32),
        "txt/Encoder_0/encoderblock_0/MlpBlock_0/Dense_0/kernel": zeros((768, 3072),
                                                                        np.float32),
        "txt/head/kernel": zeros((768, 768), np.float32),
        "t": zeros(1, np.float32), "b": zeros(1, np.float32)}, {})
    with pytest.warns(UserWarning) as record:
        config = big_vision_npz.npz_architecture(wide)
    assert [str(w.message).split(";")[0] for w in record] == [
        f"{tower} heads = 12 assumed from the width 768 (big_vision's variant B)"
        for tower in ("vision", "text")]
    assert config["sample_encoder"]["heads"] == config["text_encoder"]["heads"] == 12
    assert "mlp_width" not in config["sample_encoder"]  # 4 x 768
    assert config["sample_encoder"]["image_size"] == 224
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # told: no warning
        big_vision_npz.npz_architecture(wide, vision_heads=12, text_heads=12)
    wide.arrays["t"] = np.full(1, math.log(117.0), np.float32)  # big_vision has no cap on exp(t)
    with pytest.warns(UserWarning, match=r"exp\(t\) = 117 is above this project's default cap "
                                         r"loss.max_scale = 100 .* float\('inf'\)"):
        big_vision_npz.npz_architecture(wide, vision_heads=12, text_heads=12)
    with pytest.raises(ConfigError, match=r"activation 'quick_gelu' is not supported; valid: "
                                          r"\['gelu_tanh', 'gelu'\]"):
        big_vision_npz.npz_architecture(wide, activation="quick_gelu", vision_heads=12,
                                       text_heads=12)


def test_command_line_writes_a_directory_that_reads_back(tmp_path, capsys):
    out = tmp_path / "out"
    assert big_vision_import.main([f"--checkpoint={CHECKPOINT}", f"--output={out}",
                                   "--vision_heads=2", "--text_heads=2",
                                   "--activation=gelu"]) == 0
    printed = capsys.readouterr().out
    assert "12,594 parameters" in printed and "activation gelu" in printed
    config, params = model_and_params(CHECKPOINT, activation="gelu", **HEADS)
    assert json.loads((out / "model.json").read_text()) == config
    assert json.loads((out / "preprocess.json").read_text()) == {
        "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "resize": "bilinear",
        "resize_mode": "squash", "image_size": 16}
    restored_config, restored = pretrained_source.load_converted(out)
    assert restored_config == config
    leaves = jax.tree_util.tree_leaves_with_path(restored)
    assert len(leaves) == len(jax.tree.leaves(params))
    for (path, a), b in zip(leaves, jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))
    # a user error: one line naming the flag, exit 2, nothing written
    assert big_vision_import.main([f"--checkpoint={CHECKPOINT}", f"--output={tmp_path / 'x'}",
                                   "--vision_heads=3", "--text_heads=2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--vision_heads" in err and err.count("\n") == 1
    assert not (tmp_path / "x").exists()
    assert big_vision_import.main([f"--checkpoint={CHECKPOINT}", f"--output={tmp_path / 'y'}",
                                   "--activation=quick_gelu"]) == 2
    assert "activation" in capsys.readouterr().err


def test_load_pretrained_reads_an_npz_as_the_importer_converts_it(monkeypatch):
    """``load_pretrained(FILE.npz)``: the importer's parameters, big_vision's preprocessing and
    SigLIP's tokenizer kind; a width of no variant (the fixture's) names the command that sets
    the heads."""
    from contrastive_jax.pretrained import load_pretrained, read_source

    with pytest.raises(ConfigError, match=r"vision width 16 is none.*big_vision_import "
                                          r"--checkpoint=.*--vision_heads=N"):
        load_pretrained(CHECKPOINT, tokenizer=False)
    monkeypatch.setitem(big_vision_npz.VARIANTS, "fixture", (16, 1, 64, 2))  # image width
    monkeypatch.setitem(big_vision_npz.VARIANTS, "fixture_text", (12, 1, 48, 2))
    with pytest.warns(UserWarning, match="heads = 2 assumed from the width 16"):
        source = read_source(str(CHECKPOINT))
    config, params = model_and_params(CHECKPOINT, **HEADS)
    assert source.model == config and source.tokenizer == {"kind": "sentencepiece_open_clip"}
    assert jax.tree.all(jax.tree.map(lambda a, b: np.array_equal(a, b), source.params, params))
    assert source.preprocess == big_vision_import.npz_preprocess(config)
    with pytest.warns(UserWarning):
        _, preprocess, tokenizer = load_pretrained(CHECKPOINT, tokenizer=False)
    assert tokenizer is None and preprocess.resize_mode == "squash"
    assert preprocess.mean == preprocess.std == (0.5, 0.5, 0.5)
