"""Import an OpenAI CLIP or open_clip checkpoint as this project's dual encoder.

    python -m contrastive_jax.training.models.converters.clip_import --output=DIR \\
        --checkpoint=FILE|DIR|hf-hub:ORG/NAME [--open_clip_config=FILE|DIR] [--model=NAME]
        [--pretrained=TAG] [--quick_gelu=true|false] [--vision_heads=N] [--text_heads=N]
        [--tokenizer=FILE] [--allow_torchscript]

reads a checkpoint the user already has (nothing is downloaded). With the model's open_clip
config, the architecture comes from it (:mod:`.open_clip_config`: heads, activation, pooling,
causal mask, LayerNorm epsilon, projections, MLP width, image size, logit bias; every open_clip
option converted exactly or refused by name; docs/open_clip_models.md): ``--open_clip_config``
(an ``open_clip_config.json``, a plain model config, or a directory holding one), ``--model``
(the name of one of open_clip's shipped configs, which the project records, with
``--pretrained``: a release, whose weights are then looked up in the local Hugging Face cache
when ``--checkpoint`` is not given), or ``--checkpoint`` itself as a hub-layout directory
(``open_clip_config.json`` + ``open_clip_model.safetensors`` / ``open_clip_pytorch_model.bin``),
a cache snapshot or ``hf-hub:ORG/NAME`` (the local cache: ``$HF_HUB_CACHE``, ``$HF_HOME/hub``,
``~/.cache/huggingface/hub``).

Without a config, a bare state dict (a ``.safetensors`` file, read with safetensors' NumPy API,
no PyTorch; or a ``.pt`` / ``.pth`` / ``.bin`` file, an OpenAI TorchScript archive or a
pickled state dict, read with PyTorch) is read as OpenAI's / open_clip's default ViT CLIP: sizes
from the tensors' shapes (:func:`architecture`), and CLIP's settings for what shapes do not
show (heads ``width // 64``, LayerNorm eps 1e-5, class-token pooling, a causal text mask with
argmax pooling, the activation from ``--quick_gelu``, the file name or the TorchScript
archive's modules), stated in an :class:`AssumptionWarning` (a ``warning:`` line from the
command). A checkpoint the converter can tell is not such a CLIP (a ResNet or timm image tower,
a Hugging Face text tower, a text projection with a bias, no ``ln_pre``, a logit bias) is
refused, asking for the config, before any question about flags.

Every tensor is mapped to a parameter of
:class:`~contrastive_jax.training.models.DualEncoder` by
:func:`.open_clip_tensors.params_from_state_dict` (a missing tensor, another shape, or one no
parameter takes is a :class:`ConfigError` naming it), and ``DIR`` receives
(:func:`~.converted_directory.save_converted`)::

    DIR/model.json   the config's ``model`` block (a dual_encoder) that builds exactly this
                     architecture with build_model
    DIR/params/      orbax StandardCheckpointer save of nnx.to_pure_dict of the model's
                     nnx.Param state (float32)
    DIR/preprocess.json  the pixels the model expects: mean and std, resize kernel, resize
                     mode and image size (the config's preprocess_cfg or release; CLIP's
                     without one); a run starting from DIR takes the mean and std
    DIR/tokenizer.json, DIR/tokenizer/  the model's tokenizer (``--tokenizer`` or the file
                     beside the weights: CLIP's BPE merges, SigLIP's ``spiece.model``), so
                     that :func:`contrastive_jax.pretrained.load_pretrained` gives a whole model

The model computes what open_clip's ``encode_image`` / ``encode_text`` compute ([CLIP],
[OpenCLIP], [SigLIP] in docs/references.md), images as ``(B, H, W, 3)`` already resized and
normalised as the checkpoint expects; docs/pretrained.md gives the recipe and the parity
numbers.
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import pickletools
import re
import sys
import warnings
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from absl import flags

from contrastive_jax import command_line
from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models.converters import open_clip_config as occ
from contrastive_jax.training.models.converters.converted_directory import save_converted
from contrastive_jax.training.models.converters.open_clip_tensors import (
    IGNORED,
    params_from_state_dict,
)
from contrastive_jax.training.models.converters.state_dict_files import (
    is_torchscript,
    load_state_dict,
)

# CLIP's image normalisation (open_clip's OPENAI_DATASET_MEAN / _STD), RGB, for pixels in [0, 1]
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
HEAD_WIDTH = occ.HEAD_WIDTH  # CLIP's heads are width / 64 except where a config says otherwise
LAYER_NORM_EPS = occ.TORCH_LAYER_NORM_EPS  # torch.nn.LayerNorm's default, CLIP's
_BLOCK = re.compile(r"^(visual\.)?transformer\.resblocks\.(\d+)\.")
CONFIG_HINT = ("pass the model's open_clip config: --open_clip_config=open_clip_config.json "
               "(or its directory), --model=NAME (docs/open_clip_models.md), or "
               "--checkpoint=the Hugging Face hub directory")

__all__ = ["IGNORED", "OPENAI_MEAN", "OPENAI_STD", "AssumptionWarning", "Converted",
           "architecture", "convert", "convert_open_clip", "convert_state_dict",
           "load_state_dict", "main", "not_a_clip", "torchscript_activation"]


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
        clipa = [n for n in occ.model_names()
                 if occ.recorded()["models"][n]["model_cfg"]["vision_cfg"].get("no_ln_pre")]
        return ("the checkpoint has no visual.ln_pre: open_clip's vision_cfg.no_ln_pre = true "
                f"(its CLIPA configs {clipa}, which also pool differently: 'avg' + "
                f"final_ln_after_pool, text pool 'last' without causal mask); {CONFIG_HINT}")
    return None


def architecture(tensors: Mapping[str, np.ndarray], *, quick_gelu: bool | None = None,
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
    :func:`.open_clip_config.head_exceptions`), LayerNorm eps 1e-5, class-token pooling after
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
    """``(model config, params)`` of a bare CLIP state dict (:func:`architecture`; an
    :class:`AssumptionWarning` states what shapes did not show); ``params`` is the nested pure
    dict of the model's ``nnx.Param`` state (``nnx.to_pure_dict``), float32 NumPy arrays, mapped
    by :func:`.open_clip_tensors.params_from_state_dict` (Linear weights transposed, the patch
    convolution OIHW -> HWIO, ``in_proj_weight`` split into q, k, v with head-major outputs,
    ``proj`` / ``text_projection`` as the dual encoder's projections, LayerNorm ``weight`` ->
    ``scale``). A tensor whose shape is not the architecture's, a missing one or one that
    nothing takes is a :class:`ConfigError` naming it.
    """
    return _convert_bare(tensors, "quick_gelu" if quick_gelu else "gelu", "given",
                         vision_heads, text_heads)


def _convert_bare(tensors: Mapping[str, np.ndarray], activation: str, activation_from: str,
                  vision_heads: int | None, text_heads: int | None) -> tuple[dict, dict]:
    config = architecture(tensors, activation=activation, vision_heads=vision_heads,
                          text_heads=text_heads)
    params = params_from_state_dict(config, tensors)
    warnings.warn(_assumptions(config, heads_given=(vision_heads is not None,
                                                    text_heads is not None),
                               activation_from=activation_from), AssumptionWarning,
                  stacklevel=3)
    return config, params


def _summary(config: Mapping[str, Any]) -> str:
    return occ.describe(config) + f"; embed_dim {config['embed_dim']}"


# --- the activation of a bare file ---------------------------------------------------------------

def _pickle_classes(data: bytes) -> set[str]:
    """``module.Class`` names a pickle refers to (its GLOBAL / STACK_GLOBAL opcodes), read with
    :mod:`pickletools` (nothing is unpickled or run)."""
    out, strings = set(), []
    for opcode, arg, _ in pickletools.genops(io.BytesIO(data)):
        if opcode.name == "GLOBAL":
            out.add(str(arg).replace(" ", "."))
        elif opcode.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
            strings.append(str(arg))
        elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
            out.add(f"{strings[-2]}.{strings[-1]}")
    return out


def torchscript_activation(path: str | os.PathLike) -> str | None:
    """The activation of a TorchScript archive of a CLIP (OpenAI's releases, a scripted
    open_clip model), read from the archive as data (the module classes its ``data.pkl``
    names, the ``approximate`` its stored GELU code declares; nothing in it runs):
    ``"quick_gelu"`` (QuickGELU modules only), ``"gelu"`` / ``"gelu_tanh"``
    (``torch.nn.GELU`` only), or None when it cannot tell (neither, both, or an unreadable
    archive)."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            classes = set()
            for name in names:
                if name.endswith("data.pkl"):
                    classes |= _pickle_classes(archive.read(name))
            approximate = set()
            for name in names:
                if name.endswith(".py") and "/code/" in f"/{name}":
                    code = archive.read(name).decode("utf-8", "replace")
                    approximate |= set(re.findall(
                        r"class GELU\(Module\):.*?approximate : Final\[str\] = \"(\w+)\"",
                        code, re.S))
    except (OSError, zipfile.BadZipFile, ValueError, EOFError):
        return None
    quick = any(c.rsplit(".", 1)[-1] == "QuickGELU" for c in classes)
    gelu = any(c.rsplit(".", 1)[-1] == "GELU" for c in classes)
    if quick and not gelu:
        return "quick_gelu"
    if gelu and not quick and len(approximate) == 1:
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(approximate.pop())
    return None


