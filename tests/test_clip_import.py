"""Importing OpenAI / open_clip CLIP checkpoints
(contrastive_jax.training.models.converters.clip_import).

Parity with open_clip without PyTorch: tests/fixtures/make_open_clip_fixture.py wrote two small
randomly initialised open_clip CLIPs (QuickGELU and exact GELU) as .safetensors and open_clip's
outputs for fixed inputs as .npz. Here they are converted and run in float32 (features and
logits within 1e-5 of open_clip, relative to the largest entry), in float64 against a NumPy
transcription of CLIP's forward pass in torch's tensor layout, with rematerialisation and
bfloat16, and through the DIR/model.json + DIR/params format; and every way a checkpoint can
fail to match gives a ConfigError naming the tensor. These are bare state dicts: each conversion
states what the shapes did not show (an AssumptionWarning, checked in
test_bare_conversion_states_its_assumptions); conversions with an open_clip config are in
tests/test_open_clip_config.py.
"""

import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models import build_model
from contrastive_jax.training.models.converters import (
    clip_import,
    clip_state_dict,
    converted_directory,
    pretrained_source,
)

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
QUICK = FIXTURES / "open_clip_tiny_quickgelu.safetensors"
EXACT = FIXTURES / "open_clip_tiny_gelu.safetensors"
HEADS = {"vision_heads": 2, "text_heads": 2}  # the fixtures' heads (width 32, not width / 64)
pytestmark = pytest.mark.filterwarnings(
    "ignore::contrastive_jax.training.models.converters.clip_state_dict.AssumptionWarning")


def rel_error(ours, reference) -> float:
    """``max |ours - reference| / max |reference|``."""
    ours, reference = np.asarray(ours, np.float64), np.asarray(reference, np.float64)
    return float(np.max(np.abs(ours - reference)) / np.max(np.abs(reference)))


def model_with(config, params, **settings):
    """The model of ``config`` (with ``settings``) holding ``params``: built with shapes only
    (``nnx.eval_shape``: no random initial values, op by op each parameter shape was a compile
    of its own), then every parameter (the model's only state) set from ``params``."""
    model = nnx.eval_shape(lambda: build_model({**config, **settings}, nnx.Rngs(0)))
    state = nnx.state(model, nnx.Param)
    nnx.replace_by_pure_dict(state, params)
    nnx.update(model, state)
    return model


def outputs(model, images, texts):
    x = model.embed_samples(jnp.asarray(images))
    y = model.embed_texts(jnp.asarray(texts))
    normal = lambda a: a / jnp.linalg.norm(a, axis=-1, keepdims=True)  # noqa: E731
    return x, y, jnp.exp(model.log_scale[...]) * normal(x) @ normal(y).T


@nnx.jit
def jitted_outputs(model, images, texts):
    """:func:`outputs` as one jitted program (op by op, each op of the towers was a compile of
    its own)."""
    return outputs(model, images, texts)


@pytest.mark.parametrize("path,quick_gelu", [(QUICK, None), (EXACT, False)])
def test_forward_parity_with_open_clip(path, quick_gelu):
    config, params = clip_import.convert_checkpoint(path, quick_gelu=quick_gelu, **HEADS)
    reference = np.load(path.with_suffix(".npz"))
    model = model_with(config, params)
    x, y, logits = jitted_outputs(model, reference["images"], reference["texts"])
    assert x.dtype == y.dtype == jnp.float32
    errors = [rel_error(x, reference["image_features"]),
              rel_error(y, reference["text_features"]),
              rel_error(logits, reference["logits_per_image"])]
    assert max(errors) < 1e-5, errors
    # the fixture tells the activations apart: the other one is far off
    wrong = model_with(*clip_import.convert_checkpoint(path, quick_gelu=quick_gelu is False,
                                                       **HEADS))
    assert rel_error(wrong.embed_texts(jnp.asarray(reference["texts"])),
                     reference["text_features"]) > 1e-3


def test_converted_config_is_clip():
    config, params = clip_import.convert_checkpoint(QUICK, **HEADS)
    vision, text = config["sample_encoder"], config["text_encoder"]
    assert (vision["image_size"], vision["patch"], vision["width"], vision["depth"],
            vision["heads"]) == (16, 4, 32, 2, 2)
    assert (text["vocab_size"], text["max_tokens"], text["width"], text["depth"],
            text["heads"]) == (100, 16, 32, 2, 2)
    assert config["embed_dim"] == 24
    assert vision["activation"] == text["activation"] == "quick_gelu"
    assert vision["layer_norm_eps"] == text["layer_norm_eps"] == 1e-5
    assert float(params["log_scale"]) == pytest.approx(2.5)
    assert config["init_temperature"] == pytest.approx(np.exp(-2.5))


