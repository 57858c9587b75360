"""The table of open_clip tensors a ``dual_encoder`` block has: each tensor's name, shape and
the parameters it holds, in which layout (:func:`rules`).

One table serves both directions of :mod:`.tensor_layouts`:
:func:`~.tensor_layouts.params_from_state_dict` (open_clip -> the ``dual_encoder``'s
parameters, for the importers) and :func:`~.tensor_layouts.state_dict_from_params` (the
parameters -> what open_clip's ``model.state_dict()`` holds, for :mod:`.clip_export`). The
rules follow the ``model`` block ([OpenCLIP], [timm], [SigLIP] in docs/references.md); two
layouts of the image tower:

* **open_clip's own** ``VisionTransformer`` (``visual.*``; a ``vit`` with ``class_token=True``):
  ``conv1`` (no bias), ``class_embedding``, ``positional_embedding``, ``ln_pre`` (with
  ``pre_norm``), ``transformer.resblocks.i``, ``ln_post``, ``proj``;
* a **timm** ``VisionTransformer`` trunk (``visual.trunk.*``; a ``vit`` with
  ``class_token=False``, open_clip's SigLIP models): ``patch_embed.proj`` (with bias),
  ``pos_embed``, ``blocks.i`` (``norm1``, ``attn.qkv``, ``attn.proj``, ``norm2``,
  ``mlp.fc1``, ``mlp.fc2``), ``norm`` and, with ``pool="map"``, ``attn_pool`` (timm's
  ``AttentionPoolLatent``: ``latent``, ``q``, ``kv``, ``proj``, ``norm``, ``mlp.fc1/fc2``);
  the image projection is ``visual.head.proj`` (open_clip's ``timm_proj="linear"``) or none
  (``timm_proj="none"``, SigLIP: the trunk's width is the embedding).

The text tower is open_clip's ``TextTransformer``: ``token_embedding``,
``positional_embedding``, ``transformer.resblocks.i``, ``ln_final`` and ``text_projection``
(a ``(width, embed_dim)`` Parameter, an ``nn.Linear`` with bias with ``proj_bias``, or none),
with the prefix ``text.`` in a ``CustomTextCLIP`` (:func:`custom_text`: the timm layout, as
open_clip's SigLIP configs). Then ``logit_scale`` (``log_scale``) and, with ``siglip``,
``logit_bias`` (``bias``).

Layouts: a torch Linear's ``weight (out, in)`` is the transposed Flax kernel; the patch
convolution OIHW is HWIO; a fused ``(3 width, width)`` q/k/v projection (torch's
``in_proj_weight``, timm's ``qkv``; timm's ``kv`` has 2 parts) is split into parts of
``width`` rows, each output dimension head-major ``(heads, width / heads)`` (torch splits
heads that way); the attention's output projection ``(width, width)`` is Flax's
``(heads, width / heads, width)`` kernel; LayerNorm ``weight`` is ``scale``.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models import architecture_block

Path = tuple[str | int, ...]
# settings of the dual encoder and its towers that the models read, with the defaults of the
# spec where a class does not (yet) declare them
_DUAL_DEFAULTS = {"sample_projection": "linear", "text_projection": "linear", "siglip": False}
_VIT_DEFAULTS = {"norm_after_pool": False}
_TEXT_DEFAULTS = {"eos_id": None}


@dataclasses.dataclass(frozen=True)
class Rule:
    """One open_clip tensor ``source`` of shape ``shape`` and the parameters it holds:
    ``targets`` (``(path, shape)`` each), ``split(tensor) -> one array per target`` and its
    inverse ``join(arrays) -> tensor``."""

    source: str
    shape: tuple[int, ...]
    targets: tuple[tuple[Path, tuple[int, ...]], ...]
    split: Callable[[np.ndarray], Sequence[np.ndarray]]
    join: Callable[[Sequence[np.ndarray]], np.ndarray]


def _defaults(cls) -> dict[str, Any]:
    return {name: p.default for name, p in inspect.signature(cls.__init__).parameters.items()
            if p.default is not inspect.Parameter.empty}


def resolved(model_block: Mapping[str, Any]) -> dict[str, Any]:
    """The ``dual_encoder`` block with every setting the rules read filled in with the
    models' defaults (``sample_encoder`` / ``text_encoder`` likewise); anything but a
    ``dual_encoder`` of a ``vit`` and a ``text_transformer`` is a :class:`ConfigError` naming
    the setting."""
    from contrastive_jax.training.models import ENCODERS, DualEncoder

    block = architecture_block(model_block)
    if block.get("name") != "dual_encoder":
        raise ConfigError(f"model.name = {block.get('name')!r}: only a dual_encoder (an image "
                          "tower and a text tower) has an open_clip counterpart")
    out = {**_DUAL_DEFAULTS, **_defaults(DualEncoder), **block}
    for key, name, extra in (("sample_encoder", "vit", _VIT_DEFAULTS),
                             ("text_encoder", "text_transformer", _TEXT_DEFAULTS)):
        tower = dict(block.get(key) or {})
        if tower.get("name") != name:
            raise ConfigError(
                f"model.{key}.name = {tower.get('name')!r}: open_clip's towers are a ViT "
                f"(sample_encoder 'vit') and a Transformer text tower (text_encoder "
                f"'text_transformer'); a {tower.get('name')!r} has no open_clip counterpart")
        out[key] = {**extra, **_defaults(ENCODERS[name]), **tower}
    return out


def custom_text(model_block: Mapping[str, Any]) -> bool:
    """Whether open_clip holds this model as a ``CustomTextCLIP`` (text tower under
    ``text.``): with a timm image trunk (``class_token=False``), as open_clip's SigLIP
    configs; a ``CLIP`` otherwise."""
    return not resolved(model_block)["sample_encoder"]["class_token"]


def hidden_width(tower: Mapping[str, Any]) -> int:
    """The MLP's hidden width of a resolved tower block (``mlp_width`` or ``mlp_ratio *
    width``, :func:`~contrastive_jax.training.models.encoders.transformer.mlp_hidden`)."""
    from contrastive_jax.training.models.encoders.transformer import mlp_hidden

    return mlp_hidden(tower["width"], tower["mlp_ratio"], tower.get("mlp_width"))


# --- rule constructors -----------------------------------------------------------------------

def _same(source: str, shape, path: Path) -> Rule:
    return Rule(source, tuple(shape), ((path, tuple(shape)),), lambda w: [w], lambda a: a[0])


def _reshaped(source: str, shape, path: Path, ours) -> Rule:
    shape, ours = tuple(shape), tuple(ours)
    return Rule(source, shape, ((path, ours),), lambda w: [w.reshape(ours)],
                lambda a: a[0].reshape(shape))


def _transposed(source: str, shape, path: Path) -> Rule:
    """torch Linear ``weight (out, in)`` <-> Flax ``kernel (in, out)``."""
    return Rule(source, tuple(shape), ((path, tuple(shape)[::-1]),), lambda w: [w.T],
                lambda a: a[0].T)


def _linear(source: str, path: Path, d_in: int, d_out: int, bias: bool = True) -> list[Rule]:
    rules = [_transposed(f"{source}.weight", (d_out, d_in), (*path, "kernel"))]
    if bias:
        rules.append(_same(f"{source}.bias", (d_out,), (*path, "bias")))
    return rules


def _layer_norm(source: str, path: Path, width: int) -> list[Rule]:
    return [_same(f"{source}.weight", (width,), (*path, "scale")),
            _same(f"{source}.bias", (width,), (*path, "bias"))]


def _fused_heads(source: str, path: Path, parts: Sequence[str], width: int,
                 heads: int) -> list[Rule]:
    """A fused projection ``weight (len(parts) width, width)`` / ``bias`` into the kernels
    ``(width, heads, width / heads)`` / biases ``(heads, width / heads)`` of ``parts``."""
    n, d = len(parts), width // heads
    kernels = tuple(((*path, p, "kernel"), (width, heads, d)) for p in parts)
    biases = tuple(((*path, p, "bias"), (heads, d)) for p in parts)
    return [
        Rule(f"{source}weight", (n * width, width), kernels,
             lambda w: [w[j * width:(j + 1) * width].T.reshape(width, heads, d)
                        for j in range(n)],
             lambda a: np.concatenate([k.reshape(width, width).T for k in a], axis=0)),
        Rule(f"{source}bias", (n * width,), biases,
             lambda b: [b[j * width:(j + 1) * width].reshape(heads, d) for j in range(n)],
             lambda a: np.concatenate([x.reshape(width) for x in a], axis=0)),
    ]


def _attention_out(source: str, path: Path, width: int, heads: int) -> list[Rule]:
    """The output projection ``weight (width, width)`` <-> ``kernel (heads, width / heads,
    width)`` (its input dimension head-major), and its bias."""
    d = width // heads
    return [Rule(f"{source}.weight", (width, width), (((*path, "kernel"), (heads, d, width)),),
                 lambda w: [w.T.reshape(heads, d, width)],
                 lambda a: a[0].reshape(width, width).T),
            _same(f"{source}.bias", (width,), (*path, "bias"))]


def _open_clip_blocks(prefix: str, path: Path, tower: Mapping[str, Any]) -> list[Rule]:
    """open_clip's ``ResidualAttentionBlock`` s (torch ``nn.MultiheadAttention``)."""
    width, heads, hidden = tower["width"], tower["heads"], hidden_width(tower)
    rules = []
    for i in range(tower["depth"]):
        s, t = f"{prefix}transformer.resblocks.{i}.", (*path, "blocks", i)
        rules += _layer_norm(s + "ln_1", (*t, "norm1"), width)
        rules += _fused_heads(s + "attn.in_proj_", (*t, "attention"),
                              ("query", "key", "value"), width, heads)
        rules += _attention_out(s + "attn.out_proj", (*t, "attention", "out"), width, heads)
        rules += _layer_norm(s + "ln_2", (*t, "norm2"), width)
        rules += _linear(s + "mlp.c_fc", (*t, "fc1"), width, hidden)
        rules += _linear(s + "mlp.c_proj", (*t, "fc2"), hidden, width)
    return rules


