"""Every option of an open_clip model config, in one of three tables ([OpenCLIP] in
docs/references.md; docs/open_clip_models.md lists them with open_clip's defaults):

* converted (:data:`VISION_CONVERTED`, :data:`TEXT_CONVERTED`, :data:`MODEL_CONVERTED`): the
  ``dual_encoder`` block computes what open_clip computes
  (:func:`~.model_configs.model_block`);
* no effect on the features at inference (:data:`VISION_NO_EFFECT`, :data:`TEXT_NO_EFFECT`,
  :data:`MODEL_NO_EFFECT`): training-only settings (dropout, patch dropout, stochastic depth),
  initial values the checkpoint replaces, the tokenizer (not part of the model), settings
  open_clip reads only together with another option; accepted, and listed in the notes when set;
* refused unless at open_clip's default (:data:`VISION_REFUSED`, :data:`TEXT_REFUSED`,
  :data:`MODEL_REFUSED`): :func:`refusal`, a :class:`ConfigError` ``open_clip option
  vision_cfg.X = V is not supported (why; supported: ...)``.

An option open_clip does not know (not a field of its dataclasses) is refused too
(:func:`check_fields`). The standard library only, as :mod:`.model_sources`.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models.converters.open_clip.model_sources import json_text, recorded

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


def refusal(option: str, value: Any, why: str, supported: str) -> ConfigError:
    """``open_clip option OPTION = VALUE is not supported (WHY; supported: SUPPORTED)``."""
    why = f"{why}; " if why else ""
    return ConfigError(f"open_clip option {option} = {json_text(value)} is not supported "
                       f"({why}supported: {supported})")


def supported_values(values: tuple) -> str:
    """The supported values of a refused option, as JSON joined by 'or'."""
    return " or ".join(json_text(v) for v in values)


def check_fields(cfg: Mapping[str, Any], where: str, known: Mapping[str, Any],
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
                          supported_values(refused[key][0]))
        if key in no_effect and value != known[key]:
            notes.append(f"{where}.{key} = {json_text(value)}: no effect at inference "
                         f"({no_effect[key]})")
    return notes


def square_size(value: Any, option: str, what: str) -> int:
    """An int, or a pair of equal ints, as one int (an image or patch size of the square ViT);
    anything else is the :func:`refusal` of ``option``."""
    if isinstance(value, list | tuple) and len(value) == 2 and value[0] == value[1]:
        value = value[0]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise refusal(option, value, f"the ViT takes square {what}", "a positive int or "
                      "[n, n]")
    return value
