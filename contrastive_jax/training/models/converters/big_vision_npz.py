"""big_vision's SigLIP ``.npz`` checkpoints: the arrays read (:func:`load_npz`) and the
``dual_encoder`` architecture read from their shapes (:func:`npz_architecture`); converted by
:mod:`.big_vision_import` ([SigLIP], [BigVision] in docs/references.md).

**Layouts read** (``P`` = ``params/`` when the file's names start with it, as in the released
files, else nothing; ``T`` = ``P img/Transformer/`` or ``P txt/Encoder_0/``)::

    P img/embedding/kernel (patch, patch, C, width), P img/embedding/bias (width,)
    P img/pos_embedding (1, (size / patch)^2, width)
    T encoderblock_{i}/LayerNorm_0|LayerNorm_1/scale|bias         one block per i, or
    T encoderblock/...  the same with a leading depth axis (big_vision's scan=True)
      .../MultiHeadDotProductAttention_0/query|key|value/kernel (width, heads, head_dim),
          .../bias (heads, head_dim); .../out/kernel (heads, head_dim, width), .../bias
      .../MlpBlock_0/Dense_0|Dense_1/kernel|bias
    T encoder_norm/scale|bias
    P img/MAPHead_0/probe (1, 1, width), .../MultiHeadDotProductAttention_0/..., .../LayerNorm_0,
      .../MlpBlock_0/Dense_0|Dense_1
    P img/head/kernel|bias     optional (absent in the released SigLIP files: out_dim (None, D))
    P txt/Embed_0/embedding (vocab, width), P txt/pos_embedding (1, context, width)
    P txt/head/kernel (width, embed_dim), P txt/head/bias     (a missing head: no projection)
    P t (1,)   log of the logit scale;  P b (1,)   the logit bias (absent: not a SigLIP)

which is what open_clip's reader (``open_clip.convert.load_big_vision_weights``) accepts, plus
an image head. The layouts are Flax's and this project's, so every array is taken as it is
(``t`` and ``b`` as scalars). A missing array, one of another shape than the architecture read
from the file, or one that nothing takes is a :class:`ConfigError` naming the ``.npz`` key.
"""

from __future__ import annotations

import math
import os
import re
import warnings
import zipfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from contrastive_jax.errors import ConfigError

# big_vision's ViT variants (vit.decode_variant; its text towers use the same table):
# name -> (width, depth, mlp_dim, heads). Heads cannot be read from the arrays' shapes; the
# default is the heads of the variant with the tower's width (every variant of one width has
# the same heads).
VARIANTS = {
    "mu": (32, 1, 128, 2), "Ti": (192, 12, 768, 3), "S": (384, 12, 1536, 6),
    "M": (512, 12, 2048, 8), "B": (768, 12, 3072, 12), "L": (1024, 24, 4096, 16),
    "So400m": (1152, 27, 4304, 16), "H": (1280, 32, 5120, 16), "g": (1408, 40, 6144, 16),
    "g-opt": (1536, 40, 6144, 16), "G": (1664, 48, 8192, 16), "G-opt": (1536, 48, 8192, 16),
    "e": (1792, 56, 15360, 16),
}
ACTIVATIONS = ("gelu_tanh", "gelu")  # big_vision's own (Flax nn.gelu), open_clip's reading
LAYER_NORM_EPS = 1e-6  # Flax nn.LayerNorm's default, every LayerNorm of big_vision
PREFIX = "params/"
MAX_SCALE = 100.0  # the default loss.max_scale (training/methods/base.py)
_BLOCK = re.compile(r"^(img/Transformer|txt/Encoder_0)/encoderblock_(\d+)/")
TOWERS = {"vision": "img/Transformer/", "text": "txt/Encoder_0/"}


