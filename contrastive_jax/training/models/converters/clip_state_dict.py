"""A CLIP state dict without its open_clip config: read as OpenAI's / open_clip's default ViT CLIP.

A bare checkpoint (a ``.safetensors`` / ``.pt`` file alone) shows sizes, not settings:
:func:`state_dict_architecture` reads image size, patch, widths, depths, MLP widths, context length,
vocabulary and embedding size from the tensors' shapes and takes CLIP's settings for what
shapes do not show (heads ``width // 64``, LayerNorm eps 1e-5, class-token pooling after
``ln_post``, a causal text mask with argmax pooling, the activation from ``quick_gelu``, the
file name or a TorchScript archive's modules), stated in an :class:`AssumptionWarning` that
also names the recorded open_clip configs with other heads at that width
(:func:`~.model_configs.head_exceptions`). A checkpoint that is visibly not such a CLIP
(:func:`not_a_clip`: a ResNet or timm image tower, a Hugging Face text tower, a text projection
with a bias, no ``ln_pre``, a logit bias) is refused, asking for the config. With the config,
:func:`~.clip_import.convert_open_clip` reads none of this ([CLIP], [OpenCLIP] in
docs/references.md; docs/pretrained.md).
"""

from __future__ import annotations

import math
import os
import re
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models.converters.open_clip import model_configs as occ
from contrastive_jax.training.models.converters.open_clip.model_sources import model_names, recorded
from contrastive_jax.training.models.converters.open_clip.tensor_layouts import (
    params_from_state_dict,
)
from contrastive_jax.training.models.converters.state_dict_files import (
    is_torchscript,
    torchscript_activation,
)

HEAD_WIDTH = occ.HEAD_WIDTH  # CLIP's heads are width / 64 except where a config says otherwise
LAYER_NORM_EPS = occ.TORCH_LAYER_NORM_EPS  # torch.nn.LayerNorm's default, CLIP's
_BLOCK = re.compile(r"^(visual\.)?transformer\.resblocks\.(\d+)\.")
CONFIG_HINT = ("pass the model's open_clip config: --open_clip_config=open_clip_config.json "
               "(or its directory), --model=NAME (docs/open_clip_models.md), or "
               "--checkpoint=the Hugging Face hub directory")


class AssumptionWarning(UserWarning):
    """A bare state dict was converted with CLIP's settings for what its tensors do not show."""


def _tensor(tensors: Mapping[str, np.ndarray], name: str, ndim: int) -> np.ndarray:
    if name not in tensors:
        raise ConfigError(f"the checkpoint has no tensor {name!r}, which a ViT CLIP has; "
                          "supported: OpenAI's ViT CLIP and open_clip's CLIP with its own "
                          "VisionTransformer and TextTransformer")
    if tensors[name].ndim != ndim:
        raise ConfigError(f"tensor {name!r} has shape {tensors[name].shape}; a ViT CLIP's has "
                          f"{ndim} dimensions")
    return tensors[name]


def _depth(tensors: Iterable[str], visual: bool) -> int:
    found = {int(m.group(2)) for m in map(_BLOCK.match, tensors)
             if m and bool(m.group(1)) == visual}
    return max(found) + 1 if found else 0


