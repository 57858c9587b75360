"""Import an OpenAI CLIP or open_clip checkpoint as this project's dual encoder.

    python -m contrastive_jax.training.models.converters.clip_import --output=DIR \\
        --checkpoint=FILE|DIR|hf-hub:ORG/NAME [--open_clip_config=FILE|DIR] [--model=NAME]
        [--pretrained=TAG] [--quick_gelu=true|false] [--vision_heads=N] [--text_heads=N]
        [--tokenizer=FILE] [--allow_torchscript] [--image_size=N] [--max_tokens=T]

reads a checkpoint the user already has (nothing is downloaded). With the model's open_clip
config, the architecture comes from it (:mod:`.model_configs`: heads, activation, pooling,
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
pickled state dict, read with PyTorch) is read as OpenAI's / open_clip's default ViT CLIP
(:mod:`.clip_state_dict`): sizes from the tensors' shapes, and CLIP's settings for what shapes
do not show (heads ``width // 64``, LayerNorm eps 1e-5, class-token pooling, a causal text mask
with argmax pooling, the activation from ``--quick_gelu``, the file name or the TorchScript
archive's modules), stated in an ``AssumptionWarning`` (a ``warning:`` line from the
command). A checkpoint the converter can tell is not such a CLIP (a ResNet or timm image tower,
a Hugging Face text tower, a text projection with a bias, no ``ln_pre``, a logit bias) is
refused, asking for the config, before any question about flags.

Every tensor is mapped to a parameter of
:class:`~contrastive_jax.training.models.DualEncoder` by
:func:`.tensor_layouts.params_from_state_dict` (a missing tensor, another shape, or one no
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
import math
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from absl import flags

from contrastive_jax import command_line
from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models.converters.clip_state_dict import (
    AssumptionWarning,
    bare_activation,
    convert_bare,
    not_a_clip,
    summary,
)
from contrastive_jax.training.models.converters.converted_directory import (
    define_size_flags,
    save_converted,
)
from contrastive_jax.training.models.converters.open_clip import model_configs as occ
from contrastive_jax.training.models.converters.open_clip import model_sources as sources
from contrastive_jax.training.models.converters.open_clip.tensor_layouts import (
    params_from_state_dict,
)
from contrastive_jax.training.models.converters.pretrained_source import PretrainedSource
from contrastive_jax.training.models.converters.state_dict_files import load_state_dict

# CLIP's image normalisation (open_clip's OPENAI_DATASET_MEAN / _STD), RGB, for pixels in [0, 1]
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
__all__ = ["OPENAI_MEAN", "OPENAI_STD", "convert_checkpoint", "convert_open_clip",
           "main"]


# --- conversion ----------------------------------------------------------------------------------

def _same_config(a: sources.Source, b: sources.Source) -> None:
    if a.model_cfg != b.model_cfg:
        keys = sorted(k for k in set(a.model_cfg) | set(b.model_cfg)
                      if a.model_cfg.get(k) != b.model_cfg.get(k))
        raise ConfigError(f"two open_clip configs disagree ({keys}): {a.origin} and "
                          f"{b.origin}; give one")


def _sources(source, pretrained, open_clip_config, model) -> tuple[sources.Source | None, str]:
    """``(the config's source or None, the weight file)`` of the arguments of
    :func:`convert_open_clip`."""
    if open_clip_config is not None and model is not None:
        raise ConfigError("give one of --open_clip_config and --model (both name the model's "
                          "config)")
    if pretrained is not None and model is None and not (
            isinstance(source, str) and source in sources.recorded()["models"]):
        raise ConfigError(f"--pretrained={pretrained} names a release of a recorded open_clip "
                          "model: give --model=NAME with it")
    explicit = None
    if model is not None:
        explicit = sources.read_name(model, pretrained, need_weights=source is None)
    elif open_clip_config is not None:
        explicit = sources.locate(open_clip_config)
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
    found = sources.locate(source, pretrained=pretrained if model is None else None)
    if found.model_cfg is not None and explicit is not None:
        _same_config(explicit, found)
    if found.weights is None and found.name is not None:
        releases = sorted(sources.recorded_model(found.name)["pretrained"])
        raise ConfigError(f"{found.origin} gives the architecture, not weights: add "
                          f"--pretrained=TAG (its releases: {releases or 'none'}) or pass the "
                          "weights with --checkpoint=FILE and the name with --model")
    if found.weights is None:
        raise ConfigError(f"{found.origin}: no weight file ({', '.join(sources.WEIGHT_FILES[:4])} "
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


def convert_open_clip(source: str | os.PathLike | None = None, *,
                      pretrained: str | None = None,
                      open_clip_config: str | os.PathLike | Mapping[str, Any] | None = None,
                      model: str | None = None, quick_gelu: bool | None = None,
                      vision_heads: int | None = None, text_heads: int | None = None,
                      allow_torchscript: bool = False) -> PretrainedSource:
    """A checkpoint as a :class:`~.pretrained_source.PretrainedSource` of kind
    ``"open_clip"`` with its weights (the module docstring): ``model`` (the ``dual_encoder``
    block), ``params`` (nested pure dict, float32 NumPy), ``preprocess`` (``preprocess.json``
    fields), ``tokenizer`` (a ``data.preprocess.tokenizer`` spec: ``{"kind": "clip_bpe",
    "path": ...}`` for CLIP's BPE, with ``path`` the merges file found beside the weights or
    ``""``; None for another tokenizer), ``tokenizer_name`` (open_clip's
    ``hf_tokenizer_name``), ``notes`` (options set that have no effect at inference) and
    ``assumptions`` (what a conversion without config assumed; empty with one).

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
        activation, where = bare_activation(weights, quick_gelu)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", AssumptionWarning)
            block, params = convert_bare(tensors, activation, where, vision_heads, text_heads)
        assumptions = tuple(str(w.message) for w in caught
                            if issubclass(w.category, AssumptionWarning))
        for text in assumptions:
            warnings.warn(text, AssumptionWarning, stacklevel=2)
        preprocess = {"mean": list(OPENAI_MEAN), "std": list(OPENAI_STD), "resize": "bicubic",
                      "image_size": block["sample_encoder"]["image_size"]}
        return PretrainedSource("open_clip", os.fspath(weights), f"CLIP state dict {weights}",
                                block, preprocess, {"kind": "clip_bpe", "path": ""},
                                params=params, rest={}, assumptions=assumptions)
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
    pixels = sources.source_preprocess(config, block["sample_encoder"]["image_size"])
    tokenizer = sources.tokenizer_spec(converted.tokenizer, config.directory, cfg.get("text_cfg"))
    return PretrainedSource("open_clip", os.fspath(source if source is not None else weights),
                            f"open_clip model ({config.origin}; weights {weights})", block,
                            pixels, tokenizer, converted.tokenizer, pretrained=pretrained,
                            params=params, rest={}, notes=tuple(notes))


def convert_checkpoint(path: str | os.PathLike | None = None, *, quick_gelu: bool | None = None,
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
_IMAGE_SIZE, _MAX_TOKENS = define_size_flags(FLAGS)
COMMAND = command_line.Command(
    program="python -m contrastive_jax.training.models.converters.clip_import", doc=__doc__,
    flag_values=FLAGS, required=("output",))


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (module docstring; ``argv``: its arguments, ``sys.argv[1:]`` when
    None): 0 when converted; an error a user can fix prints ``error: ...`` and returns 2
    (:func:`contrastive_jax.command_line.run_command`)."""
    return command_line.run_command(COMMAND, _convert_and_save, argv)


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
    for text in save_converted(_OUTPUT.value, converted.model, converted.params,
                               preprocess=converted.preprocess, tokenizer=tokenizer,
                               image_size=_IMAGE_SIZE.value, max_tokens=_MAX_TOKENS.value):
        print(f"note: {text}")
    count = sum(int(np.prod(np.shape(x))) for x in _leaves(converted.params))
    print(f"wrote {_OUTPUT.value}: {count:,} parameters ({summary(converted.model)})")


def _leaves(tree: Any) -> list:
    if isinstance(tree, Mapping):
        return [leaf for value in tree.values() for leaf in _leaves(value)]
    return [tree]


if __name__ == "__main__":
    sys.exit(main())