class Arrays:
    """The checkpoint's arrays under their names without the root prefix and with a scanned
    stack split into ``encoderblock_{i}`` entries; :meth:`source` gives the ``.npz`` key each
    came from (for error messages)."""

    def __init__(self, arrays: dict[str, np.ndarray], sources: dict[str, str],
                 prefix: str = "", scanned: Sequence[str] = ()):
        self.arrays, self.sources = arrays, sources
        self.prefix, self.scanned = prefix, tuple(scanned)

    def __contains__(self, name: str) -> bool:
        return name in self.arrays

    def source(self, name: str) -> str:
        """The ``.npz`` key of ``name``; for a name the file lacks, the key it would have (in
        a scanned tower: the stack's)."""
        if name in self.sources:
            return self.sources[name]
        m = _BLOCK.match(name)
        if m and m.group(1) + "/" in self.scanned:
            name = f"{m.group(1)}/encoderblock/{name[m.end():]}"
        return self.prefix + name

    def get(self, name: str, ndim: int | None = None) -> np.ndarray:
        if name not in self.arrays:
            raise ConfigError(f"the checkpoint has no array {self.source(name)!r}, which a "
                              f"big_vision SigLIP has ({SUPPORTED})")
        value = self.arrays[name]
        if value.dtype != np.float32:
            raise ConfigError(f"array {self.source(name)!r} has dtype {value.dtype}, not numbers")
        if ndim is not None and value.ndim != ndim:
            raise ConfigError(f"array {self.source(name)!r} has shape {value.shape}; a "
                              f"big_vision SigLIP's has {ndim} dimensions")
        return value


SUPPORTED = ("supported: big_vision two_towers SigLIP checkpoints with a ViT image tower "
              "pooled by a MAP head and a text_transformer text tower")