def not_a_clip(names: Iterable[str]) -> str | None:
    """Why a state dict (its tensor names, ``text.`` removed) is not a CLIP the converter
    reads without a config, or None: a ResNet or timm image tower, a Hugging Face text tower,
    CoCa's decoder, or settings only a config gives (a text projection with a bias, no
    ``ln_pre``, SigLIP's logit bias)."""
    names = set(names)

    def has(*prefixes: str) -> list[str]:
        return sorted(n for n in names if n.startswith(prefixes))

    if has("visual.layer1.", "visual.attnpool."):
        return ("this is a ResNet CLIP (it has visual.layer1 / visual.attnpool tensors); only ViT "
                "image towers can be imported (docs/open_clip_models.md lists open_clip's "
                "configs and which convert)")
    if has("visual.trunk."):
        return ("this open_clip model has a timm image tower (visual.trunk.*, e.g. a SigLIP): its "
                "tensors do not say which timm model it is (heads, activation, epsilon, "
                f"pooling); {CONFIG_HINT}")
    hf = [n for n in has("transformer.") if not n.startswith("transformer.resblocks.")]
    if hf:
        return (f"this open_clip model has a Hugging Face text tower ({hf[0]!r}); only "
                "open_clip's own TextTransformer can be imported")
    if has("text_decoder.", "visual.attn_pool.") or "cls_emb" in names:
        return ("this is an open_clip CoCa model (text_decoder / attn_pool / cls_emb tensors); "
                "only CLIP's dual encoder can be imported")
    if "text_projection.bias" in names:
        return ("tensor 'text_projection.bias': the text projection has a bias (open_clip's "
                "text_cfg.proj_bias = true, set together with options the tensors do not show: "
                f"pooling, causal mask, LayerNorm epsilon); {CONFIG_HINT}")
    if "logit_bias" in names:
        return ("tensor 'logit_bias': a SigLIP-style model (open_clip's init_logit_bias), "
                f"whose other settings the tensors do not show; {CONFIG_HINT}")
    if "visual.conv1.weight" in names and "visual.ln_pre.weight" not in names:
        clipa = [n for n in model_names()
                 if recorded()["models"][n]["model_cfg"]["vision_cfg"].get("no_ln_pre")]
        return ("the checkpoint has no visual.ln_pre: open_clip's vision_cfg.no_ln_pre = true "
                f"(its CLIPA configs {clipa}, which also pool differently: 'avg' + "
                f"final_ln_after_pool, text pool 'last' without causal mask); {CONFIG_HINT}")
    return None


