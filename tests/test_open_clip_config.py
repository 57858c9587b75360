"""open_clip model configs as this project's model block
(contrastive_jax.training.models.converters.open_clip.model_configs) and the config-driven CLIP
import (clip_import.convert_open_clip).

Fixtures written with open_clip 3.3.0 (no PyTorch here): tests/fixtures/make_open_clip_models.py
recorded open_clip's shipped configs, the timm trunks they name and, for each config that
converts, the digest of the names and shapes of its state dict; make_open_clip_options_fixture.py
wrote tiny open_clip models whose configs set the options that leave no trace in the tensors
(text pool 'eos' / 'last' without causal mask, image pool 'avg' + final_ln_after_pool, CLIPA's
no_ln_pre, LayerNorm eps 1e-6, a SigLIP-style text tower with a biased projection, tanh GELU and
a logit bias) as hub directories with open_clip's outputs; make_open_clip_siglip_fixture.py a
tiny timm-tower SigLIP. With the config every one matches open_clip to < 1e-5 relative in
float32; without it the converter warns and is wrong where it cannot tell, and refuses where it
can.
"""

import json
import os
import pathlib
import sys
import warnings

import jax.numpy as jnp
import numpy as np
import open_clip_models_page as models_page
import pytest
from flax import nnx
from test_clip_import import model_with, rel_error

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models.converters import (
    clip_import,
    clip_state_dict,
    state_dict_files,
)
from contrastive_jax.training.models.converters.open_clip import config_options as options
from contrastive_jax.training.models.converters.open_clip import model_configs as occ
from contrastive_jax.training.models.converters.open_clip import model_sources as sources
from contrastive_jax.training.models.converters.open_clip import tensor_rules

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
OPTIONS = FIXTURES / "open_clip_options"
SIGLIP = FIXTURES / "open_clip_tiny_siglip"
CASES = ("text_eos", "text_last", "vision_avg", "clipa", "eps", "siglip_text")
DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "open_clip_models.md"


@nnx.jit
def outputs(model, images, texts):
    """Image and text features and open_clip's ``get_logits`` (with the logit bias)."""
    x, y = model.embed_samples(images), model.embed_texts(texts)
    normal = lambda a: a / jnp.linalg.norm(a, axis=-1, keepdims=True)  # noqa: E731
    logits = jnp.exp(model.log_scale[...]) * normal(x) @ normal(y).T
    return x, y, logits if model.bias is None else logits + model.bias[...]


def errors(converted_model, params, directory):
    reference = np.load(directory / "outputs.npz")
    x, y, logits = outputs(model_with(converted_model, params), jnp.asarray(reference["images"]),
                           jnp.asarray(reference["texts"]))
    return [rel_error(x, reference["image_features"]), rel_error(y, reference["text_features"]),
            rel_error(logits, reference["logits"])]


def tiny_cfg(**top):
    """The options fixtures' model config, with ``top`` / ``vision`` / ``text`` overrides."""
    vision, text = top.pop("vision", {}), top.pop("text", {})
    cfg = json.loads((OPTIONS / "text_eos" / "open_clip_config.json").read_text())["model_cfg"]
    cfg["text_cfg"].pop("pool_type"), cfg["text_cfg"].pop("eos_id")
    return {**cfg, **top, "vision_cfg": {**cfg["vision_cfg"], **vision},
            "text_cfg": {**cfg["text_cfg"], **text}}


# --- the recorded data and the document -------------------------------------------------------

