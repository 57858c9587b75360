"""grain input pipelines: per-host shards of a TFDS split, assembled into global batches.

Training stream, for a split of ``n`` examples, seed ``s``, global batch ``G``, and ``P``
processes (``jax.process_count()``; this one is ``p = jax.process_index()``)::

    source ─ shuffle(s) ─ repeat ─ [p::P] ─ preprocess ─ batch(G / P) ─ prefetch ─ global_batch
    (one permutation per epoch,    (host p's      (NumPy, in          (one jax.Array
     seed s + epoch, grain's        slice)         grain threads)       sharded over "data")
     index shuffle)

Positions ``k G .. (k + 1) G - 1`` of the shuffled, repeated stream form global batch ``k``;
host ``p`` reads the positions ``= p (mod P)`` of it. So the *set* of examples in global batch
``k`` is the same for any number of processes (only its row order differs), the hosts' shards
are disjoint, and over one epoch their union is the split. Every step's global batch is
assembled with :func:`contrastive_jax.mesh.global_batch` (rows of process ``p`` on its own
devices).

The returned iterators are grain ``DatasetIterator`` s: ``get_state()`` / ``set_state()`` (a
small JSON-able dict: the next position) restore the exact stream, and
``grain.checkpoint.CheckpointSave(iterator)`` saves them with orbax (one file per process).

Evaluation stream (:func:`eval_iterator`): one pass in the split's order, no shuffle, the last
global batch padded with zero examples and a boolean ``mask`` feature (False on padding), so
every host runs the same number of steps.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grain
import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh

from contrastive_jax.errors import ConfigError
from contrastive_jax.mesh import global_batch
from contrastive_jax.training.data.sources import open_split

Example = dict[str, np.ndarray]


def default_config() -> ml_collections.ConfigDict:
    """The ``data`` block of a training config, with every field the pipeline reads."""
    return ml_collections.ConfigDict({
        "name": "mnist1d",             # TFDS name ("cifar10", "digit_captions/mnist1d", ...)
        "train_split": "train",
        "eval_split": "test",
        "data_dir": "",                # "" -> CONTRASTIVE_JAX_DATA_DIR or ~/.cache/...
        "batch_size": 512,             # global training batch (all processes together)
        "eval_batch_size": 1000,       # global evaluation batch
        "seed": 0,                     # shuffling seed (each epoch: seed + epoch)
        "shuffle": True,
        "num_epochs": ml_collections.FieldReference(None, field_type=int),  # None: forever
        "features": ml_collections.FieldReference(None, field_type=tuple),  # None: all
        "num_threads": 1,              # grain reader threads per process
        "prefetch": 2,                 # batches read ahead per process
        # correlated_gaussians only: dim and rho or mutual_information (nats)
        "options": {},
        # "standard" (keep data.features, uint8 images -> [0, 1]) or "image_text" (resize,
        # tokenise: image_text_preprocess's options)
        "preprocess": {"name": "standard"},
    })


@dataclasses.dataclass(frozen=True)
class HostShard:
    """This process's place among ``count`` processes (defaults: from JAX)."""

    index: int
    count: int

    @classmethod
    def from_jax(cls) -> HostShard:
        return cls(jax.process_index(), jax.process_count())

    def __post_init__(self):
        if not 0 <= self.index < self.count:
            raise ConfigError(f"process index {self.index} not in [0, {self.count})")


def per_host_batch_size(global_batch_size: int, shard: HostShard,
                        field: str = "data.batch_size") -> int:
    """``global_batch_size / shard.count``; a ConfigError naming both, and the config ``field``
    to change, when it does not divide."""
    if global_batch_size < 1 or global_batch_size % shard.count:
        raise ConfigError(f"global batch size {global_batch_size} must be a positive multiple "
                         f"of the process count {shard.count}; change {field}")
    return global_batch_size // shard.count


def standard_preprocess(features: Sequence[str] | None = None) -> Callable[..., Example]:
    """Example -> NumPy dict: keep ``features`` (all if None), fix dtypes for JAX.

    uint8 arrays of rank >= 3 (images) become float32 in [0, 1] (x / 255); other integers
    become int32 and other floats float32 (JAX's default types; float64 is kept off by
    default). A missing feature is a ConfigError naming the available ones.
    """
    keep = None if features is None else tuple(features)

    def preprocess(example: Mapping, epoch: int = 0) -> Example:
        del epoch  # the same in every epoch
        if keep is not None:
            missing = [k for k in keep if k not in example]
            if missing:
                raise ConfigError(f"features {missing} not in the dataset; it has "
                               f"{sorted(example)}; change data.features")
            example = {k: example[k] for k in keep}
        return {k: _to_jax_dtype(np.asarray(v)) for k, v in example.items()}

    return preprocess