def state_dict_architecture(tensors: Mapping[str, np.ndarray], *, quick_gelu: bool | None = None,
                 vision_heads: int | None = None, text_heads: int | None = None,
                 activation: str | None = None) -> dict[str, Any]:
    """The ``model`` config block (a ``dual_encoder``) of the CLIP whose state dict is
    ``tensors``, read from shapes (names as OpenAI's / open_clip's ``CLIP``):

    * image tower: ``visual.conv1.weight (width, C, patch, patch)``,
      ``visual.positional_embedding ((image_size / patch)^2 + 1, width)``, the number of
      ``visual.transformer.resblocks.i``, the MLP's hidden width from ``c_fc``;
    * text tower: ``token_embedding.weight (vocab_size, width)``,
      ``positional_embedding (context_length, width)``, ``transformer.resblocks.i``;
    * ``embed_dim`` from ``text_projection (width, embed_dim)``; the temperature from
      ``logit_scale`` (``init_temperature = exp(-logit_scale)``; the parameter takes the value).

    What shapes do not show is CLIP's: heads ``width // 64`` unless ``vision_heads`` /
    ``text_heads`` say otherwise (the recorded open_clip configs with other heads:
    :func:`.model_configs.head_exceptions`), LayerNorm eps 1e-5, class-token pooling after
    ``ln_post``, a causal text mask with argmax pooling. ``activation`` (or ``quick_gelu``:
    True ``"quick_gelu"``, False ``"gelu"``): the checkpoint's activation.
    """
    reason = not_a_clip(tensors)
    if reason:
        raise ConfigError(reason)
    if activation is None:
        if quick_gelu is None:
            raise ConfigError("architecture needs the activation: quick_gelu=True or False")
        activation = "quick_gelu" if quick_gelu else "gelu"
    conv = _tensor(tensors, "visual.conv1.weight", 4)
    width_v, channels, patch, patch_w = conv.shape
    if patch != patch_w:
        raise ConfigError(f"tensor 'visual.conv1.weight' has shape {conv.shape}: the patches "
                          "are not square")
    positions_v = _tensor(tensors, "visual.positional_embedding", 2)
    grid = math.isqrt(positions_v.shape[0] - 1)
    if grid * grid != positions_v.shape[0] - 1:
        raise ConfigError(f"tensor 'visual.positional_embedding' has shape {positions_v.shape}: "
                          "not a square grid of patches plus the class token")
    tokens = _tensor(tensors, "token_embedding.weight", 2)
    vocab_size, width_t = tokens.shape
    context = _tensor(tensors, "positional_embedding", 2).shape[0]
    embed_dim = _tensor(tensors, "text_projection", 2).shape[1]
    logit_scale = float(_tensor(tensors, "logit_scale", 0))
    towers = {}
    for tower, visual, width, heads in (("vision", True, width_v, vision_heads),
                                        ("text", False, width_t, text_heads)):
        prefix = "visual." if visual else ""
        depth = _depth(tensors, visual)
        if depth == 0:
            raise ConfigError(f"the checkpoint has no tensor {prefix}transformer.resblocks.0.*")
        heads = width // HEAD_WIDTH if heads is None else heads
        if not isinstance(heads, int) or heads < 1 or width % heads:
            raise ConfigError(f"{tower} heads = {heads!r} must be a positive divisor of the "
                              f"{tower} width {width}; set --{tower}_heads")
        hidden = _tensor(tensors, f"{prefix}transformer.resblocks.0.mlp.c_fc.weight", 2).shape[0]
        towers[tower] = {"width": width, "depth": depth, "heads": heads, "mlp_ratio": 4,
                         "mlp_width": None if hidden == 4 * width else hidden,
                         "features": None, "activation": activation,
                         "layer_norm_eps": LAYER_NORM_EPS}
    vision = {k: v for k, v in towers["vision"].items() if v is not None or k == "features"}
    text = {k: v for k, v in towers["text"].items() if v is not None or k == "features"}
    return {
        "name": "dual_encoder",
        "sample_encoder": {"name": "vit", "image_size": grid * patch, "patch": patch,
                           "in_channels": channels, **vision, "class_token": True,
                           "pre_norm": True, "pool": "token", "patch_bias": False},
        "text_encoder": {"name": "text_transformer", "vocab_size": vocab_size,
                         "max_tokens": context, **text, "causal": True, "pool": "argmax"},
        "embed_dim": embed_dim,
        "init_temperature": math.exp(-logit_scale),
    }


def _assumptions(config: Mapping[str, Any], *, heads_given: tuple[bool, bool],
                 activation_from: str) -> str:
    """The warning of a conversion from shapes alone: what was assumed, and the recorded
    open_clip configs whose heads differ at these widths."""
    v, t = config["sample_encoder"], config["text_encoder"]
    parts = []
    for tower, block, given, flag in (("image", v, heads_given[0], "--vision_heads"),
                                      ("text", t, heads_given[1], "--text_heads")):
        if given:
            parts.append(f"{tower} heads {block['heads']} (from {flag})")
            continue
        text = f"{tower} heads = width // 64 = {block['heads']}"
        others = occ.head_exceptions("vision" if tower == "image" else "text", block["width"])
        if others:
            heads = sorted({h for _, h in others})
            text += (f" (open_clip configs with a {block['width']}-wide {tower} tower and "
                     f"{'/'.join(map(str, heads))} heads: {[n for n, _ in others]})")
        parts.append(text)
    parts += ["LayerNorm eps 1e-5", "image pooling at the class token after ln_post (not "
              "pool_type 'avg' / final_ln_after_pool)", "a causal text mask with argmax "
              "pooling (not pool_type 'eos', 'last' or no_causal_mask)",
              f"activation {v['activation']} ({activation_from})"]
    return ("converted from tensor shapes alone (no open_clip config), assuming "
            + "; ".join(parts) + ". A wrong assumption gives wrong outputs, not an error: "
            + CONFIG_HINT)


