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
(``init_logit_bias``). Each option is in exactly one of the three tables of
:mod:`.config_options` (converted, no effect at inference, refused unless at open_clip's
default).

An option open_clip does not know (not a field of its dataclasses) is refused too. A timm image
tower (``vision_cfg.timm_model_name``) is described by the timm model it names: the data
recorded from timm or, for a model registered outside timm (a test fixture), the
``timm_model_args`` its ``open_clip_config.json`` carries; only the trunks the project's ViT
computes exactly are converted (:mod:`.timm_trunks`: timm ``VisionTransformer`` s as
open_clip's SigLIP configs use them).

Where a config comes from (a file, a hub directory, the cache, a recorded name):
:mod:`.model_sources`. The standard library only (no JAX, no PyTorch), so the fixture
scripts can run it where open_clip is installed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models.converters.open_clip.config_options import (
    MODEL_CONVERTED,
    MODEL_NO_EFFECT,
    MODEL_REFUSED,
    TEXT_CONVERTED,
    TEXT_NO_EFFECT,
    TEXT_REFUSED,
    TIMM_SUPPORTED,
    VISION_CONVERTED,
    VISION_NO_EFFECT,
    VISION_REFUSED,
    check_fields,
    refusal,
    square_size,
)
from contrastive_jax.training.models.converters.open_clip.model_sources import (
    json_text,
    recorded,
    recorded_model,
)
from contrastive_jax.training.models.converters.open_clip.timm_trunks import (
    recorded_timm_trunk,
    timm_vision_tower,
    trunk_from_timm_args,
)

HEAD_WIDTH = 64  # CLIP's heads are width / 64 unless a config says otherwise
TORCH_LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default: open_clip's without norm_kwargs


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
    size = square_size(cfg["image_size"], f"{w}.image_size", "images")
    patch = square_size(cfg["patch_size"], f"{w}.patch_size", "patches")
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


# --- the model block ------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class OpenClipModelBlock:
    """The ``model`` block of an open_clip config and what the conversion noted: the options
    set that have no effect at inference (``notes``), the tokenizer open_clip uses
    (``tokenizer``: ``hf_tokenizer_name``, None for CLIP's BPE)."""

    model: dict
    notes: tuple[str, ...]
    tokenizer: str | None


def model_block(model_cfg: Mapping[str, Any], *,
                timm_args: Mapping[str, Any] | None = None) -> OpenClipModelBlock:
    """The ``dual_encoder`` block computing what open_clip's model of ``model_cfg`` computes
    (the module docstring; a refused option is a :class:`ConfigError` naming it).

    ``timm_args``: the constructor arguments of a timm trunk that is not in the recorded data
    (``timm_model_args`` of a fixture's ``open_clip_config.json``,
    :func:`.timm_trunks.trunk_from_timm_args`). ``init_temperature`` / ``init_bias`` come from
    ``init_logit_scale`` / ``init_logit_bias``; a converter replaces them with the
    checkpoint's values.
    """
    if not isinstance(model_cfg, Mapping):
        raise ConfigError(f"an open_clip model config is a JSON object; got {json_text(model_cfg)}")
    fields = recorded()["fields"]
    top_known = {**{k: v for k, v in fields["model"].items()},
                 "custom_text": False, "multimodal_cfg": None}
    for key in ("embed_dim", "vision_cfg", "text_cfg"):
        if key not in model_cfg:
            raise ConfigError(f"the open_clip model config has no {key!r} (it has "
                              f"{sorted(model_cfg)}); an open_clip model config has "
                              "embed_dim, vision_cfg and text_cfg")
    notes = check_fields(model_cfg, "model", top_known, MODEL_CONVERTED, MODEL_NO_EFFECT,
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
        notes += check_fields(vision_in, "vision_cfg", fields["vision_cfg"], VISION_CONVERTED,
                               {**VISION_NO_EFFECT, **{k: "not read with a timm trunk" for k in
                                                       fields["vision_cfg"] if k not in read
                                                       and k not in VISION_NO_EFFECT}},
                               {}, skip=read)
        trunk = (trunk_from_timm_args(timm_args) if timm_args is not None
                 else recorded_timm_trunk(timm_name))
        if trunk is None:
            known = sorted(recorded()["timm_models"])
            raise refusal("vision_cfg.timm_model_name", timm_name,
                          f"the recorded data (timm {recorded()['timm_version']}) does not "
                          "describe this timm model, and its open_clip_config.json has no "
                          "timm_model_args", f"{TIMM_SUPPORTED}; recorded: {known}")
        sample = timm_vision_tower(vision, trunk, embed_dim)
        sample_projection = "none"
    else:
        notes += check_fields(vision_in, "vision_cfg", fields["vision_cfg"], VISION_CONVERTED,
                               VISION_NO_EFFECT, VISION_REFUSED)
        sample = _vision_own(vision, quick_gelu)
        sample_projection = "linear"
    notes += check_fields(text_in, "text_cfg", fields["text_cfg"], TEXT_CONVERTED,
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
    return OpenClipModelBlock(block, tuple(notes), tokenizer)


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
