"""open_clip's files from a dual encoder: ``open_clip_model.safetensors`` and
``open_clip_config.json``, the layout of an open_clip model on the Hugging Face hub ([OpenCLIP]
in docs/references.md)::

    OUT/open_clip_model.safetensors  the state dict open_clip's model holds (float32, every key;
                                      :func:`~.tensor_layouts.state_dict_from_params`)
    OUT/open_clip_config.json        {"model_cfg": the open_clip model config that builds
                                      exactly this architecture, "preprocess_cfg": mean, std,
                                      interpolation, resize_mode}

which open_clip loads with ``open_clip.create_model_and_transforms("local-dir:OUT")`` (a model
whose image tower is a timm trunk that timm does not register, ``timm_model_name``, needs that
name registered first; ``timm_model_args`` in the config gives its arguments). The command
``python -m contrastive_jax.clip_export`` writes them from a trainer workdir or a converted
directory (:mod:`contrastive_jax.clip_export`).

What open_clip can hold (:func:`model_cfg`): a ``dual_encoder`` of a ``vit`` and a
``text_transformer`` without output layers (``features=None``), either

* **CLIP-shaped**: the image tower open_clip's own ``VisionTransformer`` (``class_token``, no
  patch bias, pooled at the class token or over the patches), or
* **SigLIP-shaped**: no class token, patch bias, no ``pre_norm``, LayerNorm eps 1e-6, exact or
  tanh GELU, pooled by timm's map head (``pool="map"``) or the mean: a timm
  ``VisionTransformer`` trunk ([timm]), named by the registered timm model with the same image
  size, patch, width, depth, heads, MLP width, activation and pooling (:data:`TIMM_TRUNKS`), or
  by ``timm_model_name``;

and a text tower pooled at one position (``argmax``, ``last``, ``first``, ``eos``), causal or
not, with a projection with or without bias or none; activations exact GELU, tanh GELU
(open_clip's ``act_kwargs``) or QuickGELU (open_clip's ``quick_gelu``, for both of its own
towers). Anything else (a signal CNN or ResNet tower, an output layer, mean pooling of the text,
QuickGELU in one tower only, a timm trunk timm does not have, ...) is a :class:`ConfigError`
naming the option. Dropout is training-only and not exported.
tests/fixtures/check_clip_export_open_clip.py loads exports in open_clip (3.3.0: the same
features as this project's model to about 1e-6 relative, float32; an exported open_clip
fixture gives open_clip's recorded outputs exactly).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models import architecture_block
from contrastive_jax.training.models.converters.open_clip import tensor_layouts, tensor_rules
from contrastive_jax.training.parameter_paths import leaves_by_path

CONFIG_FILE = "open_clip_config.json"
WEIGHTS_FILE = "open_clip_model.safetensors"
TORCH_LAYER_NORM_EPS = 1e-5  # open_clip's LayerNorm default (torch's)
TIMM_LAYER_NORM_EPS = 1e-6  # timm's ViTs
# timm's registered SigLIP VisionTransformers (timm 1.0.31): name -> (image size, patch, width,
# depth, heads, MLP width, activation, global pool). All: no class token, patch bias, no
# norm_pre, LayerNorm eps 1e-6, qkv bias, no LayerScale; "map": AttentionPoolLatent (1 latent,
# q projection, the blocks' heads, MLP width and activation); "avg": mean of the normed tokens
# (fc_norm off). tests/fixtures/check_clip_export_open_clip.py checks every entry against timm.
TIMM_TRUNKS = {
    "vit_base_patch16_siglip_224": (224, 16, 768, 12, 12, 3072, "gelu", "map"),
    "vit_base_patch16_siglip_256": (256, 16, 768, 12, 12, 3072, "gelu", "map"),
    "vit_base_patch16_siglip_384": (384, 16, 768, 12, 12, 3072, "gelu", "map"),
    "vit_base_patch16_siglip_512": (512, 16, 768, 12, 12, 3072, "gelu", "map"),
    "vit_base_patch16_siglip_gap_224": (224, 16, 768, 12, 12, 3072, "gelu", "avg"),
    "vit_base_patch16_siglip_gap_256": (256, 16, 768, 12, 12, 3072, "gelu", "avg"),
    "vit_base_patch16_siglip_gap_384": (384, 16, 768, 12, 12, 3072, "gelu", "avg"),
    "vit_base_patch16_siglip_gap_512": (512, 16, 768, 12, 12, 3072, "gelu", "avg"),
    "vit_base_patch32_siglip_256": (256, 32, 768, 12, 12, 3072, "gelu_tanh", "map"),
    "vit_base_patch32_siglip_gap_256": (256, 32, 768, 12, 12, 3072, "gelu_tanh", "avg"),
    "vit_giantopt_patch16_siglip_256": (256, 16, 1536, 40, 16, 6144, "gelu_tanh", "map"),
    "vit_giantopt_patch16_siglip_384": (384, 16, 1536, 40, 16, 6144, "gelu_tanh", "map"),
    "vit_giantopt_patch16_siglip_gap_256": (256, 16, 1536, 40, 16, 6144, "gelu_tanh", "avg"),
    "vit_giantopt_patch16_siglip_gap_384": (384, 16, 1536, 40, 16, 6144, "gelu_tanh", "avg"),
    "vit_large_patch16_siglip_256": (256, 16, 1024, 24, 16, 4096, "gelu", "map"),
    "vit_large_patch16_siglip_384": (384, 16, 1024, 24, 16, 4096, "gelu", "map"),
    "vit_large_patch16_siglip_512": (512, 16, 1024, 24, 16, 4096, "gelu_tanh", "map"),
    "vit_large_patch16_siglip_gap_256": (256, 16, 1024, 24, 16, 4096, "gelu", "avg"),
    "vit_large_patch16_siglip_gap_384": (384, 16, 1024, 24, 16, 4096, "gelu", "avg"),
    "vit_large_patch16_siglip_gap_512": (512, 16, 1024, 24, 16, 4096, "gelu_tanh", "avg"),
    "vit_so400m_patch14_siglip_224": (224, 14, 1152, 27, 16, 4304, "gelu", "map"),
    "vit_so400m_patch14_siglip_378": (378, 14, 1152, 27, 16, 4304, "gelu", "map"),
    "vit_so400m_patch14_siglip_gap_224": (224, 14, 1152, 27, 16, 4304, "gelu", "avg"),
    "vit_so400m_patch14_siglip_gap_378": (378, 14, 1152, 27, 16, 4304, "gelu", "avg"),
    "vit_so400m_patch14_siglip_gap_448": (448, 14, 1152, 27, 16, 4304, "gelu", "avg"),
    "vit_so400m_patch14_siglip_gap_896": (896, 14, 1152, 27, 16, 4304, "gelu", "avg"),
    "vit_so400m_patch16_siglip_256": (256, 16, 1152, 27, 16, 4304, "gelu_tanh", "map"),
    "vit_so400m_patch16_siglip_384": (384, 16, 1152, 27, 16, 4304, "gelu_tanh", "map"),
    "vit_so400m_patch16_siglip_512": (512, 16, 1152, 27, 16, 4304, "gelu_tanh", "map"),
    "vit_so400m_patch16_siglip_gap_256": (256, 16, 1152, 27, 16, 4304, "gelu_tanh", "avg"),
    "vit_so400m_patch16_siglip_gap_384": (384, 16, 1152, 27, 16, 4304, "gelu_tanh", "avg"),
    "vit_so400m_patch16_siglip_gap_512": (512, 16, 1152, 27, 16, 4304, "gelu_tanh", "avg"),
}
_ACTIVATIONS = ("gelu", "gelu_tanh", "quick_gelu")


def mlp_ratio(width: int, hidden: int) -> float:
    """A ratio ``r`` with ``int(width * r) == hidden`` (open_clip's and timm's MLP width):
    ``hidden / width`` where that rounds back, else ``(hidden + 0.5) / width``."""
    for ratio in (hidden / width, (hidden + 0.5) / width):
        if int(width * ratio) == hidden:
            return ratio
    raise AssertionError((width, hidden))  # (hidden + 0.5) / width always rounds back


def _activation(option: str, value: Any) -> str:
    if value not in _ACTIVATIONS:
        raise ConfigError(f"{option} = {value!r}: open_clip has exact GELU ('gelu'), tanh GELU "
                          "('gelu_tanh', nn.GELU(approximate='tanh') by act_kwargs) and "
                          "QuickGELU ('quick_gelu')")
    return value


def _tower_norm_act(cfg: dict, tower: Mapping[str, Any], option: str) -> None:
    """open_clip's ``norm_kwargs`` / ``act_kwargs`` for one of its own towers."""
    if tower["layer_norm_eps"] != TORCH_LAYER_NORM_EPS:
        cfg["norm_kwargs"] = {"eps": tower["layer_norm_eps"]}
    if _activation(f"{option}.activation", tower["activation"]) == "gelu_tanh":
        cfg["act_kwargs"] = {"approximate": "tanh"}