def test_every_open_clip_option_is_converted_accepted_or_refused():
    """Each field of open_clip 3.3.0's CLIPVisionCfg / CLIPTextCfg and each top-level key is in
    exactly one of the three tables, and the tables name nothing open_clip lacks."""
    fields = sources.recorded()["fields"]
    assert sources.recorded()["open_clip_version"] == "3.3.0"
    for key, tables in (("vision_cfg", (options.VISION_CONVERTED, options.VISION_NO_EFFECT,
                                        options.VISION_REFUSED)),
                        ("text_cfg", (options.TEXT_CONVERTED, options.TEXT_NO_EFFECT,
                                      options.TEXT_REFUSED)),
                        ("model", (options.MODEL_CONVERTED, options.MODEL_NO_EFFECT,
                                   options.MODEL_REFUSED))):
        known = set(fields[key]) | ({"custom_text", "multimodal_cfg"} if key == "model"
                                    else set())
        assert len(known) == sum(len(t) for t in tables), key  # no option twice
        assert set().union(*tables) == known, (key, set().union(*tables) ^ known)
    assert len(fields["vision_cfg"]) == 32 and len(fields["text_cfg"]) == 32


def test_the_document_is_what_the_converter_decides():
    """docs/open_clip_models.md is models_document() of the recorded data: 144 configs, 69
    converted, 75 refused."""
    assert DOCS.read_text() == models_page.models_document()
    assert len(sources.model_names()) == 144
    assert models_page.verdict_counts() == {"convertible": 69, "refused": 75}


def test_every_converted_config_reads_exactly_open_clips_state_dict():
    """For each of the 69 configs that convert, the tensors the block's rules read (names and
    shapes, tensor_rules.rules) are exactly those of the state dict open_clip builds for
    the config (its digest, recorded from open_clip on the meta device)."""
    for name in sources.model_names():
        block, _ = occ.verdict(name)
        if block is None:
            continue
        shapes = {rule.source: rule.shape for rule in tensor_rules.rules(block)}
        recorded = sources.recorded()["models"][name]["state_dict"]
        assert len(shapes) == recorded["tensors"], name
        assert sum(int(np.prod(s)) for s in shapes.values()) == recorded["parameters"], name
        assert models_page.state_dict_digest(shapes) == recorded["digest"], name


@pytest.mark.parametrize("name,vision,text,top", [
    ("ViT-H-14", {"heads": 16, "width": 1280, "pool": "token", "pre_norm": True},
     {"heads": 16, "pool": "argmax", "causal": True}, {}),
    ("ViT-bigG-14", {"heads": 16, "mlp_width": 8192, "layer_norm_eps": 1e-5},
     {"heads": 20}, {}),
    ("ViT-g-14", {"heads": 16, "mlp_width": 6144}, {}, {}),
    ("ViT-H-14-worldwide", {"activation": "gelu"},
     {"pool": "eos", "eos_id": 2, "causal": True, "vocab_size": 901629}, {}),
    ("ViT-L-14-worldwide-quickgelu", {"activation": "quick_gelu"},
     {"pool": "eos", "eos_id": 1, "activation": "quick_gelu"}, {}),
    ("ViT-L-14-CLIPA", {"pool": "mean", "norm_after_pool": True, "pre_norm": False},
     {"pool": "last", "causal": False}, {}),
    ("ViT-B-16-SigLIP", {"pool": "map", "class_token": False, "patch_bias": True,
                         "activation": "gelu", "layer_norm_eps": 1e-6, "heads": 12},
     {"pool": "last", "causal": False, "layer_norm_eps": 1e-6, "activation": "gelu"},
     {"sample_projection": "none", "text_projection": "linear_bias", "siglip": True,
      "init_bias": -10.0}),
    ("ViT-SO400M-14-SigLIP", {"mlp_width": 4304, "heads": 16}, {"mlp_width": 4304}, {}),
    ("ViT-B-16-SigLIP2", {"activation": "gelu"}, {"activation": "gelu_tanh"}, {}),
    ("ViT-gopt-16-SigLIP2-256", {"activation": "gelu_tanh"}, {"activation": "gelu_tanh"}, {}),
    ("ViT-SO400M-16-SigLIP-i18n-256", {}, {}, {"text_projection": "none"}),
])
def test_recorded_configs_give_the_settings_the_tensors_do_not_show(name, vision, text, top):
    block, _ = occ.verdict(name)
    assert block is not None
    assert {k: block["sample_encoder"].get(k) for k in vision} == vision
    assert {k: block["text_encoder"].get(k) for k in text} == text
    assert {k: block.get(k) for k in top} == top


