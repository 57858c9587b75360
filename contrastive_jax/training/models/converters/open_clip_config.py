"""open_clip's model configs as this project's ``dual_encoder`` model block: every option of
open_clip converted exactly or refused by name ([OpenCLIP], [timm], [SigLIP] in
docs/references.md; the table of open_clip's shipped configs: docs/open_clip_models.md).

An open_clip model is described by its model config (``model_cfg``: ``embed_dim``,
``vision_cfg``, ``text_cfg``, ``quick_gelu``, ...), the fields of open_clip's ``CLIPVisionCfg``
/ ``CLIPTextCfg`` and the keyword arguments of its ``CLIP``. :func:`model_block` turns one into
the ``model`` block that :func:`~contrastive_jax.training.models.build_model` builds, reading
everything the state dict's tensors do not show from the config: heads (``head_width``,
``heads``), the activation (``quick_gelu``, ``act_kwargs``), the LayerNorm epsilon
(``norm_kwargs``), the pooling (``pool_type``, ``eos_id``, ``final_ln_after_pool``), the causal
mask (``no_causal_mask``), ``ln_pre`` (``no_ln_pre``), the projections (``proj_bias``,
``proj_type``, ``timm_proj``), ``mlp_ratio``, the image size, and SigLIP's logit bias
(``init_logit_bias``). Each option is in exactly one of three tables:

* converted (:data:`VISION_CONVERTED`, :data:`TEXT_CONVERTED`, :data:`MODEL_CONVERTED`): the
  block computes what open_clip computes;
* no effect on the features at inference (:data:`VISION_NO_EFFECT`, :data:`TEXT_NO_EFFECT`,
  :data:`MODEL_NO_EFFECT`): training-only settings (dropout, patch dropout, stochastic depth),
  initial values the checkpoint replaces, the tokenizer (not part of the model), settings open_clip
  reads only together with another option; accepted, and listed in the notes when set;
* refused unless at open_clip's default (:data:`VISION_REFUSED`, :data:`TEXT_REFUSED`,
  :data:`MODEL_REFUSED`): a :class:`ConfigError` ``open_clip option vision_cfg.X = V is not
  supported (why; supported: ...)``.

An option open_clip does not know (not a field of its dataclasses) is refused too. A timm image
tower (``vision_cfg.timm_model_name``) is described by the timm model it names: the data
recorded from timm (:func:`timm_trunk`) or, for a model registered outside timm (a test
fixture), the ``timm_model_args`` its ``open_clip_config.json`` carries
(:func:`trunk_from_timm_args`). Only trunks the project's ViT computes exactly are converted:
timm ``VisionTransformer`` s as open_clip's SigLIP configs use them (no class or register
tokens, a learned position embedding, a patch convolution with bias, plain blocks, LayerNorm,
exact or tanh GELU, the final norm, timm's ``map`` attention-pool head, ``timm_pool="map"``,
``timm_proj="none"``).

Sources (:func:`resolve`): a model config (a mapping), a JSON file (``open_clip_config.json``
with ``model_cfg`` and ``preprocess_cfg``, or a plain model config), a hub-layout directory
(``open_clip_config.json`` + ``open_clip_model.safetensors`` / ``open_clip_pytorch_model.bin``),
a Hugging Face cache snapshot or repository folder, ``hf-hub:ORG/NAME`` (looked up in the local
cache: :func:`hf_hub_cache`), or the name of one of open_clip's shipped configs, recorded with
its releases (``pretrained`` tags: Hugging Face repository, ``quick_gelu``, pixels) in
``open_clip_models.json`` (:func:`recorded`; written by tests/fixtures/make_open_clip_models.py).
Nothing is downloaded: a source with no local file says where it looked and what to put there.

The module uses the standard library only (no JAX, no PyTorch), so the fixture scripts can run
it where open_clip is installed.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import os
from collections.abc import Mapping
from typing import Any

from contrastive_jax.errors import ConfigError

DATA_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "open_clip_models.json")
CONFIG_FILE = "open_clip_config.json"
# open_clip's preferred weight files of a hub directory, in its order (factory.py)
WEIGHT_FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.safetensors",
                "open_clip_pytorch_model.bin", "open_clip_pytorch_model.pth",
                "model.safetensors", "pytorch_model.bin", "pytorch_model.pth", "model.pth")
HEAD_WIDTH = 64  # CLIP's heads are width / 64 unless a config says otherwise
TORCH_LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default: open_clip's without norm_kwargs
TIMM_SUPPORTED = ("a timm VisionTransformer as open_clip's SigLIP configs use it: no class or "
                  "register tokens, a learned position embedding, one patch convolution with "
                  "bias, plain blocks (no LayerScale, qk-norm or gate), LayerNorm, exact or "
                  "tanh GELU, the final norm, the 'map' attention-pool head")

# --- the options ---------------------------------------------------------------------------------
# CLIPVisionCfg: open_clip's own VisionTransformer, or a timm trunk (timm_model_name)
VISION_CONVERTED = {
    "layers": "depth (an int; a list of 4 is a ModifiedResNet: refused)",
    "width": "width",
    "head_width": "heads = width // head_width",
    "mlp_ratio": "mlp_width = int(width * mlp_ratio), as open_clip computes it",
    "patch_size": "patch (square)",
    "image_size": "image_size (square, a multiple of the patch; with a timm trunk it must be "
                  "the trunk's)",
    "no_ln_pre": "pre_norm = not no_ln_pre",
    "pool_type": "'tok': pool 'token'; 'avg': pool 'mean' (the patch tokens); 'none' (no "
                 "pooling) refused",
    "final_ln_after_pool": "with 'avg': norm_after_pool (norm of the mean); with 'tok' the "
                           "same function (LayerNorm acts on each token)",
    "pos_embed_type": "'learnable' or 'sin_cos_2d' (fixed values, stored in the state dict "
                      "either way)",
    "act_kwargs": "the activation: nn.GELU(approximate='none') gelu, 'tanh' gelu_tanh",
    "norm_kwargs": "layer_norm_eps (its eps; other LayerNorm arguments refused)",
    "timm_model_name": "a timm trunk, converted when the project's ViT computes it "
                       "exactly",
    "timm_pool": "'map' (timm's attention-pool head) with a timm trunk",
    "timm_proj": "'none' with a timm trunk: sample_projection 'none'",
}
VISION_NO_EFFECT = {
    "patch_dropout": "training only (PatchDropout is the identity in evaluation)",
    "output_tokens": "the tower also returns its tokens; the pooled features are the same",
    "attn_pooler_queries": "read only with attentional_pool",
    "attn_pooler_heads": "read only with attentional_pool",
    "timm_model_pretrained": "timm's initial weights, which the checkpoint replaces",
    "timm_proj_bias": "read only with timm_proj 'linear' / 'mlp'",
    "timm_drop": "training only (dropout before the timm projection)",
    "timm_drop_path": "training only (stochastic depth)",
}
# option: (the values supported, what the option is); the custom block's options, both towers
CUSTOM_BLOCK_REFUSED = {
    "block_type": ((None, "default"), "open_clip's CustomResidualAttentionBlock"),
    "qk_norm": ((False,), "LayerNorm on queries and keys (open_clip's custom block)"),
    "scaled_cosine_attn": ((False,), "scaled cosine attention (open_clip's custom block)"),
    "scale_heads": ((False,), "per-head attention scales (open_clip's custom block)"),
    "scale_attn_inner": ((False,), "a LayerNorm inside the attention (custom block)"),
    "scale_attn": ((False,), "a LayerNorm after the attention (custom block)"),
    "scale_fc": ((False,), "a LayerNorm inside the MLP (custom block)"),
}
VISION_REFUSED = {
    "ls_init_value": ((None,), "LayerScale"),
    "attentional_pool": ((False,), "CoCa's attentional pooler"),
    **CUSTOM_BLOCK_REFUSED,
}
# CLIPTextCfg: open_clip's TextTransformer (an HF text tower is refused)
TEXT_CONVERTED = {
    "context_length": "max_tokens",
    "vocab_size": "vocab_size",
    "width": "width",
    "heads": "heads",
    "layers": "depth",
    "mlp_ratio": "mlp_width = int(width * mlp_ratio)",
    "no_causal_mask": "causal = not no_causal_mask",
    "pool_type": "pool: 'argmax', 'last', 'first', 'eos'; 'none' (no pooling) refused",
    "eos_id": "eos_id with pool_type 'eos' (read only then)",
    "proj_bias": "text_projection 'linear_bias' (an nn.Linear with bias)",
    "proj_type": "'linear': text_projection 'linear' / 'linear_bias'; 'none': 'none'",
    "act_kwargs": "the activation, as vision_cfg.act_kwargs",
    "norm_kwargs": "layer_norm_eps, as vision_cfg.norm_kwargs",
}
TEXT_NO_EFFECT = {
    "hf_tokenizer_name": "the tokenizer, not part of the model",
    "tokenizer_mode": "the tokenizer, not part of the model",
    "tokenizer_kwargs": "the tokenizer, not part of the model",
    "pad_id": "read only with embed_cls (CoCa's padding mask)",
    "final_ln_after_pool": "open_clip does not pass it to its TextTransformer (and LayerNorm "
                           "acts on each token, so for a selection pool it would not change "
                           "the result)",
    "output_tokens": "the tower also returns its tokens; the pooled features are the same",
    "hf_model_pretrained": "read only with hf_model_name",
    "hf_proj_type": "read only with hf_model_name",
    "hf_pooler_type": "read only with hf_model_name",
}
TEXT_REFUSED = {
    "hf_model_name": ((None, ""), "a Hugging Face transformers text tower"),
    "ls_init_value": ((None,), "LayerScale"),
    "embed_cls": ((False,), "CoCa's class token appended to the text"),
    **CUSTOM_BLOCK_REFUSED,
}
# the model config's top-level keys: CLIP's keyword arguments, and the factory's custom_text /
# multimodal_cfg
MODEL_CONVERTED = {
    "embed_dim": "embed_dim",
    "vision_cfg": "sample_encoder",
    "text_cfg": "text_encoder",
    "quick_gelu": "activation 'quick_gelu' of open_clip's own towers (timm trunks keep theirs)",
    "init_logit_scale": "init_temperature = exp(-init_logit_scale), replaced by the "
                        "checkpoint's logit_scale",
    "init_logit_bias": "siglip = True (a logit bias) with init_bias, replaced by the "
                       "checkpoint's logit_bias",
}
MODEL_NO_EFFECT = {
    "nonscalar_logit_scale": "logit_scale / logit_bias of shape (1,) instead of (): read as "
                             "scalars",
    "custom_text": "CustomTextCLIP keeps the text tower under 'text.': names only",
    "cast_dtype": "the compute precision (the converter reads float32)",
    "output_dict": "the output format of open_clip's forward",
}
MODEL_REFUSED = {
    "multimodal_cfg": ((None,), "CoCa's multimodal text decoder"),
}
TIMM_ACTIVATIONS = {"GELU(approximate='none')": "gelu", "GELU()": "gelu",
                    "GELU(approximate='tanh')": "gelu_tanh", "GELUTanh()": "gelu_tanh"}
# timm trunk classes that are not VisionTransformers: what they are
TIMM_FAMILIES = {
    "ConvNeXt": "a ConvNeXt (a convolutional network)",
    "Eva": "timm's Eva transformer (EVA / PE-Core: rotary position embeddings, SwiGLU or "
           "LayerScale blocks)",
    "FastVit": "MobileCLIP's FastViT (convolutional stages with re-parameterisable blocks)",
    "SwinTransformer": "a Swin transformer (shifted-window attention)",
    "VisionTransformerRelPos": "a ViT with relative position biases",
}


@functools.cache
def recorded() -> dict:
    """The recorded data (``open_clip_models.json``): ``open_clip_version``, ``fields`` (the
    defaults of ``CLIPVisionCfg``, ``CLIPTextCfg``, ``CLIP``'s arguments and
    ``PreprocessCfg``), ``models`` (name: ``model_cfg`` as shipped and ``pretrained``
    releases) and ``timm_models`` (timm name: the trunk, :func:`timm_trunk`)."""
    with open(DATA_FILE) as f:
        return json.load(f)


def model_names() -> list[str]:
    """The names of open_clip's shipped model configs (``ViT-B-32``, ``ViT-B-16-SigLIP``...)."""
    return sorted(recorded()["models"])