def timm_trunk_for_export(vit: Mapping[str, Any], timm_model_name: str | None = None
               ) -> tuple[str, dict[str, Any] | None]:
    """``(timm model name, its registration arguments or None)`` for a resolved ``vit`` block
    without class token: the registered timm model of :data:`TIMM_TRUNKS` with the same image
    size, patch, width, depth, heads, MLP width, activation and pooling; or ``timm_model_name``
    (a model you register in timm yourself: the arguments returned are what it must be
    registered with; a name of :data:`TIMM_TRUNKS` must have the same sizes). No match is a
    :class:`ConfigError` giving the sizes and ``--timm_model_name``."""
    where = "model.sample_encoder"
    if vit["layer_norm_eps"] != TIMM_LAYER_NORM_EPS:
        raise ConfigError(f"{where}.layer_norm_eps = {vit['layer_norm_eps']!r}: a timm trunk "
                          f"(no class token) has LayerNorm eps {TIMM_LAYER_NORM_EPS}")
    if vit["norm_after_pool"]:
        raise ConfigError(f"{where}.norm_after_pool = True: timm's SigLIP trunks normalise "
                          "the tokens before pooling (set norm_after_pool=False)")
    activation = _activation(f"{where}.activation", vit["activation"])
    if activation == "quick_gelu":
        raise ConfigError(f"{where}.activation = 'quick_gelu': timm's SigLIP trunks use exact "
                          "or tanh GELU")
    hidden = tensor_rules.hidden_width(vit)
    pool = {"map": "map", "mean": "avg"}[vit["pool"]]
    key = (vit["image_size"], vit["patch"], vit["width"], vit["depth"], vit["heads"], hidden,
           activation, pool)
    sizes = (f"image {key[0]} patch {key[1]} width {key[2]} depth {key[3]} heads {key[4]} "
             f"MLP width {hidden} activation {activation!r} pool {vit['pool']!r}")
    if timm_model_name is None:
        for name, args in TIMM_TRUNKS.items():
            if args == key:
                return name, None
        raise ConfigError(
            f"no registered timm model has this image tower ({sizes}); open_clip names its "
            f"timm trunk by a registered model (known: {sorted(TIMM_TRUNKS)[:3]}...): register "
            "one with these sizes in timm and pass its name with --timm_model_name")
    if timm_model_name in TIMM_TRUNKS and TIMM_TRUNKS[timm_model_name] != key:
        raise ConfigError(f"--timm_model_name = {timm_model_name!r} is timm's "
                          f"{TIMM_TRUNKS[timm_model_name]}, not this image tower ({sizes})")
    args = {"img_size": key[0], "patch_size": key[1], "embed_dim": key[2], "depth": key[3],
            "num_heads": key[4], "mlp_ratio": mlp_ratio(key[2], hidden), "class_token": False,
            "global_pool": pool}
    if pool == "avg":
        args["fc_norm"] = False
    if activation == "gelu_tanh":
        args["act_layer"] = "gelu_tanh"
    return timm_model_name, args