def _quick_gelu_from_name(path: str) -> bool | None:
    """True for a file named ``*quickgelu*`` or ``*openai*``; for a TorchScript archive, its
    modules (:func:`torchscript_activation`); None when the file says nothing."""
    if not path.endswith(".safetensors") and os.path.isfile(path) and is_torchscript(path):
        activation = torchscript_activation(path)
        if activation is not None:
            return activation == "quick_gelu"
    name = os.path.basename(path).lower().replace("_", "").replace("-", "")
    if "quickgelu" in name or "openai" in name:
        return True
    return None


def _bare_activation(path: str, quick_gelu: bool | None) -> tuple[str, str]:
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


# --- conversion ----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Converted:
    """A converted checkpoint: ``model`` (the ``dual_encoder`` block), ``params`` (nested pure
    dict, float32 NumPy), ``preprocess`` (``preprocess.json`` fields), ``tokenizer`` (a
    ``data.preprocess.tokenizer`` spec: ``{"kind": "clip_bpe", "path": ...}`` for CLIP's BPE,
    with ``path`` the merges file found beside the weights or ``""``; None for another
    tokenizer), ``tokenizer_name`` (open_clip's ``hf_tokenizer_name``), ``description`` (for
    messages), ``notes`` (options set that have no effect at inference) and ``assumptions``
    (what a conversion without config assumed; empty with one)."""

    model: dict
    params: dict
    preprocess: dict
    tokenizer: dict | None
    tokenizer_name: str | None
    description: str
    notes: tuple[str, ...] = ()
    assumptions: tuple[str, ...] = ()