def resize_center_crop(image: np.ndarray, image_size: int) -> np.ndarray:
    """(H, W, 3) uint8 -> (image_size, image_size, 3) uint8: the shorter side resized to
    ``image_size`` (bilinear, PIL), then the centre crop."""
    from PIL import Image

    h, w = image.shape[:2]
    scale = image_size / min(h, w)
    size = (max(image_size, round(w * scale)), max(image_size, round(h * scale)))
    resized = np.asarray(Image.fromarray(image).resize(size, Image.BILINEAR))
    top, left = (size[1] - image_size) // 2, (size[0] - image_size) // 2
    return resized[top:top + image_size, left:left + image_size]


def image_text_preprocess(*, image_key: str = "image", caption_key: str = "captions/text",
                          image_size: int = 224, max_tokens: int = 32,
                          vocabulary: str = "", tokenizer: Mapping[str, str] | None = None,
                          vocab_size: int | None = None) -> Callable[..., Example]:
    """Image-caption example (e.g. ``coco_captions``) -> ``{"image", "caption"}``.

    The image (any (H, W, 3) uint8) is resized so its shorter side is ``image_size``
    (bilinear), centre-cropped to ``image_size`` x ``image_size`` and scaled to float32 in
    [0, 1]. ``caption_key`` is a ``/``-separated path into the example: one text, or a list of
    texts (``coco_captions``: ``captions/text``, 5-7 per image); of a list of ``k`` texts,
    epoch ``e`` of the training stream takes text ``e mod k`` (so ``k`` epochs see every
    caption of every image once; evaluation, epoch 0, the first). The text is tokenised by
    ``tokenizer`` (``{"kind", "path"}``,
    :func:`contrastive_jax.training.data.text.text_tokenizers.load_tokenizer`) or, the older
    spelling, the word vocabulary file ``vocabulary`` (default: the package's ``vocab.txt``),
    cut at ``max_tokens`` (CLIP's context length). ``vocab_size``: the text tower's embedding
    rows; a ConfigError at construction if the tokenizer's ids need more.
    """
    from contrastive_jax.training.data.text.text_tokenizers import check_vocab_size, load_tokenizer

    if tokenizer is not None and vocabulary:
        raise ConfigError("set data.preprocess.tokenizer or data.preprocess.vocabulary (a word "
                          "vocabulary, the same as tokenizer = {'kind': 'words', 'path': ...}), "
                          "not both")
    if tokenizer is None:
        tokenizer = {"kind": "words", "path": vocabulary}
    tokens_of = load_tokenizer(tokenizer)
    check_vocab_size(tokens_of, vocab_size)
    path = caption_key.split("/")

    def preprocess(example: Mapping, epoch: int = 0) -> Example:
        image = np.asarray(example[image_key])
        if image.ndim != 3 or image.shape[-1] != 3 or image.dtype != np.uint8:
            raise ConfigError(f"{image_key!r} must be (H, W, 3) uint8; got {image.shape} "
                             f"{image.dtype}")
        crop = resize_center_crop(image, image_size)
        text = example
        for key in path:
            if not isinstance(text, Mapping) or key not in text:
                raise ConfigError(f"caption key {caption_key!r}: no {key!r} in the example; "
                                  "change data.preprocess.caption_key")
            text = text[key]
        if not isinstance(text, str | bytes):
            if not len(text):
                raise ConfigError(f"an example has no caption at {caption_key!r}")
            text = text[epoch % len(text)]
        tokens = tokens_of.encode([text], max_tokens)[0]
        return {"image": crop.astype(np.float32) / np.float32(255.0), "caption": tokens}

    return preprocess


PREPROCESSORS = {"standard": None, "image_text": image_text_preprocess}


def make_preprocess(config: ml_collections.ConfigDict) -> Callable[..., Example]:
    """The preprocessing of ``config.preprocess`` (``{"name": ..., **options}``): a function
    ``(example, epoch=0) -> Example``."""
    options = config.preprocess.to_dict() if hasattr(config.preprocess, "to_dict") else dict(
        config.preprocess)
    name = options.pop("name", "standard")
    if name not in PREPROCESSORS:
        raise ConfigError(f"unknown data.preprocess.name {name!r}; valid: {sorted(PREPROCESSORS)}")
    if name == "standard":
        if options:
            raise ConfigError(f"the standard preprocessing takes no options; got {options}")
        return standard_preprocess(config.features)
    return PREPROCESSORS[name](**options)


def _to_jax_dtype(x: np.ndarray) -> np.ndarray:
    if x.dtype == np.uint8 and x.ndim >= 3:
        return x.astype(np.float32) / np.float32(255.0)
    if np.issubdtype(x.dtype, np.bool_):
        return x
    if np.issubdtype(x.dtype, np.integer):
        return x.astype(np.int32)
    if np.issubdtype(x.dtype, np.floating):
        return x.astype(np.float32)
    return x


