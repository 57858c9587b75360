"""Import a big_vision SigLIP ``.npz`` checkpoint as this project's dual encoder.

    python -m contrastive_jax.training.models.converters.big_vision_import \\
        --checkpoint=FILE.npz --output=DIR [--activation=gelu_tanh|gelu] [--vision_heads=N]
        [--text_heads=N] [--image_size=N] [--max_tokens=T]

reads the ``.npz`` parameter files that big_vision (the JAX code SigLIP was trained with,
[SigLIP], [BigVision] in docs/references.md) releases (nothing is downloaded): one array per
parameter, named by its flattened Flax path; the file's layouts and the architecture read from
its shapes: :mod:`.big_vision_npz`. Every array goes to one parameter of
:class:`~contrastive_jax.training.models.DualEncoder` with SigLIP's options of
:class:`~.transformer.ViT` (``pool="map"``, no class token, no ``ln_pre``, a patch bias) and
:class:`~.transformer.TextTransformer` (no attention mask, ``pool="last"``) and ``siglip=True``
(:func:`convert_npz`), and ``DIR`` receives (:func:`~.converted_directory.save_converted`)::

    DIR/model.json       the config's ``model`` block (a dual_encoder) that builds exactly this
                         architecture with build_model
    DIR/params/          orbax StandardCheckpointer save of nnx.to_pure_dict of the model's
                         nnx.Param state (float32)
    DIR/preprocess.json  the pixels the model expects: mean = std = 0.5 (pixels in [-1, 1]),
                         the whole image resized to the image size (bilinear, "squash")

**Activation.** big_vision's towers compute Flax's ``nn.gelu``, the tanh approximation:
``activation="gelu_tanh"`` (the default) is the function the checkpoint was trained and
evaluated with. open_clip and timm read the same weights into exact-GELU modules:
``activation="gelu"`` computes what open_clip computes. docs/pretrained.md gives the difference.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from absl import flags

from contrastive_jax import command_line
from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models.converters.big_vision_npz import (
    ACTIVATIONS,
    SUPPORTED,
    TOWERS,
    Arrays,
    load_npz,
    npz_architecture,
)
from contrastive_jax.training.models.converters.converted_directory import (
    define_size_flags,
    save_converted,
)
from contrastive_jax.training.models.converters.open_clip.tensor_layouts import in_model_layout
from contrastive_jax.training.models.converters.open_clip.tensor_rules import describe_sizes
from contrastive_jax.training.models.converters.pretrained_source import PretrainedSource

# SigLIP's pixels: [0, 1] -> [-1, 1] (big_vision's value_range(-1, 1); open_clip's
# INCEPTION_MEAN / _STD), the whole image resized to the square (big_vision's resize(size),
# bilinear; open_clip's resize_mode="squash")
MEAN = (0.5, 0.5, 0.5)
STD = (0.5, 0.5, 0.5)


def _rules(config: Mapping[str, Any]) -> list[tuple[tuple, str, tuple]]:
    """``(target path, source name, shape)`` for every parameter; every array is taken as it
    is (big_vision's Flax layouts are this project's), ``t`` and ``b`` ``(1,)`` as scalars."""
    vit, txt = config["sample_encoder"], config["text_encoder"]

    def dense(target, source, n_in, n_out):
        return [((*target, "kernel"), source + "/kernel", (n_in, n_out)),
                ((*target, "bias"), source + "/bias", (n_out,))]

    def layer_norm(target, source, width):
        return [((*target, "scale"), source + "/scale", (width,)),
                ((*target, "bias"), source + "/bias", (width,))]

    def attention(target, source, width, heads):
        d = width // heads
        rules = []
        for name in ("query", "key", "value"):
            rules += [((*target, name, "kernel"), f"{source}/{name}/kernel", (width, heads, d)),
                      ((*target, name, "bias"), f"{source}/{name}/bias", (heads, d))]
        return [*rules, ((*target, "out", "kernel"), source + "/out/kernel", (heads, d, width)),
                ((*target, "out", "bias"), source + "/out/bias", (width,))]

    def mlp(target, source, width, hidden):
        return (dense((*target, "fc1"), source + "/Dense_0", width, hidden)
                + dense((*target, "fc2"), source + "/Dense_1", hidden, width))

    def encoder(target, base, tower):
        width, heads = tower["width"], tower["heads"]
        hidden = tower.get("mlp_width") or tower["mlp_ratio"] * width
        rules = []
        for i in range(tower["depth"]):
            t, s = (*target, "blocks", i), f"{base}encoderblock_{i}/"
            rules += layer_norm((*t, "norm1"), s + "LayerNorm_0", width)
            rules += attention((*t, "attention"), s + "MultiHeadDotProductAttention_0", width,
                               heads)
            rules += layer_norm((*t, "norm2"), s + "LayerNorm_1", width)
            rules += mlp(t, s + "MlpBlock_0", width, hidden)
        return rules + layer_norm((*target, "norm"), base + "encoder_norm", width)

    wv, patch = vit["width"], vit["patch"]
    hidden_v = vit.get("mlp_width") or vit["mlp_ratio"] * wv
    v, t, m = ("sample_encoder",), ("text_encoder",), ("sample_encoder", "map_head")
    embed = config["embed_dim"]
    rules = [
        ((*v, "embed", "kernel"), "img/embedding/kernel", (patch, patch, vit["in_channels"], wv)),
        ((*v, "embed", "bias"), "img/embedding/bias", (wv,)),
        ((*v, "positions"), "img/pos_embedding", (1, (vit["image_size"] // patch) ** 2, wv)),
        *encoder(v, TOWERS["vision"], vit),
        ((*m, "latent"), "img/MAPHead_0/probe", (1, 1, wv)),
        *attention((*m, "attention"), "img/MAPHead_0/MultiHeadDotProductAttention_0", wv,
                   vit["heads"]),
        *layer_norm((*m, "norm"), "img/MAPHead_0/LayerNorm_0", wv),
        *mlp(m, "img/MAPHead_0/MlpBlock_0", wv, hidden_v),
        ((*t, "tokens", "embedding"), "txt/Embed_0/embedding", (txt["vocab_size"], txt["width"])),
        ((*t, "positions"), "txt/pos_embedding", (1, txt["max_tokens"], txt["width"])),
        *encoder(t, TOWERS["text"], txt),
        (("log_scale",), "t", (1,)),
    ]
    if config["sample_projection"] == "linear_bias":
        rules += dense(("sample_proj",), "img/head", wv, embed)
    if config["text_projection"] == "linear_bias":
        rules += dense(("text_proj",), "txt/head", txt["width"], embed)
    if config.get("siglip"):
        rules.append((("bias",), "b", (1,)))
    return rules


def convert_arrays(arrays: Arrays, *, activation: str = "gelu_tanh",
                   vision_heads: int | None = None, text_heads: int | None = None
                   ) -> tuple[dict[str, Any], dict]:
    """``(model config, params)`` of the big_vision arrays (:func:`npz_architecture`); ``params`` is
    the nested pure dict of the model's ``nnx.Param`` state (``nnx.to_pure_dict``), float32
    NumPy arrays. An array the architecture needs but the file lacks, one of another shape,
    or one that nothing takes is a :class:`ConfigError` naming its ``.npz`` key."""
    config = npz_architecture(arrays, activation=activation, vision_heads=vision_heads,
                          text_heads=text_heads)
    params: dict = {}
    used = set()
    for target, source, shape in _rules(config):
        value = arrays.get(source)
        if value.shape != shape:
            raise ConfigError(f"array {arrays.source(source)!r} has shape {value.shape}; the "
                              f"architecture read from the checkpoint ({describe_sizes(config)}) "
                              f"needs {shape}")
        if shape == (1,) and target[-1] in ("log_scale", "bias") and len(target) == 1:
            value = value.reshape(())
        node = params
        for key in target[:-1]:
            node = node.setdefault(key, {})
        node[target[-1]] = np.asarray(value, np.float32, order="C")  # no copy when C-ordered
        used.add(source)
    unused = sorted(arrays.source(n) for n in arrays.arrays if n not in used)
    if unused:
        raise ConfigError(f"array {unused[0]!r} of the checkpoint has no place in a big_vision "
                          f"SigLIP ({len(unused)} unused: {unused[:5]}); {SUPPORTED}")
    return config, in_model_layout(config, params)


def convert_npz(path: str | os.PathLike, *, activation: str = "gelu_tanh",
            vision_heads: int | None = None, text_heads: int | None = None
            ) -> PretrainedSource:
    """The big_vision SigLIP ``.npz`` at ``path`` as a
    :class:`~.pretrained_source.PretrainedSource` of kind ``"big_vision"`` with its weights
    (:func:`load_npz`, :func:`convert_arrays`): ``model`` (the ``dual_encoder`` block),
    ``params`` (nested, float32), ``preprocess`` (:func:`npz_preprocess`), ``tokenizer`` (the
    kind, SigLIP's SentencePiece; its file is not in the ``.npz``).

    ``activation="gelu_tanh"`` (default): big_vision's own ``nn.gelu`` (tanh approximation),
    the function the checkpoint was trained with; ``"gelu"``: exact GELU, what open_clip /
    timm compute on the same weights. ``vision_heads`` / ``text_heads``: the towers' attention
    heads (default: big_vision's variant of that width, :data:`VARIANTS`, with a warning).
    """
    config, params = convert_arrays(load_npz(path), activation=activation,
                                    vision_heads=vision_heads, text_heads=text_heads)
    location = os.path.abspath(os.fspath(path))
    return PretrainedSource("big_vision", location, f"big_vision {location}", config,
                            npz_preprocess(config), {"kind": "sentencepiece_open_clip"},
                            params=params, rest={})


def npz_preprocess(config: Mapping[str, Any]) -> dict[str, Any]:
    """``DIR/preprocess.json`` of a converted SigLIP: pixels in [0, 1] mapped to [-1, 1]
    (mean = std = 0.5), the whole image resized to the square (bilinear, big_vision's
    ``resize``; open_clip's SigLIP configs resize bicubic, also "squash")."""
    return {"mean": list(MEAN), "std": list(STD), "resize": "bilinear",
            "resize_mode": "squash", "image_size": config["sample_encoder"]["image_size"]}


FLAGS = flags.FlagValues()  # this command's own (contrastive_jax.command_line)
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "big_vision SigLIP .npz file",
                                  flag_values=FLAGS)
_OUTPUT = flags.DEFINE_string("output", None, "new directory to write", flag_values=FLAGS)
_ACTIVATION = flags.DEFINE_enum(
    "activation", "gelu_tanh", list(ACTIVATIONS),
    "gelu_tanh: big_vision's own nn.gelu (tanh approximation, what the checkpoint was trained "
    "with); gelu: exact, what open_clip computes on the same weights", flag_values=FLAGS)
_VISION_HEADS = flags.DEFINE_integer(
    "vision_heads", None, "image tower heads (default: big_vision's variant of that width)",
    flag_values=FLAGS)
_TEXT_HEADS = flags.DEFINE_integer(
    "text_heads", None, "text tower heads (default: big_vision's variant of that width)",
    flag_values=FLAGS)
_IMAGE_SIZE, _MAX_TOKENS = define_size_flags(FLAGS)
COMMAND = command_line.Command(
    program="python -m contrastive_jax.training.models.converters.big_vision_import",
    doc=__doc__, flag_values=FLAGS, required=("checkpoint", "output"))


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (module docstring; ``argv``: its arguments, ``sys.argv[1:]`` when
    None): 0 when converted; an error a user can fix prints ``error: ...`` and returns 2
    (:func:`contrastive_jax.command_line.run_command`)."""
    return command_line.run_command(COMMAND, _convert_and_save, argv)


def _convert_and_save(positional: list[str]) -> None:
    """Convert ``--checkpoint`` into ``--output`` and print what was written."""
    source = convert_npz(_CHECKPOINT.value, activation=_ACTIVATION.value,
                         vision_heads=_VISION_HEADS.value, text_heads=_TEXT_HEADS.value)
    config, params = source.model, source.params
    for text in save_converted(_OUTPUT.value, config, params, preprocess=source.preprocess,
                               image_size=_IMAGE_SIZE.value, max_tokens=_MAX_TOKENS.value):
        print(f"note: {text}")
    count = sum(int(np.size(x)) for x in _leaves(params))
    print(f"wrote {_OUTPUT.value}: {count:,} parameters ({describe_sizes(config)}; "
          f"activation {_ACTIVATION.value})")


def _leaves(tree: Any) -> list:
    if isinstance(tree, Mapping):
        return [leaf for value in tree.values() for leaf in _leaves(value)]
    return [tree]


if __name__ == "__main__":
    sys.exit(main())
