"""The timm image trunks open_clip's configs name (``vision_cfg.timm_model_name``), and the
``vit`` tower each converts to ([timm], [SigLIP] in docs/references.md).

A trunk is described by the data recorded from timm (:func:`recorded_timm_trunk`, in
``open_clip_models.json``) or, for a model registered outside timm (a test fixture), worked
out from the ``timm_model_args`` its ``open_clip_config.json`` carries
(:func:`trunk_from_timm_args`). :func:`timm_vision_tower` converts the trunks the project's
ViT computes exactly: timm ``VisionTransformer`` s as open_clip's SigLIP configs use them (no
class or register tokens, a learned position embedding, a patch convolution with bias, plain
blocks, LayerNorm, exact or tanh GELU, the final norm, timm's ``map`` attention-pool head,
``timm_pool="map"``, ``timm_proj="none"``); anything else is refused naming what the ViT does
not compute. The standard library only, as :mod:`.model_sources`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models.converters.open_clip.config_options import (
    TIMM_ACTIVATIONS,
    TIMM_FAMILIES,
    TIMM_SUPPORTED,
    refusal,
    square_size,
)
from contrastive_jax.training.models.converters.open_clip.model_sources import json_text, recorded


def recorded_timm_trunk(name: str) -> dict | None:
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
    """The trunk description (as :func:`recorded_timm_trunk`) of ``timm.models.vision_transformer.
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
        raise ConfigError(f"timm_model_args act_layer = {json_text(a['act_layer'])}, norm_layer = "
                          f"{json_text(a['norm_layer'])}: only the defaults (LayerNorm eps 1e-6, "
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


def timm_vision_tower(cfg: dict, trunk: Mapping[str, Any], embed_dim: int) -> dict:
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
    if square_size(cfg["image_size"], "vision_cfg.image_size", "images") != size[0]:
        raise refusal("vision_cfg.image_size", cfg["image_size"], f"the timm trunk {name!r} "
                      f"is built for {size[0]} pixels (open_clip's TimmModel uses the trunk's "
                      "size; set_input_size is not converted)", json_text(size[0]))
    if cfg["timm_pool"] != "map":
        raise refusal("vision_cfg.timm_pool", cfg["timm_pool"], "the trunk's pooling as "
                      "open_clip rebuilds it", '"map" (timm\'s attention-pool head)')
    if cfg["timm_proj"] != "none":
        raise refusal("vision_cfg.timm_proj", cfg["timm_proj"], "open_clip's head after the "
                      "timm trunk", '"none" (the trunk\'s features are the embedding)')
    if width != embed_dim:
        raise refusal("embed_dim", embed_dim, f"with timm_proj 'none' the image features are "
                      f"the trunk's {width} wide", json_text(width))
    tower = {"name": "vit", "image_size": size[0], "patch": patch[0],
             "in_channels": conv.get("in_chans", 3), "width": width, "depth": trunk["depth"],
             "heads": heads, "mlp_ratio": 4}
    if hidden != 4 * width:
        tower["mlp_width"] = hidden
    tower.update({"features": None, "activation": act, "layer_norm_eps": float(eps),
                  "class_token": False, "pre_norm": False, "pool": "map", "patch_bias": True})
    return tower