def _same_config(a: occ.Source, b: occ.Source) -> None:
    if a.model_cfg != b.model_cfg:
        keys = sorted(k for k in set(a.model_cfg) | set(b.model_cfg)
                      if a.model_cfg.get(k) != b.model_cfg.get(k))
        raise ConfigError(f"two open_clip configs disagree ({keys}): {a.origin} and "
                          f"{b.origin}; give one")


def _sources(source, pretrained, open_clip_config, model) -> tuple[occ.Source | None, str]:
    """``(the config's source or None, the weight file)`` of the arguments of
    :func:`convert_open_clip`."""
    if open_clip_config is not None and model is not None:
        raise ConfigError("give one of --open_clip_config and --model (both name the model's "
                          "config)")
    if pretrained is not None and model is None and not (
            isinstance(source, str) and source in occ.recorded()["models"]):
        raise ConfigError(f"--pretrained={pretrained} names a release of a recorded open_clip "
                          "model: give --model=NAME with it")
    explicit = None
    if model is not None:
        explicit = occ.read_name(model, pretrained, need_weights=source is None)
    elif open_clip_config is not None:
        explicit = occ.resolve(open_clip_config)
        if explicit.model_cfg is None:
            raise ConfigError(f"--open_clip_config={os.fspath(open_clip_config)!r} is not a "
                              "JSON config or a directory holding open_clip_config.json")
    if source is None:
        if explicit is None or explicit.weights is None:
            raise ConfigError("nothing to convert: give --checkpoint=FILE|DIR|hf-hub:ORG/NAME, "
                              "or --model=NAME with --pretrained=TAG (weights in the local "
                              "Hugging Face cache)")
        return explicit, explicit.weights
    if isinstance(source, str | os.PathLike) and os.fspath(source).endswith(".json") \
            and os.path.isfile(source):
        raise ConfigError(f"--checkpoint={os.fspath(source)!r} is a JSON file: pass a config "
                          "with --open_clip_config and the weights with --checkpoint")
    found = occ.resolve(source, pretrained=pretrained if model is None else None)
    if found.model_cfg is not None and explicit is not None:
        _same_config(explicit, found)
    if found.weights is None and found.name is not None:
        releases = sorted(occ.recorded_model(found.name)["pretrained"])
        raise ConfigError(f"{found.origin} gives the architecture, not weights: add "
                          f"--pretrained=TAG (its releases: {releases or 'none'}) or pass the "
                          "weights with --checkpoint=FILE and the name with --model")
    if found.weights is None:
        raise ConfigError(f"{found.origin}: no weight file ({', '.join(occ.WEIGHT_FILES[:4])} "
                          f"...) in {found.directory or os.fspath(source)}")
    if explicit is None:
        return (found if found.model_cfg is not None else None), found.weights
    if found.model_cfg is not None:  # the same config twice: the directory's files count too
        explicit = dataclasses.replace(
            explicit, preprocess_cfg=explicit.preprocess_cfg or found.preprocess_cfg,
            directory=explicit.directory or found.directory,
            timm_args=explicit.timm_args or found.timm_args)
    return explicit, found.weights