def train_dataset(source, *, global_batch_size: int, seed: int, shuffle: bool = True,
                  num_epochs: int | None = None, shard: HostShard | None = None,
                  preprocess: Callable[..., Example] | None = None,
                  read_options: grain.ReadOptions | None = None) -> grain.IterDataset:
    """This host's training batches ``(global_batch_size / P, ...)`` as a grain IterDataset.

    ``source``: random access (``len``, ``[i]``), e.g. from :func:`open_split`. Each epoch is a
    fresh permutation (seed + epoch); ``num_epochs=None`` repeats forever. With a finite
    ``num_epochs`` the stream is cut to whole global batches, so every host gets the same
    number of batches. ``preprocess(example, epoch)`` sees the epoch of the example's global
    stream position (``position // len(source)``, the same for any process count).
    """
    shard = shard or HostShard.from_jax()
    local = per_host_batch_size(global_batch_size, shard)
    if num_epochs is not None and num_epochs < 1:
        raise ConfigError(f"num_epochs must be >= 1 or None (forever); got {num_epochs}")
    if len(source) < global_batch_size:
        raise ConfigError(f"the split has {len(source)} examples, fewer than one global batch "
                         f"({global_batch_size}); lower data.batch_size")
    ds = grain.MapDataset.source(source)
    if shuffle:
        ds = ds.shuffle(seed=seed)
    ds = ds.repeat(num_epochs)
    if num_epochs is not None:
        ds = ds[: len(ds) // global_batch_size * global_batch_size]
    n = len(source)
    ds = ds.map_with_index(lambda position, example: (position // n, example))
    ds = ds[shard.index :: shard.count]
    preprocess = preprocess or standard_preprocess()
    ds = ds.map(lambda pair: preprocess(pair[1], epoch=pair[0]))
    ds = ds.batch(local, drop_remainder=True)
    return ds.to_iter_dataset(read_options)


def eval_dataset(source, *, global_batch_size: int, shard: HostShard | None = None,
                 preprocess: Callable[..., Example] | None = None,
                 read_options: grain.ReadOptions | None = None) -> grain.IterDataset:
    """One pass over ``source`` in order; ``ceil(n / G)`` batches per host, padded, with ``mask``.

    Global batch ``k`` holds examples ``k G .. k G + G - 1`` (host ``p`` the ones ``= p mod P``);
    positions past the end are zero examples with ``mask = False``.
    """
    shard = shard or HostShard.from_jax()
    local = per_host_batch_size(global_batch_size, shard, "data.eval_batch_size")
    preprocess = preprocess or standard_preprocess()
    n = len(source)
    padded = math.ceil(n / global_batch_size) * global_batch_size
    blank = {k: np.zeros_like(v) for k, v in preprocess(source[0]).items()}

    def example(i: int) -> Example:
        if i < n:
            return {**preprocess(source[i]), "mask": np.True_}
        return {**blank, "mask": np.False_}

    ds = grain.MapDataset.range(padded)[shard.index :: shard.count].map(example)
    return ds.batch(local, drop_remainder=True).to_iter_dataset(read_options)


def train_iterator(config: ml_collections.ConfigDict, mesh: Mesh, *,
                   shard: HostShard | None = None) -> grain.DatasetIterator:
    """Global training batches (dicts of ``jax.Array`` sharded over ``mesh``'s ``data`` axis).

    ``config``: the ``data`` block (:func:`default_config`). Checkpoint the iterator with
    ``grain.checkpoint.CheckpointSave`` / ``CheckpointRestore`` or ``get_state`` /
    ``set_state``.
    """
    config = _checked(config)
    source = open_split(config.name, config.train_split, config.data_dir or None,
                        config.options.to_dict() or None)
    ds = train_dataset(source, global_batch_size=config.batch_size, seed=config.seed,
                       shuffle=config.shuffle, num_epochs=config.num_epochs, shard=shard,
                       preprocess=make_preprocess(config),
                       read_options=_read_options(config))
    return iter(ds.map(functools.partial(global_batch, mesh=mesh)))


def eval_iterator(config: ml_collections.ConfigDict, mesh: Mesh, *,
                  split: str | None = None,
                  shard: HostShard | None = None) -> grain.DatasetIterator:
    """One padded pass over ``split`` (default ``config.eval_split``) as global batches."""
    config = _checked(config)
    source = open_split(config.name, split or config.eval_split, config.data_dir or None,
                        config.options.to_dict() or None)
    ds = eval_dataset(source, global_batch_size=config.eval_batch_size, shard=shard,
                      preprocess=make_preprocess(config),
                      read_options=_read_options(config))
    return iter(ds.map(functools.partial(global_batch, mesh=mesh)))


def _read_options(config: ml_collections.ConfigDict) -> grain.ReadOptions:
    return grain.ReadOptions(num_threads=config.num_threads,
                             prefetch_buffer_size=config.prefetch)


def _checked(config: Any) -> ml_collections.ConfigDict:
    valid = default_config()
    unknown = sorted(set(config.keys()) - set(valid.keys()))
    if unknown:
        raise ConfigError(f"unknown data config fields {unknown}; valid: {sorted(valid.keys())}")
    given = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else dict(config)
    checked = ml_collections.ConfigDict({**valid.to_dict(), **given})
    for field in ("batch_size", "eval_batch_size"):  # both checked before any training
        size = checked[field]
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(f"data.{field} must be a positive integer; got {size!r}")
    return checked