@pytest.mark.parametrize("name,message", [
    ("RN50", r"vision_cfg.layers = \[3, 4, 6, 3\] is not supported \(a list of stage depths "
             r"is open_clip's ModifiedResNet"),
    ("ViT-M-16-alt", r"vision_cfg.ls_init_value = 0.0001 is not supported \(LayerScale"),
    ("coca_ViT-B-32", r"model.multimodal_cfg = .* \(CoCa's multimodal text decoder"),
    ("xlm-roberta-base-ViT-B-32", r"text_cfg.hf_model_name = \"xlm-roberta-base\" is not "
                                  r"supported \(a Hugging Face transformers text tower"),
    ("convnext_base", r"timm_model_name = \"convnext_base\" is not supported \(a ConvNeXt"),
    ("EVA02-B-16", r"\(timm's Eva transformer \(EVA / PE-Core: rotary"),
    ("PE-Core-B-16", r"\(timm's Eva transformer"),
    ("MobileCLIP-S1", r"\(MobileCLIP's FastViT"),
    ("MobileCLIP2-B", r"its patch embedding is a HybridEmbed"),
    ("MobileCLIP2-L-14", r"\(a class token"),
    ("ViTamin-S", r"its patch embedding is a HybridEmbed"),
    ("swin_base_patch4_window7_224", r"a Swin transformer"),
    ("vit_relpos_medium_patch16_cls_224", r"relative position biases"),
    ("vit_medium_patch16_gap_256", r"\(LayerScale"),
    ("ViT-SO400M-14-SigLIP-384", r"384-pixel images, not a multiple of the patch 14: timm's "
                                 r"patch convolution drops the last 6 pixel rows"),
])
def test_refused_configs_name_the_option(name, message):
    block, why = occ.verdict(name)
    assert block is None
    with pytest.raises(ConfigError, match=message):
        occ.model_block(sources.recorded_model(name)["model_cfg"])
    assert why.startswith("open_clip option ")


@pytest.mark.parametrize("edit,message", [
    ({"vision": {"qk_norm": True}}, r"vision_cfg.qk_norm = true is not supported \(LayerNorm "
                                    r"on queries and keys .*; supported: false\)"),
    ({"vision": {"block_type": "custom"}}, r"vision_cfg.block_type = \"custom\""),
    ({"vision": {"attentional_pool": True}}, r"vision_cfg.attentional_pool = true"),
    ({"vision": {"pool_type": "none"}}, r"vision_cfg.pool_type = \"none\" is not supported"),
    ({"vision": {"pos_embed_type": "rope"}}, r"vision_cfg.pos_embed_type = \"rope\""),
    ({"vision": {"image_size": 18}}, r"vision_cfg.image_size = 18 .* drops the last 2 pixel"),
    ({"vision": {"head_width": 10}}, r"vision_cfg.head_width = 10 .*\(3 heads do not divide"),
    ({"vision": {"image_size": [16, 20]}}, r"vision_cfg.image_size = \[16, 20\] .*square"),
    ({"vision": {"patch_sise": 4}}, r"vision_cfg.patch_sise = 4 is not supported \(not an "
                                    r"option of open_clip 3.3.0's vision_cfg; did you mean "
                                    r"'patch_size'\?"),
    ({"text": {"embed_cls": True}}, r"text_cfg.embed_cls = true .*\(CoCa's class token"),
    ({"text": {"pool_type": "none"}}, r"text_cfg.pool_type = \"none\""),
    ({"text": {"proj_type": "mlp"}}, r"text_cfg.proj_type = \"mlp\" .*anything but 'none' as "
                                     r"a linear projection"),
    ({"text": {"proj_type": "none"}}, r"text_cfg.proj_type = \"none\" .*32 wide, not "
                                      r"embed_dim 16"),
    ({"text": {"norm_kwargs": {"eps": 1e-6, "elementwise_affine": False}}},
     r"text_cfg.norm_kwargs = .*arguments of torch.nn.LayerNorm"),
    ({"text": {"act_kwargs": {"approximate": "sigmoid"}}}, r"text_cfg.act_kwargs"),
    ({"quick_gelu": True, "text": {"act_kwargs": {"approximate": "tanh"}}},
     r"text_cfg.act_kwargs = .*QuickGELU takes no arguments"),
    ({"text": {"ls_init_value": 0.1}}, r"text_cfg.ls_init_value = 0.1"),
    ({"text": {"scale_fc": True}}, r"text_cfg.scale_fc = true"),
    ({"temperature": 0.07}, r"option model.temperature = 0.07 is not supported \(not an option"),
])
def test_every_refused_option_is_named(edit, message):
    with pytest.raises(ConfigError, match=message):
        occ.model_block(tiny_cfg(**edit))