def _flag_agrees(flag: str, given: Any, config_value: Any, option: str, origin: str) -> None:
    if given is not None and given != config_value:
        raise ConfigError(f"{flag}={str(given).lower() if isinstance(given, bool) else given} "
                          f"contradicts the open_clip config's {option} ({origin}); drop the "
                          "flag (the config decides)")


# open_clip's HFTokenizer names whose model is a T5-layout SentencePiece file (SigLIP's c4_en
# and its multilingual -i18n- model), computed by the "sentencepiece_open_clip" kind
SENTENCEPIECE_TOKENIZERS = ("timm/ViT-B-16-SigLIP", "timm/ViT-B-16-SigLIP-i18n-256")
SENTENCEPIECE_FILE = "spiece.model"


def tokenizer_spec(name: str | None, directory: str | None,
               text_cfg: Mapping[str, Any] | None = None) -> dict | None:
    """The ``data.preprocess.tokenizer`` spec of a model: CLIP's BPE (``path`` the merges file
    beside the weights, or ``""``), SigLIP's SentencePiece (``spiece.model`` beside the weights
    or ``""``; ``clean`` from ``tokenizer_kwargs``, HFTokenizer's default ``"whitespace"``
    otherwise; ``pad_id`` from the directory's ``tokenizer_config.json``, ``</s>`` = 1 as the
    SigLIP hub repositories have it), or None for a tokenizer this project does not compute."""
    if not name:
        path = ""
        for candidate in ("bpe_simple_vocab_16e6.txt.gz", "bpe_simple_vocab_16e6.txt"):
            if directory and os.path.isfile(os.path.join(directory, candidate)):
                path = os.path.join(directory, candidate)
        return {"kind": "clip_bpe", "path": path}
    model = os.path.join(directory, SENTENCEPIECE_FILE) if directory else ""
    if name not in SENTENCEPIECE_TOKENIZERS and not os.path.isfile(model):
        return None
    kwargs = dict(dict(text_cfg or {}).get("tokenizer_kwargs") or {})
    pad = "</s>"
    settings = os.path.join(directory, "tokenizer_config.json") if directory else ""
    if settings and os.path.isfile(settings):
        import json

        with open(settings) as f:
            value = json.load(f).get("pad_token", pad)
        pad = value.get("content", pad) if isinstance(value, Mapping) else value
    if pad not in ("</s>", "<pad>"):
        raise ConfigError(f"{settings}: pad_token {pad!r}; the SentencePiece tokenizer pads "
                          "with '</s>' (1) or '<pad>' (0)")
    return {"kind": "sentencepiece_open_clip",
            "path": model if os.path.isfile(model) else "",
            "clean": kwargs.get("clean", "whitespace"), "pad_id": 1 if pad == "</s>" else 0}


