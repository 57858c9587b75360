"""Import an OpenAI CLIP or open_clip ViT-CLIP checkpoint as this project's dual encoder.

    python -m contrastive_jax.training.models.converters.clip_import \\
        --checkpoint=FILE --output=DIR [--quick_gelu=true|false] [--vision_heads=N] [--text_heads=N]
        [--allow_torchscript]

reads a CLIP state dict the user already has (nothing is downloaded): a ``.safetensors`` file
(read with safetensors' NumPy API, no PyTorch) or a PyTorch ``.pt`` / ``.pth`` / ``.bin`` file
(an OpenAI TorchScript archive or a pickled state dict; needs PyTorch). The architecture is read
from the tensors' shapes (:func:`architecture`), every tensor is mapped to a parameter of
:class:`~contrastive_jax.training.models.DualEncoder` with the CLIP options of
:class:`~.transformer.ViT` and :class:`~.transformer.TextTransformer` (:func:`convert`), and
``DIR`` receives (:func:`save_converted`)::

    DIR/model.json   the config's ``model`` block (a dual_encoder) that builds exactly this
                     architecture with build_model
    DIR/params/      orbax StandardCheckpointer save of nnx.to_pure_dict of the model's
                     nnx.Param state (float32)
    DIR/preprocess.json  the pixels the model expects: CLIP's mean and std, bicubic, its
                     image size (a run starting from DIR takes the mean and std)

What cannot be matched is a :class:`ConfigError` naming the first tensor concerned: one with a
shape the architecture does not predict, one the architecture needs that is missing, or one no
parameter takes (e.g. a ResNet image tower's). The model computes what open_clip's
``CLIP.encode_image`` / ``encode_text`` compute ([CLIP], [OpenCLIP] in docs/references.md),
images as ``(B, H, W, 3)`` already resized and normalised as the checkpoint expects
(:data:`OPENAI_MEAN`, :data:`OPENAI_STD` for OpenAI's and most open_clip weights);
docs/pretrained.md gives the recipe and the parity numbers.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from absl import flags

from contrastive_jax import command_line
from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models.converters.converted_directory import save_converted
from contrastive_jax.training.models.converters.state_dict_files import (
    is_torchscript,
    load_state_dict,
)

# CLIP's image normalisation (open_clip's OPENAI_DATASET_MEAN / _STD), RGB, for pixels in [0, 1]
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
# CLIP's attention heads are width / 64 except where a model config says otherwise
HEAD_WIDTH = 64
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, CLIP's
# entries of OpenAI's TorchScript state dict that are not parameters, and a buffer
IGNORED = ("input_resolution", "context_length", "vocab_size", "attn_mask")
_BLOCK = re.compile(r"^(visual\.)?transformer\.resblocks\.(\d+)\.")


def _tensor(tensors: Mapping[str, np.ndarray], name: str, ndim: int) -> np.ndarray:
    if name not in tensors:
        raise ConfigError(f"the checkpoint has no tensor {name!r}, which a ViT CLIP has; "
                          "supported: OpenAI's ViT CLIP and open_clip's CLIP with its own "
                          "VisionTransformer and TextTransformer")
    if tensors[name].ndim != ndim:
        raise ConfigError(f"tensor {name!r} has shape {tensors[name].shape}; a ViT CLIP's has "
                          f"{ndim} dimensions")
    return tensors[name]


def _depth(tensors: Mapping[str, np.ndarray], visual: bool) -> int:
    found = {int(m.group(2)) for m in map(_BLOCK.match, tensors)
             if m and bool(m.group(1)) == visual}
    return max(found) + 1 if found else 0


def architecture(tensors: Mapping[str, np.ndarray], *, quick_gelu: bool,
                 vision_heads: int | None = None, text_heads: int | None = None
                 ) -> dict[str, Any]:
    """The ``model`` config block (a ``dual_encoder``) of the CLIP whose state dict is
    ``tensors``, read from shapes (names as OpenAI's / open_clip's ``CLIP``):

    * image tower: ``visual.conv1.weight (width, C, patch, patch)``,
      ``visual.positional_embedding ((image_size / patch)^2 + 1, width)``, the number of
      ``visual.transformer.resblocks.i``, the MLP's hidden width from ``c_fc``;
    * text tower: ``token_embedding.weight (vocab_size, width)``,
      ``positional_embedding (context_length, width)``, ``transformer.resblocks.i``;
    * ``embed_dim`` from ``text_projection (width, embed_dim)``; the temperature from
      ``logit_scale`` (``init_temperature = exp(-logit_scale)``; the parameter takes the value).

    Heads cannot be read from shapes: ``width // 64`` (CLIP's rule) unless ``vision_heads`` /
    ``text_heads`` say otherwise (open_clip's ViT-H-14, ViT-g-14 and ViT-bigG-14 image towers
    have 16 heads of width 80, 88 and 104). ``quick_gelu``: the checkpoint's activation
    (True: OpenAI's weights and open_clip's ``*-quickgelu`` models; False: exact GELU).
    """
    if any(k.startswith(("visual.layer1.", "visual.attnpool.")) for k in tensors):
        raise ConfigError("this is a ResNet CLIP (it has visual.layer1 / visual.attnpool "
                          "tensors); only ViT image towers can be imported")
    if any(k.startswith("visual.trunk.") for k in tensors):
        raise ConfigError("this open_clip model has a timm image tower (visual.trunk.*); only "
                          "CLIP's own VisionTransformer can be imported")
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
    activation = "quick_gelu" if quick_gelu else "gelu"
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


def _rules(config: Mapping[str, Any]):
    """``(target path, source tensor, source shape, transform)`` for every parameter."""
    vit, txt = config["sample_encoder"], config["text_encoder"]

    def layer_norm(target, source, width):
        return [((*target, "scale"), f"{source}.weight", (width,), _same),
                ((*target, "bias"), f"{source}.bias", (width,), _same)]

    def blocks(target, source, tower):
        width, heads = tower["width"], tower["heads"]
        hidden = tower.get("mlp_width") or tower["mlp_ratio"] * width
        head_dim = width // heads
        rules = []
        for i in range(tower["depth"]):
            t, s = (*target, "blocks", i), f"{source}transformer.resblocks.{i}."
            rules += layer_norm((*t, "norm1"), s + "ln_1", width)
            for j, name in enumerate(("query", "key", "value")):
                rules += [
                    ((*t, "attention", name, "kernel"), s + "attn.in_proj_weight",
                     (3 * width, width), _qkv_kernel(j, width, heads)),
                    ((*t, "attention", name, "bias"), s + "attn.in_proj_bias", (3 * width,),
                     _qkv_bias(j, width, heads))]
            rules += [
                ((*t, "attention", "out", "kernel"), s + "attn.out_proj.weight", (width, width),
                 lambda w, h=heads, d=head_dim: w.T.reshape(h, d, w.shape[0])),
                ((*t, "attention", "out", "bias"), s + "attn.out_proj.bias", (width,), _same)]
            rules += layer_norm((*t, "norm2"), s + "ln_2", width)
            rules += [((*t, "fc1", "kernel"), s + "mlp.c_fc.weight", (hidden, width), _t),
                      ((*t, "fc1", "bias"), s + "mlp.c_fc.bias", (hidden,), _same),
                      ((*t, "fc2", "kernel"), s + "mlp.c_proj.weight", (width, hidden), _t),
                      ((*t, "fc2", "bias"), s + "mlp.c_proj.bias", (width,), _same)]
        return rules

    wv, wt, patch = vit["width"], txt["width"], vit["patch"]
    tokens_v = (vit["image_size"] // patch) ** 2 + 1
    v, t = ("sample_encoder",), ("text_encoder",)
    return [
        ((*v, "embed", "kernel"), "visual.conv1.weight", (wv, vit["in_channels"], patch, patch),
         lambda w: w.transpose(2, 3, 1, 0)),  # torch OIHW -> Flax HWIO
        ((*v, "class_embedding"), "visual.class_embedding", (wv,), lambda w: w[None, None]),
        ((*v, "positions"), "visual.positional_embedding", (tokens_v, wv), lambda w: w[None]),
        *layer_norm((*v, "norm_pre"), "visual.ln_pre", wv),
        *blocks(v, "visual.", vit),
        *layer_norm((*v, "norm"), "visual.ln_post", wv),
        (("sample_proj", "kernel"), "visual.proj", (wv, config["embed_dim"]), _same),
        ((*t, "tokens", "embedding"), "token_embedding.weight", (txt["vocab_size"], wt), _same),
        ((*t, "positions"), "positional_embedding", (txt["max_tokens"], wt), lambda w: w[None]),
        *blocks(t, "", txt),
        *layer_norm((*t, "norm"), "ln_final", wt),
        (("text_proj", "kernel"), "text_projection", (wt, config["embed_dim"]), _same),
        (("log_scale",), "logit_scale", (), _same),
    ]


def _same(w: np.ndarray) -> np.ndarray:
    return w


def _t(w: np.ndarray) -> np.ndarray:
    """torch Linear ``(out, in)`` -> Flax kernel ``(in, out)``."""
    return w.T


def _qkv_kernel(j: int, width: int, heads: int) -> Callable[[np.ndarray], np.ndarray]:
    """Rows ``[j width, (j+1) width)`` of torch's ``in_proj_weight (3 width, width)`` (q, k, v)
    as Flax's ``(width, heads, width / heads)`` kernel (torch splits the outputs head-major)."""
    return lambda w: w[j * width:(j + 1) * width].T.reshape(width, heads, width // heads)


def _qkv_bias(j: int, width: int, heads: int) -> Callable[[np.ndarray], np.ndarray]:
    return lambda b: b[j * width:(j + 1) * width].reshape(heads, width // heads)


def convert_state_dict(tensors: Mapping[str, np.ndarray], *, quick_gelu: bool,
                       vision_heads: int | None = None, text_heads: int | None = None
                       ) -> tuple[dict[str, Any], dict]:
    """``(model config, params)`` of a CLIP state dict (names and shapes as
    :func:`architecture`); ``params`` is the nested pure dict of the model's ``nnx.Param``
    state (``nnx.to_pure_dict``), float32 NumPy arrays.

    Mapping: Linear weights transposed (torch ``(out, in)``, Flax ``(in, out)``); the patch
    convolution OIHW -> HWIO; ``in_proj_weight`` split into q, k, v and each output dimension
    into ``(heads, width / heads)``; ``out_proj`` into ``(heads, width / heads, width)``;
    ``proj`` and ``text_projection`` (already ``x @ proj``) as the dual encoder's projections;
    LayerNorm ``weight`` -> ``scale``. A tensor whose shape is not the architecture's, a missing
    one or one that nothing takes is a :class:`ConfigError` naming it.
    """
    config = architecture(tensors, quick_gelu=quick_gelu, vision_heads=vision_heads,
                          text_heads=text_heads)
    params: dict = {}
    used = set(IGNORED)
    for target, source, shape, transform in _rules(config):
        if source not in tensors:
            raise ConfigError(f"the checkpoint has no tensor {source!r}, which the architecture "
                              f"read from it needs ({_summary(config)})")
        value = tensors[source]
        if value.shape != shape:
            raise ConfigError(f"tensor {source!r} has shape {value.shape}; the architecture "
                              f"read from the checkpoint ({_summary(config)}) needs {shape}")
        node = params
        for key in target[:-1]:
            node = node.setdefault(key, {})
        node[target[-1]] = np.array(transform(value), np.float32, order="C")
        used.add(source)
    unused = [name for name in tensors if name not in used]
    if unused:
        raise ConfigError(f"tensor {unused[0]!r} of the checkpoint has no place in a ViT CLIP "
                          f"({len(unused)} unused: {unused[:5]}); supported: OpenAI's ViT CLIP "
                          "and open_clip's CLIP with its own VisionTransformer and "
                          "TextTransformer")
    _check_against_model(config, params)
    return config, params


def _summary(config: Mapping[str, Any]) -> str:
    v, t = config["sample_encoder"], config["text_encoder"]
    return (f"image {v['image_size']} patch {v['patch']} width {v['width']} depth {v['depth']} "
            f"heads {v['heads']}; text context {t['max_tokens']} vocab {t['vocab_size']} "
            f"width {t['width']} depth {t['depth']} heads {t['heads']}; "
            f"embed_dim {config['embed_dim']}")


def _check_against_model(config: Mapping[str, Any], params: dict) -> None:
    """The converted tree has exactly the structure and shapes of the model ``config`` builds
    (abstractly, nothing is initialised); a difference is a bug of this module."""
    import jax
    from flax import nnx

    from contrastive_jax.training.models import build_model

    model = nnx.eval_shape(lambda: build_model(config, nnx.Rngs(0)))
    expected = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    want = {jax.tree_util.keystr(k): x.shape
            for k, x in jax.tree_util.tree_leaves_with_path(expected)}
    got = {jax.tree_util.keystr(k): x.shape
           for k, x in jax.tree_util.tree_leaves_with_path(params)}
    if want != got:
        diff = sorted(set(want.items()) ^ set(got.items()))
        raise AssertionError(f"converted parameters do not match the model: {diff[:4]}")


def _quick_gelu_from_name(path: str) -> bool | None:
    """True for OpenAI's TorchScript archives and files named ``*quickgelu*`` or ``*openai*``;
    None when the file says nothing."""
    name = os.path.basename(path).lower().replace("_", "").replace("-", "")
    if "quickgelu" in name or "openai" in name:
        return True
    if not path.endswith(".safetensors") and os.path.isfile(path) and is_torchscript(path):
        return True
    return None


def convert(path: str | os.PathLike, *, quick_gelu: bool | None = None,
            vision_heads: int | None = None, text_heads: int | None = None,
            allow_torchscript: bool = False) -> tuple[dict[str, Any], dict]:
    """``(model config, params)`` of the CLIP checkpoint file at ``path``
    (:func:`load_state_dict`, :func:`convert_state_dict`; a TorchScript archive only with
    ``allow_torchscript=True``: loading one runs code stored in it).

    ``quick_gelu=None``: True for an OpenAI TorchScript archive or a file name containing
    ``quickgelu`` or ``openai``; otherwise a :class:`ConfigError` asking for it (shapes do not
    tell GELU from QuickGELU, and the wrong one changes every output).
    """
    path = os.fspath(path)
    if quick_gelu is None:
        quick_gelu = _quick_gelu_from_name(path)
    if quick_gelu is None:
        raise ConfigError(
            f"cannot tell from {os.path.basename(path)!r} whether the checkpoint uses QuickGELU: "
            "pass quick_gelu=True (--quick_gelu=true) for OpenAI's weights and open_clip's "
            "*-quickgelu models, quick_gelu=False for models trained with exact GELU (e.g. "
            "open_clip's ViT-B-32 on LAION-2B)")
    return convert_state_dict(load_state_dict(path, allow_torchscript=allow_torchscript),
                              quick_gelu=quick_gelu,
                              vision_heads=vision_heads, text_heads=text_heads)


FLAGS = flags.FlagValues()  # this command's own (contrastive_jax.command_line)
_CHECKPOINT = flags.DEFINE_string("checkpoint", None,
                                  ".safetensors, or .pt/.pth/.bin (needs PyTorch)",
                                  flag_values=FLAGS)
_OUTPUT = flags.DEFINE_string("output", None, "new directory to write", flag_values=FLAGS)
_QUICK_GELU = flags.DEFINE_bool(
    "quick_gelu", None, "true: QuickGELU (OpenAI, *-quickgelu); false: exact GELU; default: "
    "from the file (TorchScript or the name), else an error", flag_values=FLAGS)
_VISION_HEADS = flags.DEFINE_integer("vision_heads", None,
                                     "image tower heads (default width // 64)", flag_values=FLAGS)
_TEXT_HEADS = flags.DEFINE_integer("text_heads", None, "text tower heads (default width // 64)",
                                   flag_values=FLAGS)
_ALLOW_TORCHSCRIPT = flags.DEFINE_bool(
    "allow_torchscript", False, "read a TorchScript archive (OpenAI's release files) with "
    "torch.jit.load, which runs code stored in the file: only for a file you trust (refused "
    "without this flag)", flag_values=FLAGS)
COMMAND = command_line.Command(
    program="python -m contrastive_jax.training.models.converters.clip_import", doc=__doc__,
    flag_values=FLAGS, required=("checkpoint", "output"))


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (module docstring; ``argv``: its arguments, ``sys.argv[1:]`` when
    None): 0 when converted; an error a user can fix prints ``error: ...`` and returns 2
    (:func:`contrastive_jax.command_line.run`)."""
    return command_line.run(COMMAND, _convert_and_save, argv)


def _convert_and_save(positional: list[str]) -> None:
    """Convert ``--checkpoint`` into ``--output`` and print what was written."""
    config, params = convert(_CHECKPOINT.value, quick_gelu=_QUICK_GELU.value,
                             vision_heads=_VISION_HEADS.value, text_heads=_TEXT_HEADS.value,
                             allow_torchscript=_ALLOW_TORCHSCRIPT.value)
    vit = config["sample_encoder"]
    save_converted(_OUTPUT.value, config, params, preprocess={
        "mean": list(OPENAI_MEAN), "std": list(OPENAI_STD), "resize": "bicubic",
        "image_size": vit["image_size"]})
    import jax

    count = sum(int(np.prod(np.shape(x))) for x in jax.tree.leaves(params))
    print(f"wrote {_OUTPUT.value}: {count:,} parameters ({_summary(config)})")


if __name__ == "__main__":
    sys.exit(main())