def test_options_without_effect_are_accepted_and_noted():
    block = occ.model_block(tiny_cfg(
        vision={"patch_dropout": 0.5, "output_tokens": True, "timm_drop_path": 0.1,
                "attn_pooler_heads": 4},
        text={"hf_tokenizer_name": "facebook/xlm-v-base", "final_ln_after_pool": True,
              "pad_id": 1}, cast_dtype="bf16", custom_text=True))
    notes = "\n".join(block.notes)
    for option in ("vision_cfg.patch_dropout = 0.5", "vision_cfg.output_tokens = true",
                   "vision_cfg.timm_drop_path = 0.1", "vision_cfg.attn_pooler_heads = 4",
                   "text_cfg.hf_tokenizer_name", "text_cfg.final_ln_after_pool = true",
                   "text_cfg.pad_id = 1", "model.cast_dtype", "model.custom_text = true"):
        assert option in notes, option
    assert block.tokenizer == "facebook/xlm-v-base"
    assert block.model == occ.model_block(tiny_cfg()).model  # the same function


def test_timm_trunks_from_the_record_or_a_fixtures_arguments():
    """A SigLIP config's trunk comes from the recorded timm data; the fixture's unregistered
    timm model from the timm_model_args of its open_clip_config.json (worked out like timm's
    constructor; the generator checked that against timm); and what does not fit is named."""
    config = json.loads((SIGLIP / "open_clip_config.json").read_text())
    with pytest.raises(ConfigError, match=r"timm_model_name = \"vit_tiny_test_patch4_siglip_16\" "
                                          r"is not supported \(the recorded data"):
        occ.model_block(config["model_cfg"])
    block = occ.model_block(config["model_cfg"], timm_args=config["timm_model_args"]).model
    assert block["sample_encoder"] == {
        "name": "vit", "image_size": 16, "patch": 4, "in_channels": 3, "width": 16, "depth": 2,
        "heads": 2, "mlp_ratio": 4, "mlp_width": 59, "features": None, "activation": "gelu",
        "layer_norm_eps": 1e-6, "class_token": False, "pre_norm": False, "pool": "map",
        "patch_bias": True}
    cfg, args = config["model_cfg"], config["timm_model_args"]
    for edit, message in [
            ({**args, "reg_tokens": 4}, "4 register tokens"),
            ({**args, "class_token": True}, "a class token"),
            ({**args, "init_values": 1e-5}, "LayerScale"),
            ({**args, "global_pool": "avg"}, "a norm after the pooling"),
            ({**args, "pre_norm": True}, "a LayerNorm before the blocks"),
            ({**args, "embed_layer": "HybridEmbed"}, r"timm_model_args \['embed_layer'\] are "
                                                     "not read")]:
        with pytest.raises(ConfigError, match=message):
            occ.model_block(cfg, timm_args=edit)
    for vision, message in [({"timm_pool": "avg"}, r"vision_cfg.timm_pool = \"avg\""),
                            ({"timm_proj": "linear"}, r"vision_cfg.timm_proj = \"linear\""),
                            ({"image_size": 32}, r"vision_cfg.image_size = 32 .* built for 16")]:
        with pytest.raises(ConfigError, match=message):
            occ.model_block({**cfg, "vision_cfg": {**cfg["vision_cfg"], **vision}},
                            timm_args=args)
    with pytest.raises(ConfigError, match=r"embed_dim = 24 .* trunk's 16 wide"):
        occ.model_block({**cfg, "embed_dim": 24}, timm_args=args)