def convert_state_dict(tensors: Mapping[str, np.ndarray], *, quick_gelu: bool,
                       vision_heads: int | None = None, text_heads: int | None = None
                       ) -> tuple[dict[str, Any], dict]:
    """``(model config, params)`` of a bare CLIP state dict (:func:`state_dict_architecture`; an
    :class:`AssumptionWarning` states what shapes did not show); ``params`` is the nested pure
    dict of the model's ``nnx.Param`` state (``nnx.to_pure_dict``), float32 NumPy arrays, mapped
    by :func:`.tensor_layouts.params_from_state_dict` (Linear weights transposed, the patch
    convolution OIHW -> HWIO, ``in_proj_weight`` split into q, k, v with head-major outputs,
    ``proj`` / ``text_projection`` as the dual encoder's projections, LayerNorm ``weight`` ->
    ``scale``). A tensor whose shape is not the architecture's, a missing one or one that
    nothing takes is a :class:`ConfigError` naming it.
    """
    return convert_bare(tensors, "quick_gelu" if quick_gelu else "gelu", "given",
                         vision_heads, text_heads)


def convert_bare(tensors: Mapping[str, np.ndarray], activation: str, activation_from: str,
                  vision_heads: int | None, text_heads: int | None) -> tuple[dict, dict]:
    """``(model block, params)`` of a bare CLIP state dict with ``activation`` (and where it
    came from, for the warning) and the heads given or ``None`` (``width // 64``); warns
    (:class:`AssumptionWarning`) with what was assumed."""
    config = state_dict_architecture(tensors, activation=activation, vision_heads=vision_heads,
                          text_heads=text_heads)
    params = params_from_state_dict(config, tensors)
    warnings.warn(_assumptions(config, heads_given=(vision_heads is not None,
                                                    text_heads is not None),
                               activation_from=activation_from), AssumptionWarning,
                  stacklevel=3)
    return config, params


def summary(config: Mapping[str, Any]) -> str:
    """One line of a converted block: its towers and ``embed_dim``."""
    return occ.describe(config) + f"; embed_dim {config['embed_dim']}"


# --- the activation of a bare file ---------------------------------------------------------------

def _quick_gelu_from_name(path: str) -> bool | None:
    """True for a file named ``*quickgelu*`` or ``*openai*``; for a TorchScript archive, its
    modules (:func:`.state_dict_files.torchscript_activation`); None when the file says nothing."""
    if not path.endswith(".safetensors") and os.path.isfile(path) and is_torchscript(path):
        activation = torchscript_activation(path)
        if activation is not None:
            return activation == "quick_gelu"
    name = os.path.basename(path).lower().replace("_", "").replace("-", "")
    if "quickgelu" in name or "openai" in name:
        return True
    return None


def bare_activation(path: str, quick_gelu: bool | None) -> tuple[str, str]:
    """``(activation, where it came from)`` of a bare checkpoint file."""
    if quick_gelu is not None:
        return ("quick_gelu" if quick_gelu else "gelu"), "as given: --quick_gelu / quick_gelu="
    if not path.endswith(".safetensors") and os.path.isfile(path) and is_torchscript(path):
        activation = torchscript_activation(path)
        if activation is not None:
            return activation, "read from the TorchScript archive's modules"
    if _quick_gelu_from_name(path):
        return "quick_gelu", f"assumed from the file name {os.path.basename(path)!r}"
    raise ConfigError(
        f"cannot tell from {os.path.basename(path)!r} whether the checkpoint uses QuickGELU: "
        "pass quick_gelu=True (--quick_gelu=true) for OpenAI's weights and open_clip's "
        "*-quickgelu models, quick_gelu=False for models trained with exact GELU (e.g. "
        f"open_clip's ViT-B-32 on LAION-2B); or {CONFIG_HINT}")