def reference_forward(t: dict, images: np.ndarray, texts: np.ndarray, *, quick_gelu: bool,
                      heads: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """CLIP's forward pass in NumPy, float64, straight from the state dict in torch's layout
    (open_clip's VisionTransformer / TextTransformer / ResidualAttentionBlock)."""
    from math import erf

    def linear(x, name):
        return x @ t[name + ".weight"].T + t[name + ".bias"]

    def layer_norm(x, name):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + 1e-5) * t[name + ".weight"] + t[name + ".bias"]

    def act(x):
        if quick_gelu:
            return x / (1 + np.exp(-1.702 * x))
        return 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2)))

    def attention(x, name, additive):
        b, n, w = x.shape
        qkv = x @ t[name + ".in_proj_weight"].T + t[name + ".in_proj_bias"]
        q, k, v = (a.reshape(b, n, heads, w // heads).transpose(0, 2, 1, 3)
                   for a in np.split(qkv, 3, axis=-1))
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(w // heads) + additive
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        o = (p @ v).transpose(0, 2, 1, 3).reshape(b, n, w)
        return linear(o, name + ".out_proj")

    def blocks(x, prefix, additive):
        i = 0
        while f"{prefix}transformer.resblocks.{i}.ln_1.weight" in t:
            r = f"{prefix}transformer.resblocks.{i}."
            x = x + attention(layer_norm(x, r + "ln_1"), r + "attn", additive)
            x = x + linear(act(linear(layer_norm(x, r + "ln_2"), r + "mlp.c_fc")),
                           r + "mlp.c_proj")
            i += 1
        return x

    w = t["visual.conv1.weight"]  # (width, C, p, p)
    width, _, p, _ = w.shape
    b, size = images.shape[0], images.shape[1]
    g = size // p
    patches = images.reshape(b, g, p, g, p, -1).transpose(0, 1, 3, 5, 2, 4).reshape(b, g * g, -1)
    x = patches @ w.reshape(width, -1).T
    x = np.concatenate([np.broadcast_to(t["visual.class_embedding"], (b, 1, width)), x], 1)
    x = layer_norm(x + t["visual.positional_embedding"], "visual.ln_pre")
    x = blocks(x, "visual.", 0.0)
    image = layer_norm(x[:, 0], "visual.ln_post") @ t["visual.proj"]
    n = texts.shape[1]
    causal = np.triu(np.full((n, n), -np.inf), 1)
    y = t["token_embedding.weight"][texts] + t["positional_embedding"]
    y = layer_norm(blocks(y, "", causal), "ln_final")
    text = y[np.arange(len(texts)), texts.argmax(-1)] @ t["text_projection"]
    return image, text


@pytest.mark.parametrize("path,quick_gelu", [(QUICK, True), (EXACT, False)])
def test_float64_equals_numpy_transcription_of_clip(path, quick_gelu):
    tensors = clip_import.load_state_dict(path)
    reference = np.load(path.with_suffix(".npz"))
    with jax.enable_x64(True):
        config, params = clip_state_dict.convert_state_dict(tensors, quick_gelu=quick_gelu,
                                                            **HEADS)
        model = model_with(config, jax.tree.map(lambda a: np.asarray(a, np.float64), params))
        images = reference["images"].astype(np.float64)
        x, y, _ = jitted_outputs(model, jnp.asarray(images), jnp.asarray(reference["texts"]))
        assert x.dtype == y.dtype == jnp.float64
        t64 = {k: v.astype(np.float64) for k, v in tensors.items()}
        want_x, want_y = reference_forward(t64, images, reference["texts"],
                                           quick_gelu=quick_gelu)
        assert rel_error(x, want_x) < 1e-12
        assert rel_error(y, want_y) < 1e-12


def test_argmax_pooling_sees_only_up_to_the_end_token_under_the_causal_mask():
    config, params = clip_import.convert_checkpoint(QUICK, **HEADS)
    texts = np.asarray(np.load(QUICK.with_suffix(".npz"))["texts"])
    model = model_with(config, params)
    changed = texts.copy()
    changed[0, -1] = 5  # after the end token (99) of caption 0, which is 5 tokens long
    base, after = model.embed_texts(jnp.asarray(texts)), model.embed_texts(jnp.asarray(changed))
    np.testing.assert_array_equal(after[0], base[0])
    unmasked = model_with({**config, "text_encoder": {**config["text_encoder"],
                                                      "causal": False}}, params)
    assert rel_error(unmasked.embed_texts(jnp.asarray(changed))[0],
                     unmasked.embed_texts(jnp.asarray(texts))[0]) > 1e-4


def clip_loss_grads(model, images, texts):
    def loss(m):
        _, _, logits = outputs(m, images, texts)
        labels = jnp.arange(len(texts))
        return -jnp.mean(jax.nn.log_softmax(logits, -1)[labels, labels])

    return nnx.grad(loss)(model)


def test_remat_gives_the_same_gradients_float64():
    reference = np.load(QUICK.with_suffix(".npz"))
    with jax.enable_x64(True):
        config, params = clip_import.convert_checkpoint(QUICK, **HEADS)
        params = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
        images = jnp.asarray(reference["images"], jnp.float64)
        # both gradients in one jitted program (op by op, each op of the two backward passes
        # was a dispatch of its own)
        plain, remat = nnx.jit(lambda a, b, x, t: (clip_loss_grads(a, x, t),
                                                   clip_loss_grads(b, x, t)))(
            model_with(config, params), model_with(config, params, remat=True), images,
            jnp.asarray(reference["texts"]))
        plain, remat = nnx.to_pure_dict(plain), nnx.to_pure_dict(remat)
        leaves = jax.tree_util.tree_leaves_with_path(plain)
        assert len(leaves) == len(jax.tree.leaves(remat)) > 40
        for (path, a), b in zip(leaves, jax.tree.leaves(remat), strict=True):
            assert a.dtype == jnp.float64
            np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-14,
                                       err_msg=jax.tree_util.keystr(path))
        # every parameter of the CLIP architecture gets a gradient
        assert all(float(np.abs(a).max()) > 0 for _, a in leaves)


def test_bfloat16_compute_stays_close_to_open_clip():
    config, params = clip_import.convert_checkpoint(QUICK, **HEADS)
    reference = np.load(QUICK.with_suffix(".npz"))
    model = model_with(config, params, dtype="bfloat16", remat=True)
    x, y, logits = jitted_outputs(model, reference["images"], reference["texts"])
    assert x.dtype == y.dtype == jnp.float32  # embeddings leave the model in float32
    assert rel_error(x, reference["image_features"]) < 3e-2
    assert rel_error(y, reference["text_features"]) < 3e-2
    assert rel_error(logits, reference["logits_per_image"]) < 3e-2


def test_saved_directory_restores_the_same_model(tmp_path):
    config, params = clip_import.convert_checkpoint(QUICK, **HEADS)
    out = tmp_path / "converted"
    converted_directory.save_converted(out, config, params)
    assert json.loads((out / "model.json").read_text()) == config
    assert (out / "params").is_dir()
    restored_config, restored = pretrained_source.load_converted(out)
    assert restored_config == config
    reference = np.load(QUICK.with_suffix(".npz"))
    a = jitted_outputs(model_with(config, params), reference["images"], reference["texts"])
    b = jitted_outputs(model_with(restored_config, restored), reference["images"],
                       reference["texts"])
    for u, v in zip(a, b, strict=True):
        np.testing.assert_array_equal(u, v)
    with pytest.raises(ConfigError, match="not an empty directory"):
        converted_directory.save_converted(out, config, params)


def test_command_line(tmp_path, capsys):
    out = tmp_path / "out"
    assert clip_import.main([f"--checkpoint={EXACT}", f"--output={out}", "--quick_gelu=false",
                             "--vision_heads=2", "--text_heads=2"]) == 0
    assert "32,961 parameters" in capsys.readouterr().out
    assert json.loads((out / "model.json").read_text())["text_encoder"]["activation"] == "gelu"
    # the pixels the model expects, which a run starting from it takes (run/init_from.py)
    assert json.loads((out / "preprocess.json").read_text()) == {
        "mean": list(clip_import.OPENAI_MEAN), "std": list(clip_import.OPENAI_STD),
        "resize": "bicubic", "image_size": 16}
    assert clip_import.main([f"--checkpoint={EXACT}", f"--output={tmp_path / 'other'}"]) == 2
    assert "error: cannot tell" in capsys.readouterr().err


def test_quick_gelu_must_be_told_when_the_file_does_not_say():
    with pytest.raises(ConfigError, match="quick_gelu=True"):
        clip_import.convert_checkpoint(EXACT, **HEADS)
    assert clip_state_dict._quick_gelu_from_name("ViT-B-32-quickgelu.safetensors") is True
    assert clip_state_dict._quick_gelu_from_name("openai_vit_b32.safetensors") is True


@pytest.mark.parametrize("edit,named", [
    (lambda t: t.__setitem__("transformer.resblocks.1.mlp.c_fc.weight",
                             t["transformer.resblocks.1.mlp.c_fc.weight"][:64]),
     "'transformer.resblocks.1.mlp.c_fc.weight' has shape (64, 32)"),
    (lambda t: t.pop("visual.ln_post.bias"), "no tensor 'visual.ln_post.bias'"),
    (lambda t: t.__setitem__("visual.transformer.resblocks.0.ls_1.gamma", np.ones(32)),
     "tensor 'visual.transformer.resblocks.0.ls_1.gamma' of the checkpoint has no place"),
    (lambda t: t.__setitem__("visual.attnpool.c_proj.weight", np.ones((2, 2))),
     "ResNet CLIP"),
    (lambda t: t.__setitem__("visual.positional_embedding",
                             t["visual.positional_embedding"][:-1]),
     "'visual.positional_embedding' has shape \\(16, 32\\): not a square grid"),
    (lambda t: t.__setitem__("visual.transformer.resblocks.1.attn.in_proj_weight",
                             np.ones((3 * 32, 16))),
     "'visual.transformer.resblocks.1.attn.in_proj_weight' has shape \\(96, 16\\)"),
])
def test_mismatching_checkpoint_names_the_tensor(edit, named):
    tensors = clip_import.load_state_dict(QUICK)
    edit(tensors)
    with pytest.raises(ConfigError, match=named.replace("(64, 32)", "\\(64, 32\\)")):
        clip_state_dict.convert_state_dict(tensors, quick_gelu=True, **HEADS)


def test_heads_default_to_width_over_64_and_must_divide_the_width():
    tensors = clip_import.load_state_dict(QUICK)  # width 32: 32 // 64 = 0 heads
    with pytest.raises(ConfigError, match=r"vision heads = 0 .* set --vision_heads"):
        clip_state_dict.state_dict_architecture(tensors, quick_gelu=True, text_heads=2)
    wide = {"visual.conv1.weight": np.zeros((128, 3, 4, 4)), "visual.ln_pre.weight": np.ones(128),
            "visual.positional_embedding": np.zeros((17, 128)),
            "visual.transformer.resblocks.0.mlp.c_fc.weight": np.zeros((500, 128)),
            "token_embedding.weight": np.zeros((100, 192)),
            "positional_embedding": np.zeros((16, 192)),
            "transformer.resblocks.0.mlp.c_fc.weight": np.zeros((768, 192)),
            "text_projection": np.zeros((192, 24)), "logit_scale": np.zeros(())}
    config = clip_state_dict.state_dict_architecture(wide, quick_gelu=False)
    assert config["sample_encoder"]["heads"] == 2 and config["text_encoder"]["heads"] == 3
    assert config["sample_encoder"]["mlp_width"] == 500  # not 4 x 128
    assert "mlp_width" not in config["text_encoder"]  # 4 x 192
    with pytest.raises(ConfigError, match="vision heads = 3 must be a positive divisor"):
        clip_state_dict.state_dict_architecture(wide, quick_gelu=False, vision_heads=3)


def test_torch_files_need_torch(tmp_path, monkeypatch):
    path = tmp_path / "ViT-B-32.pt"
    path.write_bytes(b"not read")
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails
    with pytest.raises(ConfigError, match=r"needs PyTorch.*safetensors"):
        clip_import.load_state_dict(path)
    with pytest.raises(ConfigError, match="does not exist"):
        clip_import.load_state_dict(tmp_path / "missing.safetensors")


def test_a_torchscript_archive_is_refused_unless_allowed(tmp_path, monkeypatch, capsys):
    """A zip holding constants.pkl (what is_torchscript looks for, whatever the file is named)
    would go to torch.jit.load, which runs code stored in the file: refused, from Python and
    from the command line (exit 2), before PyTorch is even imported; allowed, it reaches the
    torch path (here without torch: the needs-PyTorch error)."""
    import zipfile

    path = tmp_path / "weights.pt"  # the name says nothing: the contents pick the path
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("model/constants.pkl", b"\x80\x04N.")
        archive.writestr("model/data.pkl", b"\x80\x04N.")
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails
    with pytest.raises(ConfigError, match=r"TorchScript archive: loading it \(torch.jit.load\) "
                                          r"runs code .* pass --allow_torchscript"):
        clip_import.load_state_dict(path)
    with pytest.raises(ConfigError, match="TorchScript archive"):
        clip_import.convert_checkpoint(path, quick_gelu=True)
    assert clip_import.main([f"--checkpoint={path}", f"--output={tmp_path / 'out'}"]) == 2
    assert "--allow_torchscript" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="needs PyTorch"):  # allowed: on to torch
        clip_import.load_state_dict(path, allow_torchscript=True)