# --- parity with open_clip through the config -----------------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_with_the_config_every_option_matches_open_clip(case):
    """The hub directory (config + weights) converts to open_clip's outputs: image and text
    features and logits (with the logit bias) within 1e-5 relative in float32."""
    converted = clip_import.convert_open_clip(OPTIONS / case)
    assert converted.assumptions == ()
    assert max(errors(converted.model, converted.params, OPTIONS / case)) < 1e-5
    assert converted.preprocess == {"mean": [0.5] * 3, "std": [0.5] * 3, "resize": "bilinear",
                                    "resize_mode": "squash", "image_size": 16}


def test_the_siglip_hub_directory_converts_through_its_config():
    converted = clip_import.convert_open_clip(SIGLIP)
    assert max(errors(converted.model, converted.params, SIGLIP)) < 1e-5
    block = converted.model
    assert (block["siglip"], block["sample_projection"], block["text_projection"]) == \
        (True, "none", "linear_bias")
    assert block["init_bias"] == pytest.approx(-4.7, abs=1e-6)
    assert block["init_temperature"] == pytest.approx(np.exp(-2.3), rel=1e-6)
    assert converted.preprocess["resize_mode"] == "squash"


@pytest.mark.parametrize("case,wrong", [("text_eos", "text"), ("text_last", "text"),
                                        ("vision_avg", "image"), ("eps", "text")])
def test_without_the_config_a_silent_option_is_warned_about_and_wrong(case, wrong):
    """The same weights as a bare state dict: the tensors cannot show these options, so the
    converter assumes CLIP's settings, says so (an AssumptionWarning naming what it assumed),
    and the tower the option acts on is far from open_clip's."""
    cfg = occ.model_block(json.loads((OPTIONS / case / "open_clip_config.json").read_text())
                          ["model_cfg"]).model
    with pytest.warns(clip_state_dict.AssumptionWarning,
                      match=r"assuming image heads 2 \(from --vision_heads\); text heads 2 .*"
                            r"LayerNorm eps 1e-5; image pooling at the class token .* a causal "
                            r"text mask with argmax pooling"):
        converted = clip_import.convert_open_clip(
            OPTIONS / case / "open_clip_model.safetensors", vision_heads=2, text_heads=2,
            quick_gelu=cfg["text_encoder"]["activation"] == "quick_gelu")
    image, text, _ = errors(converted.model, converted.params, OPTIONS / case)
    assert {"image": image, "text": text}[wrong] > 1e-3
    assert len(converted.assumptions) == 1


@pytest.mark.parametrize("path,message", [
    (OPTIONS / "clipa", r"no visual.ln_pre: open_clip's vision_cfg.no_ln_pre = true \(its CLIPA "
                        r"configs \['ViT-H-14-CLIPA'"),
    (OPTIONS / "siglip_text", r"tensor 'text_projection.bias': the text projection has a bias"),
    (SIGLIP, r"a timm image tower \(visual.trunk.\*, e.g. a SigLIP\)"),
])
def test_without_the_config_what_the_tensors_contradict_is_refused_first(path, message):
    """Refused before the question about the activation (no quick_gelu given)."""
    with pytest.raises(ConfigError, match=message + ".*pass the model's open_clip config"):
        clip_import.convert_open_clip(path / "open_clip_model.safetensors")


