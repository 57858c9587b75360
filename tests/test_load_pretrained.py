"""``load_pretrained(path_or_name) -> (model, preprocess, tokenizer)`` (contrastive_jax.pretrained).

A converted directory of the open_clip parity fixtures gives open_clip's features from the
fixture's pixels; the preprocessing of encoded images equals open_clip's evaluation transforms
(``resize_mode="shortest"``, CLIP's, and ``"squash"``, SigLIP's; fixtures written by
tests/fixtures/make_open_clip_preprocess_fixture.py); the tokenizer recorded in the directory is
the one that comes back, checked against the text tower's vocabulary.
"""

import itertools
import pathlib
import zlib

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_clip_import import EXACT, HEADS, QUICK, rel_error

from contrastive_jax.errors import ConfigError
from contrastive_jax.pretrained import ImagePreprocess, TextTokenizer, load_pretrained
from contrastive_jax.training.data.text.text_tokenizers import load_tokenizer
from contrastive_jax.training.models.converters import clip_import, converted_directory

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
CLIP_PIXELS = {"mean": list(clip_import.OPENAI_MEAN), "std": list(clip_import.OPENAI_STD),
               "resize": "bicubic", "image_size": 16}


def encoded_fixture_images() -> list[bytes]:
    fixture = np.load(FIXTURES / "open_clip_preprocess.npz")
    encoded, offsets = fixture["encoded"].tobytes(), fixture["offsets"]
    return [encoded[a:b] for a, b in itertools.pairwise(offsets)]