def load_npz(path: str | os.PathLike) -> Arrays:
    """The arrays of a big_vision ``.npz`` (float32; bfloat16 arrays, stored by NumPy as
    2-byte void, read through ``ml_dtypes``), names relative to the root ``params/`` prefix
    when the file's names have it, and a scanned tower (``.../encoderblock/X`` with a leading
    depth axis) split into ``.../encoderblock_{i}/X``. A file that is not a readable ``.npz``
    (missing, truncated, pickled objects) is a :class:`ConfigError` naming it."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ConfigError(f"checkpoint {path!r} does not exist or is not a file")
    try:
        npz = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise ConfigError(f"{path!r} is not a readable .npz file ({err}); it may be truncated "
                          "(copy or download it again) or another format") from None
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise ConfigError(f"{path!r} is a single .npy array, not a big_vision .npz of named "
                          "parameters")
    with npz:
        raw = {}
        for name in npz.files:
            try:
                raw[name] = _float32(npz[name])
            except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
                raise ConfigError(f"array {name!r} of {path!r} cannot be read ({err}); the "
                                  "file may be truncated (copy or download it again) or hold "
                                  "Python objects") from None
    if not raw:
        raise ConfigError(f"{path!r} holds no arrays")
    prefix = PREFIX if any(k.startswith(PREFIX) for k in raw) else ""
    arrays, sources, scanned = {}, {}, []
    for key, value in raw.items():
        name = key[len(prefix):] if key.startswith(prefix) else "\0" + key  # kept: unused
        arrays[name], sources[name] = value, key
    for tower, base in TOWERS.items():
        stacked = [n for n in arrays if n.startswith(base + "encoderblock/")]
        if not stacked:
            continue
        scanned.append(base)
        looped = [n for n in arrays if n.startswith(base + "encoderblock_")]
        if looped:
            raise ConfigError(f"the {tower} tower has both a scanned stack "
                              f"({sources[stacked[0]]!r}) and separate blocks "
                              f"({sources[looped[0]]!r}); a checkpoint has one or the other")
        depths = {n: arrays[n].shape[0] if arrays[n].ndim else 0 for n in stacked}
        first = stacked[0]
        odd = [n for n in stacked if depths[n] != depths[first] or not depths[n]]
        if odd:
            raise ConfigError(f"the scanned {tower} blocks do not share one leading depth axis: "
                              f"{sources[first]!r} has shape {arrays[first].shape}, "
                              f"{sources[odd[0]]!r} {arrays[odd[0]].shape}")
        for name in stacked:
            value, key = arrays.pop(name), sources.pop(name)
            leaf = name[len(base + "encoderblock/"):]
            for i in range(value.shape[0]):
                split = f"{base}encoderblock_{i}/{leaf}"
                arrays[split], sources[split] = value[i], f"{key}[{i}]"
    return Arrays(arrays, sources, prefix, scanned)


def _float32(value: np.ndarray) -> np.ndarray:
    """Numbers as float32 (bfloat16, which NumPy stores as 2-byte void, through
    ``ml_dtypes``); anything else as it is (no parameter takes it: reported as unused)."""
    if value.dtype.kind == "V" and value.dtype.itemsize == 2:
        import ml_dtypes

        value = value.view(ml_dtypes.bfloat16)
    if value.dtype.kind in "fiu" or value.dtype.name == "bfloat16":
        return np.asarray(value, np.float32)
    return value


def _heads(tower: str, width: int, heads: int | None) -> int:
    if heads is None:
        names = [n for n, v in VARIANTS.items() if v[0] == width]
        if not names:
            raise ConfigError(f"{tower} width {width} is none of big_vision's variants "
                              f"({ {n: v[0] for n, v in VARIANTS.items()} }): the heads cannot "
                              f"be read from the arrays, set --{tower}_heads")
        heads = VARIANTS[names[0]][3]
        warnings.warn(f"{tower} heads = {heads} assumed from the width {width} (big_vision's "
                      f"variant {'/'.join(names)}); pass --{tower}_heads ({tower}_heads=) if "
                      "the checkpoint was trained with other heads", stacklevel=3)
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1 or width % heads:
        raise ConfigError(f"{tower} heads = {heads!r} must be a positive divisor of the "
                          f"{tower} width {width}; set --{tower}_heads")
    return heads


def _depth(arrays: Arrays, base: str) -> int:
    found = {int(m.group(2)) for m in map(_BLOCK.match, arrays.arrays)
             if m and m.group(1) + "/" == base}
    if not found:
        raise ConfigError(f"the checkpoint has no array {arrays.prefix}{base}encoderblock_0/... "
                          f"(nor a scanned {arrays.prefix}{base}encoderblock/...); {SUPPORTED}")
    return max(found) + 1


def npz_architecture(arrays: Arrays, *, activation: str = "gelu_tanh",
                 vision_heads: int | None = None, text_heads: int | None = None
                 ) -> dict[str, Any]:
    """The ``model`` config block (a ``dual_encoder``) of the big_vision SigLIP whose arrays
    are ``arrays`` (:func:`load_npz`), read from shapes:

    * image tower: ``img/embedding/kernel (patch, patch, C, width)``, ``img/pos_embedding
      (1, (image_size / patch)^2, width)``, the number of ``img/Transformer/encoderblock_i``,
      the MLP's hidden width from ``MlpBlock_0/Dense_0/kernel``;
    * text tower: ``txt/Embed_0/embedding (vocab_size, width)``, ``txt/pos_embedding
      (1, context, width)``, the number of ``txt/Encoder_0/encoderblock_i``;
    * projections: ``txt/head/kernel (width, embed_dim)`` (a bias always: ``"linear_bias"``),
      ``img/head`` when present (else ``"none"``: the MAP head's output is the embedding, its
      width must be ``embed_dim``); ``embed_dim`` from the heads (or the widths without any);
    * ``siglip=True`` when there is a bias ``b``; ``init_temperature = exp(-t)`` and
      ``init_bias = b`` (the parameters take the values).

    ``vision_heads`` / ``text_heads``: ``None`` takes the heads of big_vision's variant with
    that width (:data:`VARIANTS`, with a warning saying so). ``activation``: ``"gelu_tanh"``
    (big_vision's ``nn.gelu``) or ``"gelu"`` (exact, open_clip's reading).
    """
    if activation not in ACTIVATIONS:
        raise ConfigError(f"activation {activation!r} is not supported; valid: "
                          f"{list(ACTIVATIONS)} (gelu_tanh: big_vision's own nn.gelu; gelu: "
                          "exact, as open_clip reads the checkpoint)")
    if "img/cls" in arrays:
        raise ConfigError(f"array {arrays.source('img/cls')!r}: an image tower with a class "
                          f"token (pool_type 'tok') is not supported; {SUPPORTED}")
    if "img/MAPHead_0/probe" not in arrays:
        probe = arrays.source("img/MAPHead_0/probe")
        raise ConfigError(f"the checkpoint has no array {probe!r}: only image towers pooled by "
                          f"a MAP head are supported; {SUPPORTED}")
    kernel = arrays.get("img/embedding/kernel", 4)
    patch, patch_w, channels, width_v = kernel.shape
    if patch != patch_w:
        raise ConfigError(f"array {arrays.source('img/embedding/kernel')!r} has shape "
                          f"{kernel.shape}: the patches are not square")
    positions = arrays.get("img/pos_embedding", 3)
    grid = math.isqrt(positions.shape[1])
    if positions.shape[0] != 1 or grid * grid != positions.shape[1]:
        raise ConfigError(f"array {arrays.source('img/pos_embedding')!r} has shape "
                          f"{positions.shape}: not (1, a square grid of patches, width)")
    vocab_size, width_t = arrays.get("txt/Embed_0/embedding", 2).shape
    context = arrays.get("txt/pos_embedding", 3).shape[1]
    heads_out = {}
    for tower, name in (("vision", "img/head"), ("text", "txt/head")):
        if name + "/kernel" in arrays:
            heads_out[tower] = arrays.get(name + "/kernel", 2).shape[1]
    embed_dims = set(heads_out.values())
    if len(embed_dims) > 1:
        raise ConfigError(f"arrays {arrays.source('img/head/kernel')!r} and "
                          f"{arrays.source('txt/head/kernel')!r} project to different widths "
                          f"{heads_out}; the two embeddings must have one width")
    embed_dim = embed_dims.pop() if embed_dims else width_t
    towers, projections = {}, {}
    for tower, width, heads, head in (("vision", width_v, vision_heads, "img/head"),
                                      ("text", width_t, text_heads, "txt/head")):
        base = TOWERS[tower]
        depth = _depth(arrays, base)
        hidden = arrays.get(f"{base}encoderblock_0/MlpBlock_0/Dense_0/kernel", 2).shape[1]
        towers[tower] = {"width": width, "depth": depth,
                         "heads": _heads(tower, width, heads), "mlp_ratio": 4,
                         **({} if hidden == 4 * width else {"mlp_width": hidden}),
                         "features": None, "activation": activation,
                         "layer_norm_eps": LAYER_NORM_EPS}
        if tower in heads_out:
            projections[tower] = "linear_bias"
        elif width == embed_dim:
            projections[tower] = "none"
        else:
            raise ConfigError(f"the {tower} tower is {width} wide and has no "
                              f"{arrays.source(head + '/kernel')!r} projection, but the "
                              f"embeddings are {embed_dim} wide")
    log_scale = float(arrays.get("t", 1)[0])
    if math.exp(log_scale) > MAX_SCALE:
        warnings.warn(f"the checkpoint's logit scale exp(t) = {math.exp(log_scale):.4g} is above "
                      f"this project's default cap loss.max_scale = {MAX_SCALE:g} (big_vision "
                      "has none): set loss.max_scale = float('inf') to train it with its own "
                      "scale", stacklevel=3)
    config = {
        "name": "dual_encoder",
        "sample_encoder": {"name": "vit", "image_size": grid * patch, "patch": patch,
                           "in_channels": channels, **towers["vision"], "class_token": False,
                           "pre_norm": False, "pool": "map", "patch_bias": True},
        "text_encoder": {"name": "text_transformer", "vocab_size": vocab_size,
                         "max_tokens": context, **towers["text"], "causal": False,
                         "pool": "last"},
        "embed_dim": embed_dim,
        "sample_projection": projections["vision"],
        "text_projection": projections["text"],
        "init_temperature": math.exp(-log_scale),
    }
    if "b" in arrays:
        config.update(siglip=True, init_bias=float(arrays.get("b", 1)[0]))
    return config