def test_config_sources_and_contradicting_flags(tmp_path):
    """The config as a JSON file beside a weight file, as a directory, as a mapping; a flag
    that contradicts it names both; a weight file whose logit bias or projection bias the
    config does not have is refused."""
    weights = OPTIONS / "text_eos" / "open_clip_model.safetensors"
    config_file = OPTIONS / "text_eos" / "open_clip_config.json"
    a = clip_import.convert_open_clip(weights, open_clip_config=config_file)
    b = clip_import.convert_open_clip(weights, open_clip_config=OPTIONS / "text_eos")
    c = clip_import.convert_open_clip(
        weights, open_clip_config=json.loads(config_file.read_text())["model_cfg"])
    assert a.model == b.model == c.model and a.model["text_encoder"]["eos_id"] == 3
    assert c.preprocess["resize_mode"] == "shortest"  # a bare model config: open_clip's default
    same = clip_import.convert_open_clip(OPTIONS / "text_eos", quick_gelu=False, vision_heads=2)
    assert same.model == a.model
    with pytest.raises(ConfigError, match=r"--quick_gelu=true contradicts the open_clip config's "
                                          r"quick_gelu = false \(open_clip_config.json of"):
        clip_import.convert_open_clip(OPTIONS / "text_eos", quick_gelu=True)
    with pytest.raises(ConfigError, match=r"--vision_heads=4 contradicts .* vision_cfg.head_width"
                                          r" = 16 \(2 heads\)"):
        clip_import.convert_open_clip(OPTIONS / "text_eos", vision_heads=4)
    with pytest.raises(ConfigError, match=r"two open_clip configs disagree \(\['text_cfg'\]\)"):
        clip_import.convert_open_clip(OPTIONS / "text_eos",
                                      open_clip_config=OPTIONS / "text_last")
    with pytest.raises(ConfigError, match=r"the checkpoint has a logit_bias .* no "
                                          r"init_logit_bias"):
        clip_import.convert_open_clip(OPTIONS / "siglip_text" / "open_clip_model.safetensors",
                                      open_clip_config=tiny_cfg(text={"proj_bias": True}))
    with pytest.raises(ConfigError, match=r"'text_projection.bias': .* says text_cfg.proj_bias "
                                          r"= false"):
        clip_import.convert_open_clip(OPTIONS / "siglip_text" / "open_clip_model.safetensors",
                                      open_clip_config=tiny_cfg(init_logit_bias=-5.0))
    with pytest.raises(ConfigError, match=r"is a JSON file: pass a config with "
                                          r"--open_clip_config"):
        clip_import.convert_open_clip(config_file)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "open_clip_config.json").write_text(config_file.read_text())
    with pytest.raises(ConfigError, match=r"no weight file \(open_clip_model.safetensors"):
        clip_import.convert_open_clip(empty)
    with pytest.raises(ConfigError, match=r"has no open_clip_config.json"):
        clip_import.convert_open_clip(tmp_path)


def _cache(root: pathlib.Path, repo: str, source: pathlib.Path) -> pathlib.Path:
    """A Hugging Face cache entry for ``repo`` holding ``source``'s files (symlinks, as the
    cache's snapshots point into blobs)."""
    folder = root / ("models--" + repo.replace("/", "--"))
    snapshot = folder / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("0123abc")
    for name in ("open_clip_config.json", "open_clip_model.safetensors"):
        os.symlink(source / name, snapshot / name)
    return snapshot