def _show(value: Any) -> str:
    """A config value as it reads in JSON."""
    try:
        return json.dumps(value)
    except TypeError:
        return repr(value)


def refusal(option: str, value: Any, why: str, supported: str) -> ConfigError:
    """``open_clip option OPTION = VALUE is not supported (WHY; supported: SUPPORTED)``."""
    why = f"{why}; " if why else ""
    return ConfigError(f"open_clip option {option} = {_show(value)} is not supported "
                       f"({why}supported: {supported})")


def _supported(values: tuple) -> str:
    return " or ".join(_show(v) for v in values)


def _check_fields(cfg: Mapping[str, Any], where: str, known: Mapping[str, Any],
                  converted: Mapping, no_effect: Mapping, refused: Mapping,
                  *, skip: tuple[str, ...] = ()) -> list[str]:
    """Unknown fields and refused values are a :class:`ConfigError`; the notes of the fields
    set to something other than open_clip's default that have no effect."""
    version = recorded()["open_clip_version"]
    notes = []
    for key, value in cfg.items():
        if key not in known:
            close = difflib.get_close_matches(key, list(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise refusal(f"{where}.{key}", value, f"not an option of open_clip {version}'s "
                          f"{where}{hint}", f"the fields {sorted(known)}")
        if key in skip:
            continue
        if key in refused and value not in refused[key][0]:
            raise refusal(f"{where}.{key}", value, refused[key][1],
                          _supported(refused[key][0]))
        if key in no_effect and value != known[key]:
            notes.append(f"{where}.{key} = {_show(value)}: no effect at inference "
                         f"({no_effect[key]})")
    return notes


def _activation(quick_gelu: bool, act_kwargs: Any, where: str) -> str:
    """open_clip's ``QuickGELU`` / ``nn.GELU(**act_kwargs)`` as an activation name."""
    if quick_gelu:
        if act_kwargs:
            raise refusal(f"{where}.act_kwargs", act_kwargs, "QuickGELU takes no arguments "
                          "(open_clip fails building it)", "null with quick_gelu = true")
        return "quick_gelu"
    kwargs = dict(act_kwargs or {})
    approximate = kwargs.pop("approximate", "none")
    if kwargs or approximate not in ("none", "tanh"):
        raise refusal(f"{where}.act_kwargs", act_kwargs, "arguments of torch.nn.GELU",
                      '{"approximate": "none"} (exact GELU) or {"approximate": "tanh"}')
    return "gelu" if approximate == "none" else "gelu_tanh"


def _layer_norm_eps(norm_kwargs: Any, where: str) -> float:
    kwargs = dict(norm_kwargs or {})
    eps = kwargs.pop("eps", TORCH_LAYER_NORM_EPS)
    if kwargs or not isinstance(eps, int | float) or isinstance(eps, bool) or eps <= 0:
        raise refusal(f"{where}.norm_kwargs", norm_kwargs, "arguments of torch.nn.LayerNorm",
                      '{"eps": a positive number} (an affine LayerNorm with bias)')
    return float(eps)


def _square(value: Any, option: str, what: str) -> int:
    """An int, or a pair of equal ints, as one int."""
    if isinstance(value, list | tuple) and len(value) == 2 and value[0] == value[1]:
        value = value[0]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise refusal(option, value, f"the ViT takes square {what}", "a positive int or "
                      "[n, n]")
    return value


def _heads(width: int, heads: Any, option: str, value: Any) -> int:
    if not isinstance(heads, int) or heads < 1 or width % heads:
        raise refusal(option, value, f"{heads} heads do not divide the width {width}",
                      "a head count that divides the width")
    return heads


def _mlp(tower: dict, width: int, ratio: Any, option: str) -> None:
    """``mlp_ratio`` / ``mlp_width`` of a tower block for open_clip's ``int(width * ratio)``."""
    if not isinstance(ratio, int | float) or isinstance(ratio, bool) or ratio <= 0:
        raise refusal(option, ratio, "the MLP's width ratio", "a positive number")
    hidden = int(width * ratio)
    tower["mlp_ratio"] = 4
    if hidden != 4 * width:
        tower["mlp_width"] = hidden


def _vision_own(cfg: dict, quick_gelu: bool) -> dict:
    """open_clip's ``VisionTransformer`` (``cfg``: every field, defaults filled in)."""
    w = "vision_cfg"
    layers = cfg["layers"]
    if isinstance(layers, list | tuple):
        raise refusal(f"{w}.layers", layers, "a list of stage depths is open_clip's "
                      "ModifiedResNet image tower (RN50 and the like)", "an int (open_clip's "
                      "VisionTransformer)")
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
        raise refusal(f"{w}.layers", layers, "the number of blocks", "a positive int")
    if cfg["pos_embed_type"] not in ("learnable", "sin_cos_2d"):
        raise refusal(f"{w}.pos_embed_type", cfg["pos_embed_type"], "open_clip raises on it",
                      '"learnable" or "sin_cos_2d"')
    if cfg["pool_type"] not in ("tok", "avg"):
        raise refusal(f"{w}.pool_type", cfg["pool_type"], "'none' returns every token, not "
                      "one feature vector", '"tok" or "avg"')
    width = cfg["width"]
    head_width = cfg["head_width"]
    if not isinstance(width, int) or not isinstance(head_width, int) or head_width < 1:
        raise refusal(f"{w}.head_width", head_width, "the heads' width", "a positive int")
    heads = _heads(width, width // head_width, f"{w}.head_width", head_width)
    size = _square(cfg["image_size"], f"{w}.image_size", "images")
    patch = _square(cfg["patch_size"], f"{w}.patch_size", "patches")
    if size % patch:
        raise refusal(f"{w}.image_size", cfg["image_size"], f"open_clip drops the last "
                      f"{size % patch} pixel rows and columns (not a multiple of the patch "
                      f"{patch})", "a multiple of the patch size")
    tower = {"name": "vit", "image_size": size, "patch": patch, "in_channels": 3,
             "width": width, "depth": layers, "heads": heads}
    _mlp(tower, width, cfg["mlp_ratio"], f"{w}.mlp_ratio")
    tower.update({
        "features": None,
        "activation": _activation(quick_gelu, cfg["act_kwargs"], w),
        "layer_norm_eps": _layer_norm_eps(cfg["norm_kwargs"], w),
        "class_token": True, "pre_norm": not cfg["no_ln_pre"],
        "pool": "token" if cfg["pool_type"] == "tok" else "mean", "patch_bias": False})
    if cfg["pool_type"] == "avg" and cfg["final_ln_after_pool"]:
        tower["norm_after_pool"] = True
    return tower


def _text(cfg: dict, quick_gelu: bool, embed_dim: int) -> tuple[dict, str]:
    """open_clip's ``TextTransformer``: ``(tower block, text_projection)``."""
    w = "text_cfg"
    if cfg["pool_type"] not in ("argmax", "last", "first", "eos"):
        raise refusal(f"{w}.pool_type", cfg["pool_type"], "'none' returns every position, not "
                      "one feature vector", '"argmax", "last", "first" or "eos"')
    if cfg["proj_type"] not in ("linear", "none"):
        raise refusal(f"{w}.proj_type", cfg["proj_type"], "open_clip reads anything but "
                      "'none' as a linear projection", '"linear" or "none"')
    width = cfg["width"]
    for key in ("width", "layers", "context_length", "vocab_size"):
        if not isinstance(cfg[key], int) or isinstance(cfg[key], bool) or cfg[key] < 1:
            raise refusal(f"{w}.{key}", cfg[key], "a size of the text tower", "a positive int")
    tower = {"name": "text_transformer", "vocab_size": cfg["vocab_size"],
             "max_tokens": cfg["context_length"], "width": width, "depth": cfg["layers"],
             "heads": _heads(width, cfg["heads"], f"{w}.heads", cfg["heads"])}
    _mlp(tower, width, cfg["mlp_ratio"], f"{w}.mlp_ratio")
    tower.update({
        "features": None,
        "activation": _activation(quick_gelu, cfg["act_kwargs"], w),
        "layer_norm_eps": _layer_norm_eps(cfg["norm_kwargs"], w),
        "causal": not cfg["no_causal_mask"], "pool": cfg["pool_type"]})
    if cfg["pool_type"] == "eos":
        if not isinstance(cfg["eos_id"], int) or isinstance(cfg["eos_id"], bool):
            raise refusal(f"{w}.eos_id", cfg["eos_id"], "the id pool_type 'eos' looks for",
                          "an int")
        tower["eos_id"] = cfg["eos_id"]
    if cfg["proj_type"] == "none":
        if width != embed_dim:
            raise refusal(f"{w}.proj_type", "none", f"without a projection the text features "
                          f"are {width} wide, not embed_dim {embed_dim}", '"linear", or a '
                          "text width equal to embed_dim")
        return tower, "none"
    return tower, "linear_bias" if cfg["proj_bias"] else "linear"


# --- timm trunks ----------------------------------------------------------------------------------

def timm_trunk(name: str) -> dict | None:
    """The recorded description of the timm model ``name`` (None when not recorded):
    ``class``, and for a ``VisionTransformer`` ``img_size``, ``patch_embed`` (class),
    ``patch_conv``, ``embed_dim``, ``depth``, ``block`` (heads, MLP, norms, activation,
    biases, LayerScale...), ``class_token``, ``reg_tokens``, ``pos_embed``, ``pre_norm``,
    ``final_norm``, ``fc_norm``, ``global_pool``, ``attn_pool`` (tests/fixtures/
    make_open_clip_models.py reads them from the model timm builds)."""
    return recorded()["timm_models"].get(name)


# timm VisionTransformer's constructor arguments that trunk_from_timm_args reads, with timm's
# defaults; dropout / init arguments have no effect on the forward pass at inference
_TIMM_VIT_ARGS = {
    "img_size": 224, "patch_size": 16, "in_chans": 3, "num_classes": 1000,
    "global_pool": "token", "embed_dim": 768, "depth": 12, "num_heads": 12, "mlp_ratio": 4.0,
    "qkv_bias": True, "qk_norm": False, "scale_attn_norm": False, "scale_mlp_norm": False,
    "proj_bias": True, "init_values": None, "class_token": True, "pos_embed": "learn",
    "no_embed_class": False, "reg_tokens": 0, "pre_norm": False, "final_norm": True,
    "fc_norm": None, "pool_include_prefix": False, "dynamic_img_size": False,
    "dynamic_img_pad": False, "act_layer": None, "norm_layer": None,
}
_TIMM_TRAINING_ARGS = ("drop_rate", "pos_drop_rate", "patch_drop_rate", "proj_drop_rate",
                       "attn_drop_rate", "drop_path_rate", "weight_init", "fix_init")


def trunk_from_timm_args(args: Mapping[str, Any]) -> dict:
    """The trunk description (as :func:`timm_trunk`) of ``timm.models.vision_transformer.
    VisionTransformer(**args)``, worked out from timm's constructor (timm 1.0: LayerNorm eps
    1e-6, ``nn.GELU`` unless ``act_layer='gelu_tanh'``, the patch convolution's bias off with
    ``pre_norm``, fc_norm with the average pools, ``AttentionPoolLatent`` with the tower's
    heads, MLP ratio, norm and activation for ``global_pool='map'``). For a timm model that is
    registered outside timm (``timm_model_args`` of a test fixture's ``open_clip_config.json``);
    an argument it does not know is a :class:`ConfigError`."""
    unknown = sorted(set(args) - set(_TIMM_VIT_ARGS) - set(_TIMM_TRAINING_ARGS))
    if unknown:
        raise ConfigError(f"timm_model_args {unknown} are not read by this converter; it reads "
                          f"{sorted(_TIMM_VIT_ARGS)} (and ignores the dropout / init "
                          f"arguments {list(_TIMM_TRAINING_ARGS)})")
    a = {**_TIMM_VIT_ARGS, **args}
    if a["act_layer"] not in (None, "gelu", "gelu_tanh") or a["norm_layer"] is not None:
        raise ConfigError(f"timm_model_args act_layer = {_show(a['act_layer'])}, norm_layer = "
                          f"{_show(a['norm_layer'])}: only the defaults (LayerNorm eps 1e-6, "
                          "GELU) or act_layer 'gelu_tanh' are read")
    act = "GELUTanh()" if a["act_layer"] == "gelu_tanh" else "GELU(approximate='none')"
    norm = {"class": "LayerNorm", "eps": 1e-6, "affine": True, "bias": True}
    none = {"class": "Identity"}
    pair = lambda v: list(v) if isinstance(v, list | tuple) else [v, v]  # noqa: E731
    width, heads = a["embed_dim"], a["num_heads"]
    hidden = int(width * a["mlp_ratio"])
    mlp = {"class": "Mlp", "hidden": hidden, "act": act, "norm": none, "bias": [True, True]}
    patch = pair(a["patch_size"])
    size = pair(a["img_size"])
    prefix = int(bool(a["class_token"])) + a["reg_tokens"]
    grid = (size[0] // patch[0]) * (size[1] // patch[1])
    fc_norm = a["global_pool"] in ("avg", "avgmax", "max") if a["fc_norm"] is None \
        else a["fc_norm"]
    return {
        "class": "VisionTransformer", "img_size": size, "patch_embed": "PatchEmbed",
        "patch_size": patch,
        "patch_conv": {"kernel": patch, "stride": patch, "padding": [0, 0],
                       "bias": not a["pre_norm"], "in_chans": a["in_chans"]},
        "patch_norm": none, "dynamic_img_pad": a["dynamic_img_pad"], "embed_dim": width,
        "depth": a["depth"], "blocks_differ": False,
        "block": {"class": "Block", "attn_class": "Attention", "heads": heads,
                  "head_dim": width // heads, "attn_scale": (width // heads) ** -0.5,
                  "qkv": "fused", "qkv_bias": a["qkv_bias"], "qk_norm": a["qk_norm"],
                  "attn_norm": a["scale_attn_norm"], "attn_gate": False,
                  "proj_bias": a["proj_bias"], "layer_scale": a["init_values"] is not None,
                  "norm1": norm, "norm2": norm,
                  "mlp": {**mlp, "norm": norm if a["scale_mlp_norm"] else none}},
        "class_token": bool(a["class_token"]), "reg_tokens": a["reg_tokens"],
        "no_embed_class": a["no_embed_class"],
        "pos_embed": None if a["pos_embed"] in ("", "none") else
        [1, grid + (0 if a["no_embed_class"] else prefix), width],
        "dynamic_img_size": a["dynamic_img_size"],
        "pre_norm": norm if a["pre_norm"] else none,
        "final_norm": norm if a["final_norm"] and not fc_norm else none,
        "fc_norm": norm if a["final_norm"] and fc_norm else none,
        "global_pool": a["global_pool"], "pool_include_prefix": a["pool_include_prefix"],
        "num_classes": a["num_classes"],
        "attn_pool": None if a["global_pool"] != "map" else {
            "class": "AttentionPoolLatent", "latent_len": 1, "latent_dim": width,
            "heads": heads, "q_proj": True, "qkv_bias": True, "qk_norm": False,
            "pos_embed": False, "pool": "token", "out_proj": True, "norm": norm, "mlp": mlp},
    }


def _timm_vision(cfg: dict, trunk: Mapping[str, Any], embed_dim: int) -> dict:
    """A timm trunk (``cfg``: vision_cfg with defaults; ``trunk``: its description) as a
    ``vit`` block, or the :class:`ConfigError` naming what the ViT does not compute."""
    name = cfg["timm_model_name"]
    option = "vision_cfg.timm_model_name"

    def no(what: str):
        return refusal(option, name, what, TIMM_SUPPORTED)

    cls = trunk.get("class")
    if cls != "VisionTransformer":
        raise no(TIMM_FAMILIES.get(cls, f"a timm {cls}, not a VisionTransformer"))
    if trunk["patch_embed"] != "PatchEmbed":
        raise no(f"its patch embedding is a {trunk['patch_embed']} (a convolutional stem), not "
                 "one patch convolution")
    if trunk["reg_tokens"]:
        raise no(f"{trunk['reg_tokens']} register tokens")
    if trunk["class_token"]:
        raise no("a class token (timm's CLIP-style ViT; the converter takes open_clip's own "
                 "VisionTransformer for that)")
    block = trunk["block"]
    norms = [block["norm1"], block["norm2"], trunk["final_norm"]]
    checks = [
        (trunk["pos_embed"] is None, "no position embedding"),
        (trunk["dynamic_img_size"] or trunk["dynamic_img_pad"],
         "dynamic image sizes (position embeddings resampled per input)"),
        (trunk["pre_norm"]["class"] != "Identity", "a LayerNorm before the blocks (norm_pre)"),
        (trunk.get("blocks_differ", False), "blocks that differ from one another"),
        (block["class"] != "Block" or block["attn_class"] != "Attention",
         f"{block['class']} blocks with {block['attn_class']} attention"),
        (block["mlp"]["class"] != "Mlp", f"a {block['mlp']['class']} MLP (gated)"),
        (block["layer_scale"], "LayerScale"),
        (block["qk_norm"], "qk-norm"),
        (block["attn_norm"] or block["mlp"]["norm"]["class"] != "Identity",
         "extra LayerNorms in the attention or MLP"),
        (block["attn_gate"], "a gated attention"),
        (not block["qkv_bias"] or not block["proj_bias"] or block["mlp"]["bias"] != [True, True],
         "projections without bias"),
        (not math.isclose(block["attn_scale"], block["head_dim"] ** -0.5, rel_tol=1e-12),
         "an attention scale other than 1 / sqrt(head width)"),
        (trunk["fc_norm"]["class"] != "Identity", "a norm after the pooling (fc_norm)"),
        (trunk["final_norm"]["class"] == "Identity", "no final norm"),
        (any(n["class"] != "LayerNorm" or not n.get("affine", True) or not n.get("bias", True)
             for n in norms), f"{block['norm1']['class']} norms (not an affine LayerNorm with "
                              "bias)"),
        (trunk["global_pool"] != "map" or trunk["attn_pool"] is None,
         f"global_pool {trunk['global_pool']!r} (the ViT pools with the 'map' head)"),
    ]
    for failed, what in checks:
        if failed:
            raise no(what)
    conv = trunk["patch_conv"] or {}
    patch = trunk["patch_size"]
    if not (patch[0] == patch[1] and conv.get("kernel") == patch and conv.get("stride") == patch
            and conv.get("padding") in ([0, 0], 0, "valid") and conv.get("bias")):
        raise no(f"a patch convolution {conv} other than one {patch} kernel with bias at "
                 "stride = kernel")
    pool = trunk["attn_pool"]
    act = TIMM_ACTIVATIONS.get(block["mlp"]["act"])
    if act is None:
        raise no(f"the activation {block['mlp']['act']}")
    eps = block["norm1"]["eps"]
    if any(n.get("eps") != eps for n in (*norms, pool["norm"])):
        raise no("LayerNorms with different epsilons")
    width, heads, hidden = trunk["embed_dim"], block["heads"], block["mlp"]["hidden"]
    if (pool["class"] != "AttentionPoolLatent" or pool["latent_len"] != 1
            or pool["latent_dim"] != width or not pool["q_proj"] or not pool["qkv_bias"]
            or pool["qk_norm"] or pool["pos_embed"] or pool["pool"] != "token"
            or not pool["out_proj"] or pool["heads"] != heads or pool["mlp"] is None
            or pool["mlp"]["hidden"] != hidden or pool["mlp"]["act"] != block["mlp"]["act"]
            or pool["norm"]["class"] != "LayerNorm"):
        raise no(f"an attention-pool head {pool} other than timm's AttentionPoolLatent with "
                 "one latent query and the tower's heads, MLP, norm and activation")
    size = trunk["img_size"]
    if size[0] != size[1]:
        raise no(f"non-square images {size}")
    if size[0] % patch[0]:
        raise no(f"{size[0]}-pixel images, not a multiple of the patch {patch[0]}: timm's "
                 f"patch convolution drops the last {size[0] % patch[0]} pixel rows and "
                 "columns, which the ViT does not (open_clip's '-378' configs are the "
                 "corrected SO400M/14 models)")
    if _square(cfg["image_size"], "vision_cfg.image_size", "images") != size[0]:
        raise refusal("vision_cfg.image_size", cfg["image_size"], f"the timm trunk {name!r} "
                      f"is built for {size[0]} pixels (open_clip's TimmModel uses the trunk's "
                      "size; set_input_size is not converted)", _show(size[0]))
    if cfg["timm_pool"] != "map":
        raise refusal("vision_cfg.timm_pool", cfg["timm_pool"], "the trunk's pooling as "
                      "open_clip rebuilds it", '"map" (timm\'s attention-pool head)')
    if cfg["timm_proj"] != "none":
        raise refusal("vision_cfg.timm_proj", cfg["timm_proj"], "open_clip's head after the "
                      "timm trunk", '"none" (the trunk\'s features are the embedding)')
    if width != embed_dim:
        raise refusal("embed_dim", embed_dim, f"with timm_proj 'none' the image features are "
                      f"the trunk's {width} wide", _show(width))
    tower = {"name": "vit", "image_size": size[0], "patch": patch[0],
             "in_channels": conv.get("in_chans", 3), "width": width, "depth": trunk["depth"],
             "heads": heads, "mlp_ratio": 4}
    if hidden != 4 * width:
        tower["mlp_width"] = hidden
    tower.update({"features": None, "activation": act, "layer_norm_eps": float(eps),
                  "class_token": False, "pre_norm": False, "pool": "map", "patch_bias": True})
    return tower


# --- the model block ------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Block:
    """The ``model`` block of an open_clip config and what the conversion noted: the options
    set that have no effect at inference (``notes``), the tokenizer open_clip uses
    (``tokenizer``: ``hf_tokenizer_name``, None for CLIP's BPE)."""

    model: dict
    notes: tuple[str, ...]
    tokenizer: str | None


def model_block(model_cfg: Mapping[str, Any], *,
                timm_args: Mapping[str, Any] | None = None) -> Block:
    """The ``dual_encoder`` block computing what open_clip's model of ``model_cfg`` computes
    (the module docstring; a refused option is a :class:`ConfigError` naming it).

    ``timm_args``: the constructor arguments of a timm trunk that is not in the recorded data
    (``timm_model_args`` of a fixture's ``open_clip_config.json``,
    :func:`trunk_from_timm_args`). ``init_temperature`` / ``init_bias`` come from
    ``init_logit_scale`` / ``init_logit_bias``; a converter replaces them with the
    checkpoint's values.
    """
    if not isinstance(model_cfg, Mapping):
        raise ConfigError(f"an open_clip model config is a JSON object; got {_show(model_cfg)}")
    fields = recorded()["fields"]
    top_known = {**{k: v for k, v in fields["model"].items()},
                 "custom_text": False, "multimodal_cfg": None}
    for key in ("embed_dim", "vision_cfg", "text_cfg"):
        if key not in model_cfg:
            raise ConfigError(f"the open_clip model config has no {key!r} (it has "
                              f"{sorted(model_cfg)}); an open_clip model config has "
                              "embed_dim, vision_cfg and text_cfg")
    notes = _check_fields(model_cfg, "model", top_known, MODEL_CONVERTED, MODEL_NO_EFFECT,
                          MODEL_REFUSED)
    vision_in, text_in = model_cfg["vision_cfg"], model_cfg["text_cfg"]
    for key, value in (("vision_cfg", vision_in), ("text_cfg", text_in)):
        if not isinstance(value, Mapping):
            raise refusal(key, value, "a JSON object of open_clip's fields", "an object")
    timm_name = vision_in.get("timm_model_name")
    vision = {**fields["vision_cfg"], **vision_in}
    text = {**fields["text_cfg"], **text_in}
    quick_gelu = bool(model_cfg.get("quick_gelu", False))
    embed_dim = model_cfg["embed_dim"]
    if not isinstance(embed_dim, int) or isinstance(embed_dim, bool) or embed_dim < 1:
        raise refusal("embed_dim", embed_dim, "the embedding width", "a positive int")
    if timm_name:  # open_clip's TimmModel reads only the timm_* fields, patch_dropout, size
        read = ("timm_model_name", "timm_pool", "timm_proj", "image_size")
        notes += _check_fields(vision_in, "vision_cfg", fields["vision_cfg"], VISION_CONVERTED,
                               {**VISION_NO_EFFECT, **{k: "not read with a timm trunk" for k in
                                                       fields["vision_cfg"] if k not in read
                                                       and k not in VISION_NO_EFFECT}},
                               {}, skip=read)
        trunk = (trunk_from_timm_args(timm_args) if timm_args is not None
                 else timm_trunk(timm_name))
        if trunk is None:
            known = sorted(recorded()["timm_models"])
            raise refusal("vision_cfg.timm_model_name", timm_name,
                          f"the recorded data (timm {recorded()['timm_version']}) does not "
                          "describe this timm model, and its open_clip_config.json has no "
                          "timm_model_args", f"{TIMM_SUPPORTED}; recorded: {known}")
        sample = _timm_vision(vision, trunk, embed_dim)
        sample_projection = "none"
    else:
        notes += _check_fields(vision_in, "vision_cfg", fields["vision_cfg"], VISION_CONVERTED,
                               VISION_NO_EFFECT, VISION_REFUSED)
        sample = _vision_own(vision, quick_gelu)
        sample_projection = "linear"
    notes += _check_fields(text_in, "text_cfg", fields["text_cfg"], TEXT_CONVERTED,
                           TEXT_NO_EFFECT, TEXT_REFUSED)
    text_tower, text_projection = _text(text, quick_gelu, embed_dim)
    scale = model_cfg.get("init_logit_scale", fields["model"]["init_logit_scale"])
    if not isinstance(scale, int | float) or isinstance(scale, bool):
        raise refusal("init_logit_scale", scale, "the initial log logit scale", "a number")
    block = {"name": "dual_encoder", "sample_encoder": sample, "text_encoder": text_tower,
             "embed_dim": embed_dim, "init_temperature": math.exp(-float(scale))}
    if sample_projection != "linear":
        block["sample_projection"] = sample_projection
    if text_projection != "linear":
        block["text_projection"] = text_projection
    bias = model_cfg.get("init_logit_bias")
    if bias is not None:
        if not isinstance(bias, int | float) or isinstance(bias, bool):
            raise refusal("init_logit_bias", bias, "SigLIP's initial logit bias", "a number")
        block["siglip"] = True
        block["init_bias"] = float(bias)
    tokenizer = text.get("hf_tokenizer_name") or None
    return Block(block, tuple(notes), tokenizer)


def verdict(name: str) -> tuple[dict | None, str]:
    """``(model block, summary)`` of the recorded config ``name`` when it converts, else
    ``(None, the refusal's message)``."""
    try:
        block = model_block(recorded_model(name)["model_cfg"]).model
    except ConfigError as err:
        return None, str(err)
    return block, describe(block)


def describe(block: Mapping[str, Any]) -> str:
    """One line: the towers of a ``dual_encoder`` block."""
    v, t = block["sample_encoder"], block["text_encoder"]
    vision = (f"{'timm ' if v['pool'] == 'map' else ''}ViT {v['image_size']}px/{v['patch']}, "
              f"{v['width']} x {v['depth']}, {v['heads']} heads, pool {v['pool']}"
              f"{' + norm' if v.get('norm_after_pool') else ''}"
              f"{'' if v['pre_norm'] or v['pool'] == 'map' else ', no ln_pre'}")
    eos = f" (id {t['eos_id']})" if t["pool"] == "eos" else ""
    text = (f"text {t['width']} x {t['depth']}, {t['heads']} heads, pool {t['pool']}{eos}"
            f"{'' if t['causal'] else ', no causal mask'}")
    acts = sorted({v["activation"], t["activation"]})
    eps = sorted({v["layer_norm_eps"], t["layer_norm_eps"]})
    extra = [f"{'/'.join(acts)}", f"eps {'/'.join(f'{e:g}' for e in eps)}"]
    if block.get("text_projection", "linear") != "linear":
        extra.append(f"text projection {block['text_projection']}")
    if block.get("siglip"):
        extra.append("logit bias")
    return f"{vision}; {text}; {', '.join(extra)}"


# --- sources: files, hub directories, the Hugging Face cache, names -------------------------------

@dataclasses.dataclass(frozen=True)
class Source:
    """An open_clip model config and where it came from: ``model_cfg``; ``preprocess_cfg``
    (open_clip's ``PreprocessCfg`` fields the source gives, or None); ``weights``: the weight
    file when the source has one; ``directory``: the hub directory (its tokenizer files);
    ``origin``: for messages; ``timm_args``: a fixture's ``timm_model_args``; ``name`` and
    ``release``: a recorded config's name and pretrained release."""

    model_cfg: dict | None
    preprocess_cfg: dict | None
    weights: str | None
    directory: str | None
    origin: str
    timm_args: dict | None = None
    name: str | None = None
    release: dict | None = None


def recorded_model(name: str) -> dict:
    """The recorded entry of open_clip's config ``name`` (``model_cfg``, ``pretrained``); an
    unknown name is a :class:`ConfigError` with the closest names."""
    models = recorded()["models"]
    if name not in models:
        close = difflib.get_close_matches(name, list(models), n=5)
        raise ConfigError(f"{name!r} is not one of open_clip {recorded()['open_clip_version']}'s "
                          f"model configs (recorded in {os.path.basename(DATA_FILE)}); closest: "
                          f"{close}; see docs/open_clip_models.md")
    return models[name]


def hf_hub_cache() -> str:
    """The Hugging Face hub cache: ``$HF_HUB_CACHE``, else ``$HUGGINGFACE_HUB_CACHE``, else
    ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else
    ``~/.cache/huggingface/hub`` (huggingface_hub's order)."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(variable):
            return os.path.expanduser(os.environ[variable])
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "huggingface")
    return os.path.join(os.path.expanduser(home), "hub")


def cache_folder(repo_id: str, cache: str | None = None) -> str:
    """``CACHE/models--ORG--NAME``: where the cache keeps the repository ``repo_id``."""
    return os.path.join(cache or hf_hub_cache(), "models--" + repo_id.replace("/", "--"))


def cache_snapshot(folder: str) -> str | None:
    """The snapshot directory of a cache repository folder: the one ``refs/main`` names, else
    the only one; None when there is none; several without ``refs/main`` are a
    :class:`ConfigError` listing them."""
    snapshots = os.path.join(folder, "snapshots")
    if not os.path.isdir(snapshots):
        return None
    ref = os.path.join(folder, "refs", "main")
    if os.path.isfile(ref):
        with open(ref) as f:
            revision = f.read().strip()
        if os.path.isdir(os.path.join(snapshots, revision)):
            return os.path.join(snapshots, revision)
    revisions = sorted(os.listdir(snapshots))
    if len(revisions) == 1:
        return os.path.join(snapshots, revisions[0])
    if revisions:
        raise ConfigError(f"{folder} holds {len(revisions)} snapshots {revisions} and no "
                          "refs/main: pass the snapshot directory itself")
    return None


def _weights_in(directory: str, preferred: str | None = None) -> str | None:
    names = ((preferred,) if preferred else ()) + WEIGHT_FILES
    for name in names:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    return None


def read_config_file(path: str | os.PathLike) -> Source:
    """A JSON file: an ``open_clip_config.json`` (``model_cfg``, ``preprocess_cfg``,
    optionally a fixture's ``timm_model_args``) or a plain model config."""
    path = os.fspath(path)
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as err:
        raise ConfigError(f"cannot read the open_clip config {path!r} ({err})") from None
    except ValueError as err:
        raise ConfigError(f"{path!r} is not valid JSON ({err})") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path!r} holds a JSON {type(data).__name__}, not an open_clip "
                          "config object")
    if "model_cfg" in data:
        return Source(dict(data["model_cfg"]), data.get("preprocess_cfg"), None, None, path,
                      timm_args=data.get("timm_model_args"))
    if "embed_dim" in data and "vision_cfg" in data:
        return Source(dict(data), None, None, None, path)
    raise ConfigError(f"{path!r} is neither an open_clip_config.json (with 'model_cfg') nor an "
                      f"open_clip model config (embed_dim, vision_cfg, text_cfg); its keys: "
                      f"{sorted(data)}")


def read_directory(path: str | os.PathLike) -> Source:
    """A hub-layout directory (``open_clip_config.json`` and a weight file, open_clip's
    ``local-dir:``), a cache snapshot (the same files) or a cache repository folder
    (``models--ORG--NAME``: its snapshot)."""
    path = os.fspath(path)
    config = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(config):
        snapshot = cache_snapshot(path)
        if snapshot is not None:
            return read_directory(snapshot)
        raise ConfigError(f"directory {path!r} has no {CONFIG_FILE} (a Hugging Face hub "
                          f"directory of an open_clip model has one, beside "
                          f"{' or '.join(WEIGHT_FILES[:3])})")
    source = read_config_file(config)
    return dataclasses.replace(source, weights=_weights_in(path), directory=path,
                               origin=f"{CONFIG_FILE} of {path}")


def _normalise_tag(tag: str) -> str:
    return tag.lower().replace("-", "_")  # open_clip's _clean_tag


def read_name(name: str, pretrained: str | None = None, *,
              need_weights: bool = True) -> Source:
    """A recorded config by name and, with ``pretrained``, its release: its pixels, and its
    weights from the local Hugging Face cache (``need_weights``: a missing file is a
    :class:`ConfigError` saying where to put it)."""
    entry = recorded_model(name)
    model_cfg = json.loads(json.dumps(entry["model_cfg"]))
    origin = f"open_clip {recorded()['open_clip_version']}'s config {name!r}"
    if pretrained is None:
        return Source(model_cfg, None, None, None, origin, name=name)
    releases = entry["pretrained"]
    tag = _normalise_tag(pretrained)
    if tag not in releases:
        raise ConfigError(f"{name!r} has no pretrained release {pretrained!r} in open_clip "
                          f"{recorded()['open_clip_version']}; its releases: "
                          f"{sorted(releases) or 'none'}")
    release = releases[tag]
    if bool(model_cfg.get("quick_gelu", False)) != release["quick_gelu"]:
        other = name.removesuffix("-quickgelu") if name.endswith("-quickgelu") \
            else f"{name}-quickgelu"
        raise ConfigError(
            f"release {name}/{tag} was trained with quick_gelu = "
            f"{_show(release['quick_gelu'])} but the config {name!r} has quick_gelu = "
            f"{_show(bool(model_cfg.get('quick_gelu', False)))} (open_clip only warns and "
            f"builds the wrong activation): use the config {other!r}")
    preprocess = {k: release[k] for k in ("mean", "std", "interpolation", "resize_mode")
                  if release.get(k) is not None}
    origin = f"{origin}, release {tag!r}"
    weights, directory = None, None
    if release.get("hf_repo"):
        folder = cache_folder(release["hf_repo"])
        snapshot = cache_snapshot(folder)
        if snapshot is not None:
            weights = _weights_in(snapshot, release.get("hf_file"))
            directory = snapshot
    if weights is None and need_weights:
        raise ConfigError(_where_to_put(name, tag, release))
    return Source(model_cfg, preprocess, weights, directory, origin, name=name,
                  release=release)


def _where_to_put(name: str, tag: str, release: Mapping[str, Any]) -> str:
    files = " or ".join(([release["hf_file"]] if release.get("hf_file") else [])
                        + list(WEIGHT_FILES[:3]))
    if release.get("hf_repo"):
        folder = cache_folder(release["hf_repo"])
        return (f"no local weights for {name} release {tag!r}: looked for {files} in "
                f"{folder}/snapshots/<revision>/ (the Hugging Face cache: $HF_HUB_CACHE, "
                f"$HF_HOME/hub or ~/.cache/huggingface/hub); nothing is downloaded. Put the "
                f"Hugging Face repository {release['hf_repo']} there (e.g. `huggingface-cli "
                f"download {release['hf_repo']}` where there is network, then copy the cache) "
                "or pass its files with --checkpoint=FILE or DIR")
    where = f" (published at {release['url']})" if isinstance(release.get("url"), str) else ""
    return (f"no local weights for {name} release {tag!r}{where}: it is not on the Hugging "
            "Face hub; nothing is downloaded: pass the file with --checkpoint=FILE")


def resolve(source: str | os.PathLike | Mapping[str, Any], *,
            pretrained: str | None = None) -> Source:
    """The :class:`Source` of ``source``: a model config (mapping), a JSON file, a
    hub-layout directory / cache snapshot / cache repository folder, ``hf-hub:ORG/NAME``
    (the local cache), or a recorded name (with ``pretrained``: a release; its weights from
    the cache). Anything else is a :class:`ConfigError` saying what was looked for."""
    if isinstance(source, Mapping):
        data = dict(source)
        if "model_cfg" in data:
            return Source(dict(data["model_cfg"]), data.get("preprocess_cfg"), None, None,
                          "the given open_clip config", timm_args=data.get("timm_model_args"))
        return Source(data, None, None, None, "the given open_clip model config")
    text = os.fspath(source)
    if pretrained is not None and text not in recorded()["models"]:
        raise ConfigError(f"pretrained={pretrained!r} names a release of a recorded open_clip "
                          f"model; {text!r} is not a recorded model name")
    if text.startswith("hf-hub:"):
        repo = text.removeprefix("hf-hub:").strip("/")
        folder = cache_folder(repo)
        snapshot = cache_snapshot(folder)
        if snapshot is None:
            raise ConfigError(f"{text}: the Hugging Face repository {repo} is not in the local "
                              f"cache (looked in {folder}/snapshots/; $HF_HUB_CACHE, "
                              f"$HF_HOME/hub or ~/.cache/huggingface/hub); nothing is "
                              f"downloaded: `huggingface-cli download {repo}` where there is "
                              "network, then copy the cache, or pass the directory")
        return read_directory(snapshot)
    if os.path.isdir(text):
        return read_directory(text)
    if os.path.isfile(text) and text.endswith(".json"):
        return read_config_file(text)
    if text in recorded()["models"]:
        return read_name(text, pretrained)
    if os.path.isfile(text):
        return Source(None, None, text, None, text)
    close = difflib.get_close_matches(text, model_names(), n=3)
    raise ConfigError(f"{text!r} is not a file, a directory, hf-hub:ORG/NAME or one of open_clip "
                      f"{recorded()['open_clip_version']}'s model names (closest: {close}; "
                      "docs/open_clip_models.md lists them)")


def preprocess(source: Source, image_size: int) -> dict:
    """The ``preprocess.json`` fields (``data.preprocess``: ``mean``, ``std``, ``resize``,
    ``resize_mode``, ``image_size``) of a source: its ``preprocess_cfg`` over open_clip's
    ``PreprocessCfg`` defaults (CLIP's mean and std, bicubic, ``shortest``); the size is the
    model's (open_clip sets it from the image tower)."""
    cfg = {**recorded()["fields"]["preprocess_cfg"],
           **{k: v for k, v in (source.preprocess_cfg or {}).items() if v is not None}}
    return {"mean": [float(v) for v in cfg["mean"]], "std": [float(v) for v in cfg["std"]],
            "resize": cfg["interpolation"], "resize_mode": cfg["resize_mode"],
            "image_size": image_size}


def state_dict_digest(shapes: Mapping[str, Any]) -> str:
    """SHA-256 of the sorted lines ``name:d1,d2,...`` of a state dict's ``{name: shape}``,
    the ``text.`` prefix (open_clip's ``CustomTextCLIP``) removed: recorded for every
    converted config (``models[name]["state_dict"]``) to compare with the tensors the
    converter's rules read."""
    import hashlib

    lines = sorted(f"{name.removeprefix('text.')}:{','.join(str(int(d)) for d in shape)}"
                   for name, shape in shapes.items())
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


# --- what bare state dicts cannot tell ------------------------------------------------------------

def head_exceptions(tower: str, width: int) -> list[tuple[str, int]]:
    """``[(config name, heads)]`` of the recorded configs whose own ``tower`` (``"vision"`` or
    ``"text"``) of width ``width`` does not have ``width // 64`` heads."""
    out = []
    for name, entry in sorted(recorded()["models"].items()):
        cfg = entry["model_cfg"].get(f"{tower}_cfg", {})
        if tower == "vision" and (cfg.get("timm_model_name")
                                  or isinstance(cfg.get("layers"), list)):
            continue
        if tower == "text" and cfg.get("hf_model_name"):
            continue
        fields = recorded()["fields"][f"{tower}_cfg"]
        if cfg.get("width", fields["width"]) != width:
            continue
        heads = (width // cfg.get("head_width", fields["head_width"]) if tower == "vision"
                 else cfg.get("heads", fields["heads"]))
        if heads != width // HEAD_WIDTH:
            out.append((name, heads))
    return out


HIDDEN_SETTINGS = {
    "text pool_type 'eos' (the eos_id position)":
        lambda m: m["text_cfg"].get("pool_type") == "eos",
    "text pool_type 'last' / 'first'":
        lambda m: m["text_cfg"].get("pool_type") in ("last", "first"),
    "text no_causal_mask":
        lambda m: bool(m["text_cfg"].get("no_causal_mask")),
    "vision pool_type 'avg' (+ final_ln_after_pool)":
        lambda m: m["vision_cfg"].get("pool_type") == "avg",
    "LayerNorm eps other than 1e-5 (norm_kwargs)":
        lambda m: bool(m["vision_cfg"].get("norm_kwargs") or m["text_cfg"].get("norm_kwargs")),
    "tanh GELU (act_kwargs)":
        lambda m: bool(m["vision_cfg"].get("act_kwargs") or m["text_cfg"].get("act_kwargs")),
    "QuickGELU (quick_gelu)": lambda m: bool(m.get("quick_gelu")),
    "heads other than width / 64":
        lambda m: ("head_width" in m["vision_cfg"] and m["vision_cfg"]["head_width"] != 64)
        or m["text_cfg"].get("width", 512) != 64 * m["text_cfg"].get("heads", 8),
}


# --- the document ---------------------------------------------------------------------------------

def verdict_counts() -> dict[str, int]:
    """``{"convertible": n, "refused": m}`` over the recorded configs."""
    blocks = [verdict(name)[0] for name in model_names()]
    return {"convertible": sum(b is not None for b in blocks),
            "refused": sum(b is None for b in blocks)}


def _releases(entry: Mapping[str, Any]) -> str:
    tags = []
    for tag, release in sorted(entry["pretrained"].items()):
        tags.append(f"`{tag}` ({release['hf_repo']})" if release.get("hf_repo") else f"`{tag}`")
    return ", ".join(tags) or "none"


def models_table() -> str:
    """The markdown table of every recorded config: converted (what it converts to) or refused
    (why), and its releases."""
    lines = ["| config | converted | image and text towers, or why not | releases (Hugging "
             "Face repository) |", "| --- | --- | --- | --- |"]
    for name in model_names():
        block, why = verdict(name)
        why = why.replace(f"; supported: {TIMM_SUPPORTED}", "").replace("|", "\\|")
        entry = recorded()["models"][name]
        lines.append(f"| `{name}` | {'yes' if block else 'no'} | {why} | "
                     f"{_releases(entry)} |")
    return "\n".join(lines) + "\n"


def _options_table() -> str:
    fields = recorded()["fields"]
    lines = ["| option | default | converted / no effect / refused |", "| --- | --- | --- |"]
    for where, key, converted, no_effect, refused in (
            ("model", "model", MODEL_CONVERTED, MODEL_NO_EFFECT, MODEL_REFUSED),
            ("vision_cfg", "vision_cfg", VISION_CONVERTED, VISION_NO_EFFECT, VISION_REFUSED),
            ("text_cfg", "text_cfg", TEXT_CONVERTED, TEXT_NO_EFFECT, TEXT_REFUSED)):
        known = {**fields[key], **({"custom_text": False, "multimodal_cfg": None}
                                   if key == "model" else {})}
        for option in sorted(known):
            if option in converted:
                how = f"converted: {converted[option]}"
            elif option in no_effect:
                how = f"no effect at inference: {no_effect[option]}"
            elif option in refused:
                how = (f"refused unless {_supported(refused[option][0])} "
                       f"({refused[option][1]})")
            else:
                how = "(unclassified)"
            name = option if where == "model" else f"{where}.{option}"
            default = "" if option in ("vision_cfg", "text_cfg") else f"`{_show(known[option])}`"
            lines.append(f"| `{name}` | {default} | {how} |")
    return "\n".join(lines) + "\n"


def _hidden_table() -> str:
    lines = ["| setting the tensors do not show | configs using it |", "| --- | --- |"]
    configs = recorded()["models"]
    for what, uses in HIDDEN_SETTINGS.items():
        names = [n for n in sorted(configs) if uses(configs[n]["model_cfg"])]
        lines.append(f"| {what} | {len(names)}: {', '.join(f'`{n}`' for n in names)} |")
    return "\n".join(lines) + "\n"


def models_document() -> str:
    """docs/open_clip_models.md (written by tests/fixtures/make_open_clip_models.py)."""
    data = recorded()
    counts = verdict_counts()
    return f"""# open_clip's model configs and the CLIP converter

Generated by `{data['generator']}` on {data['date']} from open_clip {data['open_clip_version']}
(timm {data['timm_version']}, torch {data['torch_version']}): its {len(data['models'])}
shipped model configs, recorded in
`contrastive_jax/training/models/converters/open_clip_models.json`, and the decision of
`open_clip_config.model_block` on each: **{counts['convertible']} converted, {counts['refused']}
refused**. Converted means the `dual_encoder` block computes what open_clip's model computes
(every option converted exactly); refused names the first option that the project's models do
not compute. `python -m contrastive_jax.training.models.converters.clip_import --model=NAME`
(or `--open_clip_config=FILE|DIR`, or `--checkpoint=` a hub directory) reads these settings
from the config instead of guessing them from tensor shapes (docs/pretrained.md).

## Every option

Each field of open_clip's `CLIPVisionCfg` and `CLIPTextCfg` and each top-level key of a model
config (`CLIP`'s arguments, the factory's `custom_text` and `multimodal_cfg`). "No effect at
inference" options are accepted (set, they are listed in the converter's notes); an option
open_clip does not know is refused. With a timm trunk (`vision_cfg.timm_model_name`) open_clip
reads only `timm_*`, `image_size` and `patch_dropout`; the rest of `vision_cfg` has no effect.
A timm trunk converts when it is {TIMM_SUPPORTED} (what timm builds for the name is recorded
from timm on PyTorch's meta device).

{_options_table()}
## Without a config

A bare state dict (`--checkpoint=FILE` alone) shows sizes, not these settings. The converter
then assumes CLIP's (heads `width // 64`, LayerNorm eps 1e-5, class-token pooling after
`ln_post`, a causal text mask with argmax pooling, the activation from `--quick_gelu`) and warns
that it did; where the tensors contradict CLIP (a text projection with a bias, no `ln_pre`, a
timm trunk, a ResNet, a Hugging Face text tower) it refuses and asks for the config. The
settings it cannot see, and the shipped configs that use them:

{_hidden_table()}
## The shipped configs

{models_table()}"""