def _timm_blocks(prefix: str, path: Path, tower: Mapping[str, Any]) -> list[Rule]:
    """timm's ``Block`` s (``qkv`` fused, biases on, no LayerScale, no q/k norm)."""
    width, heads, hidden = tower["width"], tower["heads"], hidden_width(tower)
    rules = []
    for i in range(tower["depth"]):
        s, t = f"{prefix}blocks.{i}.", (*path, "blocks", i)
        rules += _layer_norm(s + "norm1", (*t, "norm1"), width)
        rules += _fused_heads(s + "attn.qkv.", (*t, "attention"), ("query", "key", "value"),
                              width, heads)
        rules += _attention_out(s + "attn.proj", (*t, "attention", "out"), width, heads)
        rules += _layer_norm(s + "norm2", (*t, "norm2"), width)
        rules += _linear(s + "mlp.fc1", (*t, "fc1"), width, hidden)
        rules += _linear(s + "mlp.fc2", (*t, "fc2"), hidden, width)
    return rules


# --- the towers --------------------------------------------------------------------------------

def _refuse(option: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"{option} = {value!r}: {why}")


def _vision_rules(model: Mapping[str, Any]) -> list[Rule]:
    vit, embed = model["sample_encoder"], model["embed_dim"]
    width, patch, channels = vit["width"], vit["patch"], vit["in_channels"]
    where = "model.sample_encoder"
    if vit["features"] is not None:
        raise _refuse(f"{where}.features", vit["features"],
                      "open_clip's image towers have no output layer of their own; only "
                      "features=None (the dual encoder's projection is open_clip's) can be "
                      "expressed")
    if channels != 3:
        raise _refuse(f"{where}.in_channels", channels, "open_clip's image towers take RGB "
                      "images (3 channels)")
    grid = (vit["image_size"] // patch) ** 2
    v = ("sample_encoder",)
    projection = model["sample_projection"]
    if vit["class_token"]:  # open_clip's own VisionTransformer
        if vit["pool"] not in ("token", "mean"):
            raise _refuse(f"{where}.pool", vit["pool"], "open_clip's VisionTransformer pools "
                          "at the class token ('token') or over the patch tokens ('mean'); "
                          "timm's map head needs class_token=False")
        if vit["patch_bias"]:
            raise _refuse(f"{where}.patch_bias", True, "open_clip's VisionTransformer has a "
                          "patch convolution without bias (set patch_bias=False)")
        rules = [
            Rule("visual.conv1.weight", (width, channels, patch, patch),
                 (((*v, "embed", "kernel"), (patch, patch, channels, width)),),
                 lambda w: [w.transpose(2, 3, 1, 0)], lambda a: a[0].transpose(3, 2, 0, 1)),
            _reshaped("visual.class_embedding", (width,), (*v, "class_embedding"),
                      (1, 1, width)),
            _reshaped("visual.positional_embedding", (grid + 1, width), (*v, "positions"),
                      (1, grid + 1, width)),
        ]
        if vit["pre_norm"]:
            rules += _layer_norm("visual.ln_pre", (*v, "norm_pre"), width)
        rules += _open_clip_blocks("visual.", v, vit)
        rules += _layer_norm("visual.ln_post", (*v, "norm"), width)
        if projection == "linear":
            rules.append(_same("visual.proj", (width, embed), ("sample_proj", "kernel")))
        elif projection == "none":  # open_clip always multiplies by proj: the identity
            if width != embed:
                raise _refuse("model.sample_projection", "none", f"the image tower's width "
                              f"{width} must equal embed_dim {embed}")
            rules.append(Rule("visual.proj", (width, embed), (), lambda w: [],
                              lambda a: np.eye(width, dtype=np.float32)))
        else:
            raise _refuse("model.sample_projection", projection, "open_clip's "
                          "VisionTransformer projects with proj, without bias ('linear')")
        return rules
    # a timm VisionTransformer trunk (open_clip's TimmModel)
    if vit["pool"] not in ("map", "mean"):
        raise _refuse(f"{where}.pool", vit["pool"], "without a class token the image tower "
                      "is a timm trunk, pooled by timm's map head ('map') or its average "
                      "('mean')")
    if vit["pre_norm"]:
        raise _refuse(f"{where}.pre_norm", True, "timm's SigLIP trunks have no LayerNorm "
                      "before the blocks (set pre_norm=False, or class_token=True for "
                      "open_clip's own VisionTransformer)")
    if not vit["patch_bias"]:
        raise _refuse(f"{where}.patch_bias", False, "timm's trunks have a patch convolution "
                      "with bias (set patch_bias=True)")
    s = "visual.trunk."
    rules = [
        Rule(f"{s}patch_embed.proj.weight", (width, channels, patch, patch),
             (((*v, "embed", "kernel"), (patch, patch, channels, width)),),
             lambda w: [w.transpose(2, 3, 1, 0)], lambda a: a[0].transpose(3, 2, 0, 1)),
        _same(f"{s}patch_embed.proj.bias", (width,), (*v, "embed", "bias")),
        _same(f"{s}pos_embed", (1, grid, width), (*v, "positions")),
        *_timm_blocks(s, v, vit),
        *_layer_norm(f"{s}norm", (*v, "norm"), width),
    ]
    if vit["pool"] == "map":
        m, heads, hidden = (*v, "map_head"), vit["heads"], hidden_width(vit)
        rules += [_same(f"{s}attn_pool.latent", (1, 1, width), (*m, "latent")),
                  *_fused_heads(f"{s}attn_pool.q.", (*m, "attention"), ("query",), width,
                                heads),
                  *_fused_heads(f"{s}attn_pool.kv.", (*m, "attention"), ("key", "value"),
                                width, heads),
                  *_attention_out(f"{s}attn_pool.proj", (*m, "attention", "out"), width,
                                  heads),
                  *_layer_norm(f"{s}attn_pool.norm", (*m, "norm"), width),
                  *_linear(f"{s}attn_pool.mlp.fc1", (*m, "fc1"), width, hidden),
                  *_linear(f"{s}attn_pool.mlp.fc2", (*m, "fc2"), hidden, width)]
    if projection in ("linear", "linear_bias"):  # open_clip's timm_proj="linear"
        rules += _linear("visual.head.proj", ("sample_proj",), width, embed,
                         bias=projection == "linear_bias")
    elif projection == "none":
        if width != embed:
            raise _refuse("model.sample_projection", "none", f"the image tower's width "
                          f"{width} must equal embed_dim {embed}")
    else:
        raise _refuse("model.sample_projection", projection, "valid: 'linear', "
                      "'linear_bias', 'none'")
    return rules


def _text_rules(model: Mapping[str, Any], prefix: str) -> list[Rule]:
    txt, embed = model["text_encoder"], model["embed_dim"]
    where = "model.text_encoder"
    if txt["features"] is not None:
        raise _refuse(f"{where}.features", txt["features"], "open_clip's text tower has no "
                      "output layer of its own; only features=None can be expressed")
    if txt["pool"] not in ("argmax", "last", "first", "eos"):
        raise _refuse(f"{where}.pool", txt["pool"], "open_clip's text tower selects one "
                      "position ('argmax', 'last', 'first', 'eos'); mean pooling over the "
                      "non-zero ids has no open_clip counterpart")
    width = txt["width"]
    t = ("text_encoder",)
    rules = [
        _same(f"{prefix}token_embedding.weight", (txt["vocab_size"], width),
              (*t, "tokens", "embedding")),
        _reshaped(f"{prefix}positional_embedding", (txt["max_tokens"], width),
                  (*t, "positions"), (1, txt["max_tokens"], width)),
        *_open_clip_blocks(prefix, t, txt),
        *_layer_norm(f"{prefix}ln_final", (*t, "norm"), width),
    ]
    projection = model["text_projection"]
    if projection == "linear":
        rules.append(_same(f"{prefix}text_projection", (width, embed), ("text_proj", "kernel")))
    elif projection == "linear_bias":
        rules += _linear(f"{prefix}text_projection", ("text_proj",), width, embed)
    elif projection == "none":
        if width != embed:
            raise _refuse("model.text_projection", "none", f"the text tower's width {width} "
                          f"must equal embed_dim {embed}")
    else:
        raise _refuse("model.text_projection", projection, "valid: 'linear', 'linear_bias', "
                      "'none'")
    return rules


def rules(model_block: Mapping[str, Any]) -> list[Rule]:
    """Every open_clip tensor of the model ``model_block`` builds and the parameters it holds
    (see the module docstring); a setting open_clip's layouts cannot hold is a
    :class:`ConfigError` naming it."""
    model = resolved(model_block)
    prefix = "text." if custom_text(model) else ""
    out = [*_vision_rules(model), *_text_rules(model, prefix),
           _same("logit_scale", (), ("log_scale",))]
    if model["siglip"]:
        out.append(_same("logit_bias", (), ("bias",)))
    return out


def describe_sizes(model: Mapping[str, Any]) -> str:
    """One line of a dual encoder block's sizes, for messages about tensors and shapes."""
    v, t = model["sample_encoder"], model["text_encoder"]
    return (f"image {v['image_size']} patch {v['patch']} width {v['width']} depth "
            f"{v['depth']} heads {v['heads']} pool {v.get('pool', 'mean')!r}; text context "
            f"{t['max_tokens']} vocab {t['vocab_size']} width {t['width']} depth {t['depth']} "
            f"heads {t['heads']}; embed_dim {model['embed_dim']}")