def test_hugging_face_cache_and_names_resolve_locally(tmp_path, monkeypatch):
    """hf-hub:ORG/NAME and a cache folder resolve in $HF_HUB_CACHE (else $HF_HOME/hub); a
    recorded name with a release whose files are not there says where to put them and which
    repository they come from; a release trained with another activation than its config is
    refused."""
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    snapshot = _cache(tmp_path / "hub", "someone/tiny-eos", OPTIONS / "text_eos")
    direct = clip_import.convert_open_clip(OPTIONS / "text_eos")
    for source in ("hf-hub:someone/tiny-eos", tmp_path / "hub" / "models--someone--tiny-eos",
                   snapshot):
        converted = clip_import.convert_open_clip(source)
        assert converted.model == direct.model
        assert all(np.array_equal(x, y) for x, y in zip(
            _leaves(converted.params), _leaves(direct.params), strict=True))
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert sources.hf_hub_cache() == str(tmp_path / "home" / "hub")
    with pytest.raises(ConfigError, match=r"hf-hub:someone/tiny-eos: the Hugging Face "
                                          r"repository someone/tiny-eos is not in the local "
                                          r"cache \(looked in .*home/hub/models--someone--"
                                          r"tiny-eos/snapshots/.*nothing is downloaded"):
        clip_import.convert_open_clip("hf-hub:someone/tiny-eos")
    with pytest.raises(ConfigError, match=r"no local weights for ViT-B-16-SigLIP release "
                                          r"'webli': looked for open_clip_model.safetensors .* in "
                                          r".*home/hub/models--timm--ViT-B-16-SigLIP/snapshots/"
                                          r".*Hugging Face repository timm/ViT-B-16-SigLIP"):
        clip_import.convert_open_clip(model="ViT-B-16-SigLIP", pretrained="webli")
    with pytest.raises(ConfigError, match=r"release ViT-B-32/openai was trained with quick_gelu "
                                          r"= true .* use the config 'ViT-B-32-quickgelu'"):
        clip_import.convert_open_clip(model="ViT-B-32", pretrained="openai")
    with pytest.raises(ConfigError, match=r"'ViT-B-32' has no pretrained release 'nope'"):
        clip_import.convert_open_clip(model="ViT-B-32", pretrained="nope")
    with pytest.raises(ConfigError, match=r"'ViT-B-33' is not one of open_clip 3.3.0's model "
                                          r"configs .* closest: \['ViT-B-32'"):
        clip_import.convert_open_clip(model="ViT-B-33")
    with pytest.raises(ConfigError, match=r"tensor 'visual.conv1.weight' has shape "
                                          r"\(32, 3, 4, 4\); the model block .* needs "
                                          r"\(768, 3, 32, 32\)"):  # the name's config, tiny weights
        clip_import.convert_open_clip(OPTIONS / "text_eos" / "open_clip_model.safetensors",
                                      model="ViT-B-32")


def _leaves(tree):
    if isinstance(tree, dict):
        return [leaf for key in sorted(tree, key=str) for leaf in _leaves(tree[key])]
    return [np.asarray(tree)]


def test_head_exceptions_come_from_the_recorded_configs():
    vision = dict(occ.head_exceptions("vision", 1280))
    assert vision["ViT-H-14"] == vision["ViT-H-14-worldwide"] == 16
    assert dict(occ.head_exceptions("vision", 1664))["ViT-bigG-14"] == 16
    assert dict(occ.head_exceptions("vision", 1408))["ViT-g-14"] == 16
    assert dict(occ.head_exceptions("vision", 1792))["ViT-e-14"] == 16
    assert occ.head_exceptions("vision", 768) == [] and occ.head_exceptions("text", 512) == []
    config = {"sample_encoder": {"width": 1280, "heads": 20, "activation": "gelu"},
              "text_encoder": {"width": 1024, "heads": 16}}
    text = clip_state_dict._assumptions(config, heads_given=(False, False),
                                    activation_from="given")
    assert "image heads = width // 64 = 20 (open_clip configs with a 1280-wide image tower " \
           "and 16 heads: ['ViT-H-14'" in text