def convert_open_clip(source: str | os.PathLike | None = None, *,
                      pretrained: str | None = None,
                      open_clip_config: str | os.PathLike | Mapping[str, Any] | None = None,
                      model: str | None = None, quick_gelu: bool | None = None,
                      vision_heads: int | None = None, text_heads: int | None = None,
                      allow_torchscript: bool = False) -> Converted:
    """A checkpoint as a :class:`Converted` (the module docstring).

    ``source``: a weight file, a hub-layout directory, a cache snapshot or repository folder,
    ``hf-hub:ORG/NAME``, or a recorded model name (with ``pretrained``: its release, the
    weights from the local cache). ``open_clip_config`` (a file, a directory, a mapping) or
    ``model`` (a recorded name; with ``pretrained`` its release's pixels and, without
    ``source``, its weights): the config, when ``source`` has none or the same.
    ``quick_gelu``, ``vision_heads``, ``text_heads``: for a bare state dict; with a config a
    value that contradicts it is a :class:`ConfigError` naming both. A TorchScript archive is
    read only with ``allow_torchscript=True`` (loading one runs code stored in it).
    """
    config, weights = _sources(source, pretrained, open_clip_config, model)
    tensors = load_state_dict(weights, allow_torchscript=allow_torchscript)
    if config is None:
        reason = not_a_clip(tensors)
        if reason:
            raise ConfigError(reason)
        activation, where = _bare_activation(weights, quick_gelu)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", AssumptionWarning)
            block, params = _convert_bare(tensors, activation, where, vision_heads, text_heads)
        assumptions = tuple(str(w.message) for w in caught
                            if issubclass(w.category, AssumptionWarning))
        for text in assumptions:
            warnings.warn(text, AssumptionWarning, stacklevel=2)
        preprocess = {"mean": list(OPENAI_MEAN), "std": list(OPENAI_STD), "resize": "bicubic",
                      "image_size": block["sample_encoder"]["image_size"]}
        return Converted(block, params, preprocess, {"kind": "clip_bpe", "path": ""}, None,
                         f"CLIP state dict {weights}", (), assumptions)
    converted = occ.model_block(config.model_cfg, timm_args=config.timm_args)
    block = converted.model
    cfg = config.model_cfg
    own_vision = not cfg["vision_cfg"].get("timm_model_name")
    _flag_agrees("--quick_gelu", quick_gelu, bool(cfg.get("quick_gelu", False)),
                 f"quick_gelu = {str(bool(cfg.get('quick_gelu', False))).lower()}",
                 config.origin)
    _flag_agrees("--vision_heads", vision_heads, block["sample_encoder"]["heads"],
                 ("vision_cfg.head_width = "
                  f"{cfg['vision_cfg'].get('head_width', 64)}" if own_vision else
                  f"timm trunk {cfg['vision_cfg']['timm_model_name']}")
                 + f" ({block['sample_encoder']['heads']} heads)", config.origin)
    _flag_agrees("--text_heads", text_heads, block["text_encoder"]["heads"],
                 f"text_cfg.heads = {block['text_encoder']['heads']}", config.origin)
    names = set(tensors)
    if "logit_bias" in names and not block.get("siglip"):
        raise ConfigError(f"the checkpoint has a logit_bias (a SigLIP-style model) but the open_"
                          f"clip config ({config.origin}) has no init_logit_bias")
    notes = list(converted.notes)
    if block.get("siglip") and "logit_bias" not in names:
        tensors = {**tensors, "logit_bias": np.zeros((), np.float32)}
        notes.append("the checkpoint has no logit_bias: 0, as open_clip's load_checkpoint sets it")
    if "text_projection.bias" in names and block.get("text_projection") != "linear_bias":
        raise ConfigError(f"tensor 'text_projection.bias': the checkpoint's text projection has "
                          f"a bias, but the open_clip config ({config.origin}) says "
                          f"text_cfg.proj_bias = false")
    params = params_from_state_dict(block, tensors)
    block = {**block, "init_temperature": math.exp(-float(params["log_scale"]))}
    if block.get("siglip"):
        block["init_bias"] = float(params["bias"])
    return Converted(block, params, occ.preprocess(config, block["sample_encoder"]["image_size"]),
                     tokenizer_spec(converted.tokenizer, config.directory, cfg.get("text_cfg")),
                     converted.tokenizer,
                     f"open_clip model ({config.origin}; weights {weights})", tuple(notes))