@pytest.fixture(scope="module")
def converted_exact(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("pretrained") / "exact"
    config, params = clip_import.convert_checkpoint(EXACT, quick_gelu=False, **HEADS)
    converted_directory.save_converted(out, config, params, preprocess=CLIP_PIXELS)
    return out


def test_a_converted_directory_gives_open_clips_model_and_preprocessing(converted_exact):
    model, preprocess, tokenizer = load_pretrained(converted_exact, tokenizer=False)
    assert tokenizer is None
    assert preprocess == ImagePreprocess(16, tuple(clip_import.OPENAI_MEAN),
                                         tuple(clip_import.OPENAI_STD), "bicubic", "shortest")
    fixture = np.load(FIXTURES / "open_clip_preprocess.npz")
    pixels = preprocess(encoded_fixture_images())
    assert pixels.shape == (7, 16, 16, 3) and pixels.dtype == np.float32
    np.testing.assert_allclose(pixels, fixture["pixels"], rtol=1e-6, atol=1e-6)
    features = nnx.jit(lambda m, x: m.embed_samples(x))(model, jnp.asarray(pixels))
    assert rel_error(features, fixture["image_features"]) < 1e-5
    reference = np.load(EXACT.with_suffix(".npz"))
    texts = nnx.jit(lambda m, t: m.embed_texts(t))(model, jnp.asarray(reference["texts"]))
    assert rel_error(texts, reference["text_features"]) < 1e-5


def test_squash_preprocessing_equals_open_clips_siglip_transform():
    """open_clip's ``resize_mode="squash"`` (its SigLIP models): the whole image to 16 x 16,
    bicubic, mean = std = 0.5; the shortest-side crop is another function on these images."""
    fixture = np.load(FIXTURES / "open_clip_squash_preprocess.npz")
    squash = ImagePreprocess(16, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "bicubic", "squash")
    pixels = squash(encoded_fixture_images())
    np.testing.assert_allclose(pixels, fixture["pixels"], rtol=1e-6, atol=1e-6)
    crop = ImagePreprocess(16, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "bicubic", "shortest")
    assert np.max(np.abs(crop(encoded_fixture_images()) - fixture["pixels"])) > 0.1


def test_the_recorded_tokenizer_comes_back_and_must_fit_the_text_tower(tmp_path):
    merges = FIXTURES / "clip_bpe_merges.txt.gz"
    config, params = clip_import.convert_checkpoint(QUICK, **HEADS)
    out = tmp_path / "with_tokenizer"
    converted_directory.save_converted(out, config, params, preprocess=CLIP_PIXELS,
                                       tokenizer={"kind": "clip_bpe", "path": str(merges)})
    assert (out / "tokenizer" / merges.name).read_bytes() == merges.read_bytes()
    # the fixture's text tower has 100 ids; the merges file's tokenizer needs 2,406
    with pytest.raises(ConfigError, match=r"2406 token ids .*vocab_size = 100"):
        load_pretrained(out)
    wide = dict(config, text_encoder=dict(config["text_encoder"], vocab_size=2406))
    params["text_encoder"]["tokens"]["embedding"] = np.resize(
        params["text_encoder"]["tokens"]["embedding"], (2406, 32))
    out = tmp_path / "wide"
    converted_directory.save_converted(out, wide, params, preprocess=CLIP_PIXELS,
                                       tokenizer={"kind": "clip_bpe", "path": str(merges)})
    model, _, tokenizer = load_pretrained(out)
    assert isinstance(tokenizer, TextTokenizer) and tokenizer.context_length == 16
    texts = ["a photo of a cat", "Ünïcödé and émoji 🐈 !!"]
    expected = load_tokenizer({"kind": "clip_bpe", "path": str(merges)}).encode(texts, 16)
    np.testing.assert_array_equal(tokenizer(texts), expected)
    assert tokenizer("one text").shape == (1, 16)
    assert model.embed_texts(jnp.asarray(tokenizer(texts))).shape == (2, 24)


def test_a_directory_without_a_tokenizer_says_what_to_pass(converted_exact):
    with pytest.raises(ConfigError, match=r"tokenizer=PATH .*bpe_simple_vocab_16e6"):
        load_pretrained(converted_exact)


def test_bfloat16_compute_and_bad_preprocessing_settings(converted_exact):
    model, _, _ = load_pretrained(converted_exact, tokenizer=False, dtype="bfloat16")
    reference = np.load(EXACT.with_suffix(".npz"))
    x = model.embed_samples(jnp.asarray(reference["images"]))
    assert x.dtype == jnp.float32 and rel_error(x, reference["image_features"]) < 3e-2
    with pytest.raises(ConfigError, match=r"unknown data\.preprocess\.resize_mode 'longest'"):
        ImagePreprocess(16, (0.5,) * 3, (0.5,) * 3, "bicubic", "longest")
    with pytest.raises(ConfigError, match=r"unknown data\.preprocess\.resize 'nearest'"):
        ImagePreprocess(16, (0.5,) * 3, (0.5,) * 3, "nearest")


def test_a_trainer_workdir_refuses_what_names_another_kind():
    """A workdir holds one model: ``pretrained=TAG`` (an open_clip release) is refused, and
    ``step=N`` names a checkpoint of a workdir only. (A workdir's model, tokenizer and steps:
    tests/test_layout_fixtures.py, on the committed CLIP workdir.)"""
    workdir = FIXTURES / "workdir_v0_3_clip"
    with pytest.raises(ConfigError, match="pretrained='x' names an open_clip release"):
        load_pretrained(workdir, pretrained="x")
    with pytest.raises(ConfigError, match=r"is not one .*drop the step"):
        load_pretrained(FIXTURES / "converted_v0_3_siglip", step=1)
    with pytest.raises(ConfigError, match=r"has no checkpoint of step 3; its steps: \[2\]"):
        load_pretrained(workdir, step=3)


def test_zero_shot_classifier_is_clips_prompt_ensemble(tmp_path):
    """The weights equal normalise(mean_t normalise(embed_texts(ids of template_t(name_c))))
    computed class by class in float64, across the 256-prompt chunks (4 classes x 80
    templates = 320 prompts: two chunks, the second padded)."""
    from contrastive_jax.pretrained import zero_shot_classifier
    from contrastive_jax.training.data.text.prompt_templates import IMAGENET_TEMPLATES

    config, params = clip_import.convert_checkpoint(QUICK, **HEADS)
    out = tmp_path / "converted"
    converted_directory.save_converted(out, config, params, preprocess=CLIP_PIXELS)
    model, _, _ = load_pretrained(out, tokenizer=False)

    class Hashing:  # ids of a text: a deterministic function of it, 100-id vocabulary
        def encode(self, texts, max_tokens):
            rows = [[1 + (zlib.crc32(t.encode()) >> s) % 97 for s in range(max_tokens)]
                    for t in texts]
            return np.asarray(rows, np.int32)

    tokenizer = TextTokenizer(Hashing(), 16)
    names = ["cat", "dog", "bird", "fish"]
    w = zero_shot_classifier(model, tokenizer, names, "imagenet")
    assert w.shape == (4, 24)
    expected = []
    for name in names:
        e = np.asarray(model.embed_texts(jnp.asarray(tokenizer(
            [t.format(name) for t in IMAGENET_TEMPLATES]))), np.float64)
        m = (e / np.linalg.norm(e, axis=1, keepdims=True)).mean(0)
        expected.append(m / np.linalg.norm(m))
    np.testing.assert_allclose(w, np.stack(expected), atol=2e-6)
    with pytest.raises(ConfigError, match="not a template set"):
        zero_shot_classifier(model, tokenizer, names, "imagenet_all")


def siglip_hub_directory(tmp_path: pathlib.Path, *, spiece: bool = True) -> pathlib.Path:
    """tests/fixtures/open_clip_tiny_siglip as a SigLIP hub repository has it: the config names
    SigLIP's Hugging Face tokenizer, spiece.model and tokenizer_config.json beside the weights
    (the fixture's 2,000-piece SentencePiece model stands in for c4_en)."""
    import json
    import shutil

    hub = tmp_path / "hub"
    shutil.copytree(FIXTURES / "open_clip_tiny_siglip", hub)
    config = json.loads((hub / "open_clip_config.json").read_text())
    config["model_cfg"]["text_cfg"].update(hf_tokenizer_name="timm/ViT-B-16-SigLIP",
                                           tokenizer_kwargs={"clean": "canonicalize"})
    (hub / "open_clip_config.json").write_text(json.dumps(config))
    (hub / "tokenizer_config.json").write_text(json.dumps({"pad_token": "</s>",
                                                           "eos_token": "</s>"}))
    if spiece:
        shutil.copyfile(FIXTURES / "siglip_spm.model", hub / "spiece.model")
    return hub


def test_a_siglip_hub_directory_gives_open_clips_model_preprocessing_and_tokenizer(tmp_path):
    """The open_clip SigLIP fixture (timm map-head trunk) from its hub directory: features and
    logits (with the bias) equal open_clip's; the preprocessing is open_clip's squash transform
    with SigLIP's mean and std; the tokenizer spec is SigLIP's SentencePiece with open_clip's
    cleaning and </s> padding, and it must fit the text tower (64 ids here, 2,000 pieces)."""
    from contrastive_jax.pretrained import read_source

    hub = siglip_hub_directory(tmp_path)
    model, preprocess, tokenizer = load_pretrained(hub, tokenizer=False)
    assert tokenizer is None
    assert preprocess == ImagePreprocess(16, (0.5,) * 3, (0.5,) * 3, "bicubic", "squash")
    reference = np.load(hub / "outputs.npz")
    x = model.embed_samples(jnp.asarray(reference["images"]))
    y = model.embed_texts(jnp.asarray(reference["texts"]))
    assert rel_error(x, reference["image_features"]) < 1e-5
    assert rel_error(y, reference["text_features"]) < 1e-5
    unit = lambda a: a / jnp.linalg.norm(a, axis=-1, keepdims=True)  # noqa: E731
    logits = jnp.exp(model.log_scale[...]) * unit(x) @ unit(y).T + model.bias[...]
    assert rel_error(logits, reference["logits"]) < 1e-5
    assert read_source(hub).tokenizer == {"kind": "sentencepiece_open_clip",
                                          "path": str(hub / "spiece.model"),
                                          "clean": "canonicalize", "pad_id": 1}
    with pytest.raises(ConfigError, match=r"2000 token ids .*vocab_size = 64"):
        load_pretrained(hub)
    with pytest.raises(ConfigError, match=r"tokenizer=PATH \(the SigLIP model's spiece\.model"):
        load_pretrained(siglip_hub_directory(tmp_path / "bare", spiece=False))


def test_init_from_takes_an_open_clip_hub_directory_with_its_pixels(tmp_path):
    """``model.init_from = {"path": HUB}`` with the converted model's block: every parameter
    bit-identical to load_pretrained's (the same conversion), and a config that sets no mean /
    std takes the hub's preprocess_cfg (SigLIP's 0.5) with a start line saying so; a path that
    is none of the three kinds names them."""
    import jax
    from test_open_clip_siglip import lit_config

    from contrastive_jax.pretrained import read_source
    from contrastive_jax.training.methods import method_for
    from contrastive_jax.training.parameter_paths import path_name
    from contrastive_jax.training.run.init_from import load_into
    from contrastive_jax.training.run_spec import source_pixels
    from contrastive_jax.training.step.train_state import create_state

    hub = siglip_hub_directory(tmp_path)
    config = lit_config(hub)
    config.model = {**read_source(hub).model, "init_from": {"path": str(hub)},
                    "frozen": "sample_encoder"}
    _, state, _ = create_state(config, 10, method_for(config))
    params, _, messages = load_into(state.params, state.rest, config.model,
                                    config.model.init_from)
    assert "open_clip model" in messages[-1]
    model, _, _ = load_pretrained(hub, tokenizer=False)
    want = {path_name(p): np.asarray(a) for p, a in jax.tree_util.tree_leaves_with_path(
        nnx.to_pure_dict(nnx.state(model, nnx.Param)))}
    got = {path_name(p): np.asarray(a) for p, a in jax.tree_util.tree_leaves_with_path(params)}
    assert sorted(got) == sorted(want)
    assert all(got[k].tobytes() == want[k].tobytes() for k in want)
    config.data.preprocess.mean = config.data.preprocess.std = None
    filled, lines = source_pixels(config)
    assert tuple(filled.data.preprocess.mean) == tuple(filled.data.preprocess.std) == (0.5,) * 3
    assert "open_clip preprocess_cfg" in lines[0]
    with pytest.raises(ConfigError, match=r"neither a converted checkpoint .* nor an open_clip "
                                          r"model \('no-such-model' is not a file"):
        load_into(state.params, state.rest, config.model, {"path": "no-such-model"})


def test_the_converter_copies_the_tokenizer_into_the_directory(tmp_path, capsys):
    """clip_import's command: a SigLIP hub directory's spiece.model goes into the converted
    directory with its spec (and load_pretrained then finds it: here the 2,000-piece fixture
    model does not fit the 64-id text tower, which it reports); --tokenizer names CLIP's merges
    file for a bare state dict; without one a note says how to include it."""
    import json

    hub = siglip_hub_directory(tmp_path)
    out = tmp_path / "siglip"
    assert clip_import.main([f"--checkpoint={hub}", f"--output={out}"]) == 0
    assert json.loads((out / "tokenizer.json").read_text()) == {
        "kind": "sentencepiece_open_clip", "path": "tokenizer/spiece.model",
        "clean": "canonicalize", "pad_id": 1}
    assert (out / "tokenizer" / "spiece.model").read_bytes() == \
        (FIXTURES / "siglip_spm.model").read_bytes()
    with pytest.raises(ConfigError, match=r"2000 token ids .*vocab_size = 64"):
        load_pretrained(out)
    merges = FIXTURES / "clip_bpe_merges.txt.gz"
    assert clip_import.main([f"--checkpoint={QUICK}", f"--output={tmp_path / 'a'}",
                             "--vision_heads=2", "--text_heads=2"]) == 0
    assert "note: no tokenizer file beside the weights" in capsys.readouterr().out
    assert not (tmp_path / "a" / "tokenizer.json").exists()
    assert clip_import.main([f"--checkpoint={QUICK}", f"--output={tmp_path / 'b'}",
                             "--vision_heads=2", "--text_heads=2", f"--tokenizer={merges}"]) == 0
    assert json.loads((tmp_path / "b" / "tokenizer.json").read_text()) == {
        "kind": "clip_bpe", "path": f"tokenizer/{merges.name}"}


def test_read_source_reads_the_model_without_its_weights(tmp_path):
    """read_source of a SigLIP hub directory: the converted model's block (but for the logit
    scale and bias, which only the weights hold), its tokenizer spec and SigLIP's pixels,
    with the weight file removed; with_weights then gives the conversion's; of a converted
    directory: its files as written."""
    from contrastive_jax.pretrained import read_source, with_weights

    hub = siglip_hub_directory(tmp_path)
    converted = with_weights(read_source(hub))
    assert converted.has_weights and converted.model["init_bias"] != -10
    (hub / "open_clip_model.safetensors").unlink()
    described = read_source(hub)
    assert not described.has_weights and described.kind == "open_clip"
    initial = ("init_temperature", "init_bias")
    assert {k: v for k, v in described.model.items() if k not in initial} == \
        {k: v for k, v in converted.model.items() if k not in initial}
    assert described.model["init_bias"] == -10
    assert described.tokenizer == converted.tokenizer
    pixels = {"mean": [0.5] * 3, "std": [0.5] * 3, "resize": "bicubic",
              "resize_mode": "squash", "image_size": 16}
    assert described.preprocess == pixels
    out = tmp_path / "converted"
    converted_directory.save_converted(out, converted.model, converted.params,
                                     preprocess=pixels, tokenizer=converted.tokenizer)
    stored = read_source(out)
    assert stored.kind == "converted" and not stored.has_weights
    assert stored.model == converted.model and stored.preprocess == pixels
    assert stored.tokenizer == {**converted.tokenizer,
                                "path": str(out / "tokenizer" / "spiece.model")}