def model_cfg(model_block: Mapping[str, Any], *, bias: float | None = None,
              timm_model_name: str | None = None) -> tuple[dict[str, Any], dict | None]:
    """``(open_clip model config, timm registration arguments or None)`` that builds exactly
    the model ``model_block`` describes (see the module docstring), every option converted or
    refused by name (:class:`ConfigError`). ``bias``: ``init_logit_bias`` of a SigLIP model
    (its value; the state dict sets it anyway)."""
    tensor_rules.rules(model_block)  # the layouts' own refusals first
    model = tensor_rules.resolved(model_block)
    vit, txt = model["sample_encoder"], model["text_encoder"]
    own = [("model.text_encoder", txt)]
    timm_args = None
    if vit["class_token"]:  # open_clip's VisionTransformer
        vision = {"image_size": vit["image_size"], "patch_size": vit["patch"],
                  "width": vit["width"], "layers": vit["depth"],
                  "head_width": vit["width"] // vit["heads"]}
        ratio = mlp_ratio(vit["width"], tensor_rules.hidden_width(vit))
        if ratio != 4.0:
            vision["mlp_ratio"] = ratio
        if not vit["pre_norm"]:
            vision["no_ln_pre"] = True
        vision["pool_type"] = {"token": "tok", "mean": "avg"}[vit["pool"]]
        if vit["norm_after_pool"]:
            vision["final_ln_after_pool"] = True
        _tower_norm_act(vision, vit, "model.sample_encoder")
        own.insert(0, ("model.sample_encoder", vit))
    else:  # a timm trunk, as open_clip's SigLIP configs
        name, timm_args = timm_trunk_for_export(vit, timm_model_name)
        vision = {"image_size": vit["image_size"], "timm_model_name": name,
                  "timm_model_pretrained": False,
                  "timm_pool": {"map": "map", "mean": "avg"}[vit["pool"]],
                  "timm_proj": "none" if model["sample_projection"] == "none" else "linear"}
        if model["sample_projection"] == "linear_bias":
            vision["timm_proj_bias"] = True
    text = {"context_length": txt["max_tokens"], "vocab_size": txt["vocab_size"],
            "width": txt["width"], "heads": txt["heads"], "layers": txt["depth"]}
    ratio = mlp_ratio(txt["width"], tensor_rules.hidden_width(txt))
    if ratio != 4.0:
        text["mlp_ratio"] = ratio
    if not txt["causal"]:
        text["no_causal_mask"] = True
    if txt["pool"] != "argmax":
        text["pool_type"] = txt["pool"]
    if txt["pool"] == "eos":
        text["eos_id"] = txt["eos_id"]
    if model["text_projection"] == "linear_bias":
        text["proj_bias"] = True
    elif model["text_projection"] == "none":
        text["proj_type"] = "none"
    _tower_norm_act(text, txt, "model.text_encoder")
    quick = {option: tower["activation"] == "quick_gelu" for option, tower in own}
    if len(set(quick.values())) > 1:  # open_clip's QuickGELU is one switch for its towers
        option = next(o for o, q in quick.items() if q)
        raise ConfigError(f"{option}.activation = 'quick_gelu' but the other tower's is not: "
                          "open_clip's quick_gelu applies to both of its own towers")
    cfg: dict[str, Any] = {"embed_dim": model["embed_dim"]}
    if all(quick.values()):
        cfg["quick_gelu"] = True
    if model["siglip"]:
        cfg["init_logit_bias"] = float(model["init_bias"] if bias is None else bias)
    if not vit["class_token"]:
        cfg["custom_text"] = True
    cfg.update({"vision_cfg": vision, "text_cfg": text})
    return cfg, timm_args


def preprocess_cfg(preprocess: Mapping[str, Any] | None) -> dict[str, Any]:
    """open_clip's ``preprocess_cfg`` (as its ``push_to_hf_hub`` writes it: ``mean``, ``std``,
    ``interpolation``, ``resize_mode``; the image size comes from the model) from this
    project's pixel settings (a converted directory's ``preprocess.json`` or a run's
    ``data.preprocess``): mean / std not set (images in [0, 1] as they are) are 0 and 1."""
    pre = dict(preprocess or {})
    return {"mean": [float(v) for v in pre.get("mean") or (0.0, 0.0, 0.0)],
            "std": [float(v) for v in pre.get("std") or (1.0, 1.0, 1.0)],
            "interpolation": pre.get("resize") or "bicubic",
            "resize_mode": pre.get("resize_mode") or "shortest"}


def export(output: str | os.PathLike, model_block: Mapping[str, Any], params: Mapping[str, Any],
           preprocess: Mapping[str, Any] | None = None, *,
           timm_model_name: str | None = None) -> dict[str, Any]:
    """Write ``output/open_clip_model.safetensors``
    (:func:`~.tensor_layouts.state_dict_from_params`) and ``output/open_clip_config.json``
    (:func:`model_cfg`, :func:`preprocess_cfg`; with ``timm_model_args`` when the image trunk
    is a timm model you register yourself); the config written. ``output`` must be new or
    empty (nothing is overwritten)."""
    from safetensors.numpy import save_file

    block = architecture_block(model_block)
    bias = None
    if tensor_rules.resolved(block)["siglip"]:
        leaves = leaves_by_path(params)
        # the shortest decimal that is the float32 value (-4.7, not -4.699999809265137)
        bias = float(str(np.float32(np.asarray(leaves["bias"])))) if "bias" in leaves else None
    cfg, timm_args = model_cfg(block, bias=bias, timm_model_name=timm_model_name)
    tensors = tensor_layouts.state_dict_from_params(block, params)
    config = {"model_cfg": cfg, "preprocess_cfg": preprocess_cfg(preprocess)}
    if timm_args is not None:
        config["timm_model_args"] = timm_args
    output = os.path.abspath(os.fspath(output))
    if os.path.exists(output) and (not os.path.isdir(output) or os.listdir(output)):
        raise ConfigError(f"output {output!r} exists and is not an empty directory; choose a "
                          "new one")
    os.makedirs(output, exist_ok=True)
    save_file(tensors, os.path.join(output, WEIGHTS_FILE))
    with open(os.path.join(output, CONFIG_FILE), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    return config