def convert(path: str | os.PathLike | None = None, *, quick_gelu: bool | None = None,
            vision_heads: int | None = None, text_heads: int | None = None,
            allow_torchscript: bool = False,
            open_clip_config: str | os.PathLike | Mapping[str, Any] | None = None,
            model: str | None = None, pretrained: str | None = None
            ) -> tuple[dict[str, Any], dict]:
    """``(model config, params)`` of a checkpoint (:func:`convert_open_clip`: with a config
    from ``open_clip_config``, ``model`` or ``path`` as a hub directory; without one, a bare
    state dict read as a ViT CLIP, its activation from ``quick_gelu=None``: a TorchScript
    archive's modules, a file name containing ``quickgelu`` or ``openai``, otherwise a
    :class:`ConfigError` asking for it; shapes do not tell GELU from QuickGELU, and the wrong
    one changes every output)."""
    converted = convert_open_clip(path, pretrained=pretrained, open_clip_config=open_clip_config,
                                  model=model, quick_gelu=quick_gelu, vision_heads=vision_heads,
                                  text_heads=text_heads, allow_torchscript=allow_torchscript)
    return converted.model, converted.params


FLAGS = flags.FlagValues()  # this command's own (contrastive_jax.command_line)
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "the weights: .safetensors, .pt/.pth/.bin (needs PyTorch), a hub "
    "directory (open_clip_config.json + open_clip_model.safetensors), a Hugging Face cache "
    "snapshot, or hf-hub:ORG/NAME (the local cache)", flag_values=FLAGS)
_OUTPUT = flags.DEFINE_string("output", None, "new directory to write", flag_values=FLAGS)
_OPEN_CLIP_CONFIG = flags.DEFINE_string(
    "open_clip_config", None, "the model's open_clip config: open_clip_config.json, a plain "
    "model config JSON, or a directory holding open_clip_config.json", flag_values=FLAGS)
_MODEL = flags.DEFINE_string(
    "model", None, "the name of one of open_clip's shipped model configs (ViT-B-32, "
    "ViT-B-16-SigLIP, ...; docs/open_clip_models.md)", flag_values=FLAGS)