def test_unreadable_files_are_one_line_naming_the_file(tmp_path, monkeypatch, capsys):
    """A truncated .safetensors, one cut inside its header, random bytes: a ConfigError from
    Python and exit 2 with one line from the command line, naming the file. PyTorch files:
    torch.load's errors for a truncated file and for a pickled model (weights_only refuses
    it) become the same kind of message (checked with a stand-in for torch, which the test
    environment does not install; the messages are torch's)."""
    import pickle
    import struct
    from types import SimpleNamespace

    data = EXACT.read_bytes()
    header = struct.unpack("<Q", data[:8])[0]
    files = {"truncated": data[:len(data) // 2], "cut_header": data[:8 + header // 2],
             "random": np.random.default_rng(0).bytes(4000)}
    for name, content in files.items():
        path = tmp_path / f"{name}.safetensors"
        path.write_bytes(content)
        with pytest.raises(ConfigError, match=f"'{path}' is not a readable .safetensors file "
                                              r"\(Error while deserializing header"):
            clip_import.load_state_dict(path)
        status = clip_import.main([f"--checkpoint={path}", f"--output={tmp_path / 'out'}",
                                   "--quick_gelu=false"])
        err = capsys.readouterr().err
        assert status == 2 and err.count("\n") == 1 and str(path) in err, err

    def load(error):
        def raise_it(*args, **kwargs):
            raise error
        return SimpleNamespace(load=raise_it, Tensor=object)

    path = tmp_path / "model.pt"
    path.write_bytes(b"not a zip")
    monkeypatch.setitem(sys.modules, "torch", load(RuntimeError(
        "PytorchStreamReader failed reading zip archive: failed finding central directory")))
    with pytest.raises(ConfigError, match=r"is not a readable PyTorch checkpoint "
                                          r"\(PytorchStreamReader failed reading zip archive"):
        clip_import.load_state_dict(path)
    monkeypatch.setitem(sys.modules, "torch", load(pickle.UnpicklingError(
        "Weights only load failed. This file can still be loaded, to do so you have two "
        "options.\n(1) ...\nWeightsUnpickler error: Unsupported global: GLOBAL __main__.Net "
        "was not an allowed global by default.")))
    with pytest.raises(ConfigError, match=r"pickled Python objects.*torch.save\(model\).*"
                                          r"\(Unsupported global: GLOBAL __main__.Net"):
        clip_import.load_state_dict(path)


def test_bfloat16_safetensors_read_as_float32(tmp_path):
    from safetensors.flax import save_file

    tensors = clip_import.load_state_dict(QUICK)
    half = {k: jnp.asarray(v, jnp.bfloat16) for k, v in tensors.items()}
    save_file(half, tmp_path / "half.safetensors")
    loaded = clip_import.load_state_dict(tmp_path / "half.safetensors")
    assert loaded.keys() == tensors.keys()
    for name, value in loaded.items():
        assert value.dtype == np.float32
        np.testing.assert_array_equal(value, np.asarray(half[name], np.float32))
    assert rel_error(loaded["visual.proj"], tensors["visual.proj"]) > 0  # rounded to bfloat16


def test_mlp_width_sets_the_hidden_layer():
    config, _ = clip_import.convert_checkpoint(QUICK, **HEADS)
    vit = {**config["sample_encoder"], "mlp_width": 20}
    state = nnx.to_pure_dict(nnx.state(nnx.eval_shape(
        lambda: build_model({**config, "sample_encoder": vit}, nnx.Rngs(0))), nnx.Param))
    depth = vit["depth"]  # scanned: the blocks stacked on a leading layer axis
    assert state["sample_encoder"]["blocks"]["fc1"]["kernel"].shape == (depth, 32, 20)
    assert state["sample_encoder"]["blocks"]["fc2"]["kernel"].shape == (depth, 20, 32)
    with pytest.raises(ConfigError, match="mlp_width must be a positive integer"):
        nnx.eval_shape(lambda: build_model({**config, "sample_encoder": {**vit, "mlp_width": 0}},
                                           nnx.Rngs(0)))  # shapes only: nothing to compile


def test_non_finite_pixels_give_non_finite_embeddings():
    config, params = clip_import.convert_checkpoint(QUICK, **HEADS)
    reference = np.load(QUICK.with_suffix(".npz"))
    images = np.array(reference["images"])
    images[1, 3, 5, 0] = np.nan
    images[2, 0, 0, 2] = np.inf
    # the parity test's program (the same model and shapes)
    x = np.asarray(jitted_outputs(model_with(config, params), images, reference["texts"])[0])
    assert np.all(np.isnan(x[1])) and not np.all(np.isfinite(x[2]))
    assert np.all(np.isfinite(x[[0, 3]]))  # the other images are untouched


def test_bare_conversion_states_its_assumptions():
    with pytest.warns(clip_state_dict.AssumptionWarning) as caught:
        clip_import.convert_checkpoint(EXACT, quick_gelu=False, **HEADS)
    (message,) = [str(w.message) for w in caught]
    assert message == (
        "converted from tensor shapes alone (no open_clip config), assuming image heads 2 (from "
        "--vision_heads); text heads 2 (from --text_heads); LayerNorm eps 1e-5; image pooling at "
        "the class token after ln_post (not pool_type 'avg' / final_ln_after_pool); a causal "
        "text mask with argmax pooling (not pool_type 'eos', 'last' or no_causal_mask); "
        "activation gelu (as given: --quick_gelu / quick_gelu=). A wrong assumption gives wrong "
        "outputs, not an error: " + clip_state_dict.CONFIG_HINT)


@pytest.mark.parametrize("extra,named", [
    ({"visual.layer1.0.conv1.weight": np.ones((2, 2))}, "this is a ResNet CLIP"),
    ({"visual.trunk.pos_embed": np.ones((1, 16, 32))}, "a timm image tower"),
    ({"transformer.embeddings.word_embeddings.weight": np.ones((2, 2))},
     r"a Hugging Face text tower \('transformer.embeddings.word_embeddings.weight'\)"),
    ({"text_projection.bias": np.ones(24)}, "tensor 'text_projection.bias': the text "
                                            "projection has a bias"),
    ({"logit_bias": np.ones(())}, "tensor 'logit_bias': a SigLIP-style model"),
])
def test_not_a_clip_is_said_before_asking_for_the_activation(tmp_path, extra, named):
    """A file the converter can tell is not a default CLIP is refused with that reason, not
    with the question about QuickGELU (no quick_gelu given, a name that says nothing)."""
    from safetensors.numpy import save_file

    tensors = {**clip_import.load_state_dict(EXACT), **extra}
    path = tmp_path / "model.safetensors"
    save_file({k: np.asarray(v, np.float32) for k, v in tensors.items()}, path)
    with pytest.raises(ConfigError, match=named):
        clip_import.convert_checkpoint(path)


def test_model_leaves_are_the_built_models_shapes_kept_per_block_and_handed_out_as_copies():
    """``tensor_layouts.model_leaves`` answers a block it has seen from what it kept: the
    shapes of the model the block builds, in either layout, never a dict a caller changed."""
    from contrastive_jax.training.models.converters.open_clip import tensor_layouts

    def model(scan: bool, depth: int = 2) -> dict:
        tower = {"width": 16, "depth": depth, "heads": 2, "features": 16, "scan": scan}
        return {"name": "dual_encoder", "embed_dim": 8,
                "sample_encoder": {"name": "vit", "image_size": 8, "patch": 4,
                                   "in_channels": 3, **tower},
                "text_encoder": {"name": "text_transformer", "vocab_size": 24,
                                 "max_tokens": 6, **tower}}

    for scan in (True, False):
        built = nnx.state(build_model(model(scan), nnx.Rngs(1)), nnx.Param)
        want = {"/".join(str(getattr(k, "key", k)) for k in path): tuple(v.shape)
                for path, v in jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(built))}
        first = tensor_layouts.model_leaves(model(scan))
        assert first == want and len(want) > 20
        first.clear()  # a caller's change is its own
        assert tensor_layouts.model_leaves(dict(reversed(model(scan).items()))) == want
    deeper = tensor_layouts.model_leaves(model(True, depth=3))
    assert deeper["text_encoder/blocks/fc1/kernel"] == (3, 16, 64)  # the layer axis first