def test_torchscript_archives_tell_their_activation():
    """The modules a TorchScript archive's data.pkl names (read as data, nothing runs): the
    scripted exact-GELU model is no longer read as QuickGELU."""
    gelu, quick = OPTIONS / "torchscript_gelu.pt", OPTIONS / "torchscript_quickgelu.pt"
    assert state_dict_files.is_torchscript(gelu) and state_dict_files.is_torchscript(quick)
    assert state_dict_files.torchscript_activation(gelu) == "gelu"
    assert state_dict_files.torchscript_activation(quick) == "quick_gelu"
    assert clip_state_dict._quick_gelu_from_name(str(gelu)) is False
    assert clip_state_dict._quick_gelu_from_name(str(quick)) is True
    assert clip_state_dict.bare_activation(str(gelu), None) == (
        "gelu", "read from the TorchScript archive's modules")
    assert state_dict_files.torchscript_activation(FIXTURES / "open_clip_tiny_gelu.npz") is None


def test_command_line_with_a_config(tmp_path, capsys):
    out = tmp_path / "out"
    assert clip_import.main([f"--checkpoint={OPTIONS / 'siglip_text'}", f"--output={out}"]) == 0
    printed = capsys.readouterr()
    assert "note: model.nonscalar_logit_scale = true: no effect at inference" in printed.out
    assert "wrote" in printed.out and "warning" not in printed.err
    model = json.loads((out / "model.json").read_text())
    assert model["text_encoder"]["activation"] == "gelu_tanh"
    assert model["text_projection"] == "linear_bias" and model["siglip"] is True
    assert json.loads((out / "preprocess.json").read_text())["resize_mode"] == "squash"
    assert clip_import.main([f"--checkpoint={OPTIONS / 'eps' / 'open_clip_model.safetensors'}",
                             f"--open_clip_config={OPTIONS / 'eps' / 'open_clip_config.json'}",
                             f"--output={tmp_path / 'eps'}"]) == 0
    assert json.loads((tmp_path / "eps" / "model.json").read_text())["sample_encoder"][
        "layer_norm_eps"] == 1e-6
    capsys.readouterr()
    bare = OPTIONS / "text_eos" / "open_clip_model.safetensors"
    assert clip_import.main([f"--checkpoint={bare}", f"--output={tmp_path / 'bare'}",
                             "--quick_gelu=false", "--vision_heads=2", "--text_heads=2"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("warning: converted from tensor shapes alone") and err.count("\n") == 1
    assert clip_import.main([f"--checkpoint={OPTIONS / 'eps'}", "--quick_gelu=false",
                             f"--output={tmp_path / 'no'}"]) == 2
    assert "error: --quick_gelu=false contradicts the open_clip config's quick_gelu = true" in \
        capsys.readouterr().err
    assert clip_import.main([f"--output={tmp_path / 'no'}"]) == 2
    assert "error: nothing to convert" in capsys.readouterr().err


def test_the_modules_run_without_jax():
    """model_configs, config_options, model_sources, timm_trunks and the docs page import only the
    standard library and contrastive_jax.errors (the fixture scripts run them where open_clip,
    not JAX, is installed): the package's parents as bare modules, nothing heavy imported."""
    import subprocess

    root = pathlib.Path(occ.__file__).parents[5]
    code = ("import sys, types\n"
            f"for name, path in {BARE_PACKAGES!r}.items():\n"
            "    module = types.ModuleType(name)\n"
            f"    module.__path__ = [{str(root)!r} + '/' + path]\n"
            "    sys.modules[name] = module\n"
            f"sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r})\n"
            "import open_clip_models_page\n"
            "open_clip_models_page.models_document()\n"
            "assert not {'jax', 'flax', 'numpy', 'torch'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


# the packages above the converters, as bare modules (their __init__ imports JAX)
BARE_PACKAGES = {"contrastive_jax": "contrastive_jax",
                 "contrastive_jax.training": "contrastive_jax/training",
                 "contrastive_jax.training.models": "contrastive_jax/training/models"}


def test_warnings_are_not_raised_for_configured_conversions():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clip_import.convert_open_clip(OPTIONS / "clipa")