_PRETRAINED = flags.DEFINE_string(
    "pretrained", None, "with --model: an open_clip release tag (its pixels; without "
    "--checkpoint its weights from the local Hugging Face cache)", flag_values=FLAGS)
_QUICK_GELU = flags.DEFINE_bool(
    "quick_gelu", None, "without a config: true: QuickGELU (OpenAI, *-quickgelu); false: exact "
    "GELU; default: from the file (a TorchScript archive's modules, or the name), else an "
    "error", flag_values=FLAGS)
_VISION_HEADS = flags.DEFINE_integer(
    "vision_heads", None, "without a config: image tower heads (default width // 64)",
    flag_values=FLAGS)
_TEXT_HEADS = flags.DEFINE_integer(
    "text_heads", None, "without a config: text tower heads (default width // 64)",
    flag_values=FLAGS)
_TOKENIZER = flags.DEFINE_string(
    "tokenizer", None, "the model's tokenizer file, copied into --output so that the directory "
    "is a whole model (load_pretrained): CLIP's BPE merges file (bpe_simple_vocab_16e6.txt.gz) "
    "or a SigLIP model's spiece.model; default: the one beside the weights, if any",
    flag_values=FLAGS)
_ALLOW_TORCHSCRIPT = flags.DEFINE_bool(
    "allow_torchscript", False, "read a TorchScript archive (OpenAI's release files) with "
    "torch.jit.load, which runs code stored in the file: only for a file you trust (refused "
    "without this flag)", flag_values=FLAGS)
COMMAND = command_line.Command(
    program="python -m contrastive_jax.training.models.converters.clip_import", doc=__doc__,
    flag_values=FLAGS, required=("output",))


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (module docstring; ``argv``: its arguments, ``sys.argv[1:]`` when
    None): 0 when converted; an error a user can fix prints ``error: ...`` and returns 2
    (:func:`contrastive_jax.command_line.run`)."""
    return command_line.run(COMMAND, _convert_and_save, argv)


def _convert_and_save(positional: list[str]) -> None:
    """Convert into ``--output``; print the assumptions (``warning:`` lines on stderr), the
    notes and what was written."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AssumptionWarning)  # printed below, once
        converted = convert_open_clip(
            _CHECKPOINT.value, pretrained=_PRETRAINED.value,
            open_clip_config=_OPEN_CLIP_CONFIG.value, model=_MODEL.value,
            quick_gelu=_QUICK_GELU.value, vision_heads=_VISION_HEADS.value,
            text_heads=_TEXT_HEADS.value, allow_torchscript=_ALLOW_TORCHSCRIPT.value)
    for text in converted.assumptions:
        print(f"warning: {text}", file=sys.stderr)
    for text in converted.notes:
        print(f"note: {text}")
    tokenizer = converted.tokenizer
    if _TOKENIZER.value is not None:
        if tokenizer is None:
            raise ConfigError(f"--tokenizer: the model's tokenizer ({converted.tokenizer_name}) "
                              "is not one this project computes (CLIP's BPE, SigLIP's "
                              "SentencePiece); drop the flag")
        tokenizer = {**tokenizer, "path": _TOKENIZER.value}
    if tokenizer and not tokenizer["path"]:
        print(f"note: no tokenizer file beside the weights, so none in {_OUTPUT.value}; pass "
              "--tokenizer=FILE to include it (load_pretrained then needs no tokenizer=)")
    tokenizer = tokenizer if tokenizer and tokenizer["path"] else None
    save_converted(_OUTPUT.value, converted.model, converted.params,
                   preprocess=converted.preprocess, tokenizer=tokenizer)
    count = sum(int(np.prod(np.shape(x))) for x in _leaves(converted.params))
    print(f"wrote {_OUTPUT.value}: {count:,} parameters ({_summary(converted.model)})")


def _leaves(tree: Any) -> list:
    if isinstance(tree, Mapping):
        return [leaf for value in tree.values() for leaf in _leaves(value)]
    return [tree]


if __name__ == "__main__":
    sys.exit(main())
