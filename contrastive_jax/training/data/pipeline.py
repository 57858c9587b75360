"""grain input pipelines: per-host shards of a TFDS split, assembled into global batches.

Training stream, for a split of ``n`` examples, seed ``s``, global batch ``G``, and ``P``
processes (``jax.process_count()``; this one is ``p = jax.process_index()``)::

    source ─ shuffle(s) ─ repeat ─ [p::P] ─ preprocess ─ batch(G / P) ─ prefetch ─ global_batch
    (one permutation per epoch,    (host p's      (NumPy: grain        (one jax.Array
     seed s + epoch, grain's        slice)         threads, or worker   sharded over "data")
     index shuffle)                                processes)

Positions ``k G .. (k + 1) G - 1`` of the shuffled, repeated stream form global batch ``k``;
host ``p`` reads the positions ``= p (mod P)`` of it. So the *set* of examples in global batch
``k`` is the same for any number of processes (only its row order differs), the hosts' shards
are disjoint, and over one epoch their union is the split. Every step's global batch is
assembled with :func:`contrastive_jax.mesh.global_batch` (rows of process ``p`` on its own
devices).

The returned iterators are grain ``DatasetIterator`` s: ``get_state()`` / ``set_state()`` (a
small JSON-able dict: the next position, and each worker's with ``data.worker_count > 0``)
restore the exact stream, and ``grain.checkpoint.CheckpointSave(iterator)`` saves them with
orbax (one file per process).

**Workers.** ``data.num_threads`` grain threads read and preprocess in this process;
``data.worker_count = k > 0`` runs the pipeline up to the batches in ``k`` worker processes
(grain's ``mp_prefetch``: worker ``i`` makes batches ``i, i + k, ...``, interleaved back in
order), for preprocessing that holds the GIL (image decoding and resizing). The batches, their
order and a resume are the same for any ``k``; a resumed run must keep the ``k`` of the run it
resumes (the saved state holds each worker's position).

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
from contrastive_jax.training.data import image_crops
from contrastive_jax.training.data.sources import open_split

Example = dict[str, np.ndarray]


def default_data_config() -> ml_collections.ConfigDict:
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
        "num_threads": 1,              # grain reader threads per process (or per worker)
        "worker_count": 0,             # grain worker processes per process (0: none)
        "prefetch": 2,                 # batches read ahead per process
        # correlated_gaussians only: dim and rho or mutual_information (nats)
        "options": {},
        # "standard" (keep data.features, uint8 images -> [0, 1]) or "image_text" (decode,
        # crop, resize to uint8, tokenise: image_text_preprocess's options; mean and std are
        # applied on the device: contrastive_jax.training.augmentations.pixels)
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


def standard_preprocess(features: Sequence[str] | None = None, *,
                        field: str = "data.features") -> Callable[..., Example]:
    """Example -> NumPy dict: keep ``features`` (all if None), fix dtypes for JAX.

    uint8 arrays of rank >= 3 (images) become float32 in [0, 1] (x / 255); other integers
    become int32 and other floats float32 (JAX's default types; float64 is kept off by
    default). A missing feature is a ConfigError naming the available ones and ``field``, the
    config entry that lists them.
    """
    keep = None if features is None else tuple(features)

    def preprocess(example: Mapping, epoch: int = 0, position: int = 0) -> Example:
        del epoch, position  # the same in every epoch and place of the stream
        if keep is not None:
            missing = [k for k in keep if k not in example]
            if missing:
                raise ConfigError(f"features {missing} not in the dataset; it has "
                               f"{sorted(example)}; change {field}")
            example = {k: example[k] for k in keep}
        return {k: _to_jax_dtype(np.asarray(v)) for k, v in example.items()}

    return preprocess


DEVICE_OPTIONS = ("mean", "std")
"""``data.preprocess`` fields the device applies (:mod:`~contrastive_jax.training.augmentations.
pixels`), not the host preprocessing."""


def image_text_preprocess(*, image_key: str = "image", caption_key: str = "captions/text",
                          image_size: int = 224, max_tokens: int = 32,
                          vocabulary: str = "", tokenizer: Mapping[str, str] | None = None,
                          vocab_size: int | None = None, resize: str = "bicubic",
                          resize_mode: str = "shortest", crop: str = "center",
                          crop_scale: Sequence[float] = (0.9, 1.0),
                          crop_ratio: Sequence[float] = (3 / 4, 4 / 3),
                          reduced_decode: bool = True, extra_features: Sequence[str] = (),
                          training: bool = False, seed: int = 0) -> Callable[..., Example]:
    """Image-caption example (e.g. ``coco_captions``) -> ``{"image", "caption"}`` and the
    ``extra_features`` (e.g. ``("label",)``: zero-shot accuracy and retrieval by class,
    ``evaluation.retrieval_match``), passed through as :func:`standard_preprocess` does.

    The image (encoded bytes, decoded here, or an (H, W, 3) uint8 array) becomes an
    ``image_size`` x ``image_size`` x 3 **uint8** array
    (:mod:`contrastive_jax.training.data.image_crops`): in training with
    ``crop="random"``, a random resized crop (area fraction in ``crop_scale``, aspect ratio in
    ``crop_ratio``; the box drawn from ``(seed, position)``, the example's place in the global
    stream, so a resumed run, any process count and any worker count crop alike); otherwise
    open_clip's evaluation transform of ``resize_mode``: ``"shortest"`` (default: the centre
    crop of the image resized to ``image_size`` on its shorter side; CLIP's) or ``"squash"``
    (the whole image resized to ``image_size`` x ``image_size``; SigLIP's). ``resize``:
    ``"bicubic"`` (CLIP, open_clip) or ``"bilinear"``. ``reduced_decode``: in training, decode
    JPEGs at the smallest DCT-reduced size that keeps the crop's resolution (evaluation always
    decodes in full, so that its pixels are open_clip's evaluation transform's). The device
    casts the uint8 image to [0, 1], augments, and applies ``data.preprocess.mean`` / ``std``
    (:mod:`contrastive_jax.training.augmentations.pixels`).

    ``caption_key`` is a ``/``-separated path into the example: one text, or a list of texts
    (``coco_captions``: ``captions/text``, 5-7 per image); of a list of ``k`` texts, epoch
    ``e`` of the training stream takes text ``e mod k`` (so ``k`` epochs see every caption of
    every image once; evaluation, epoch 0, the first). The text is tokenised by ``tokenizer``
    (``{"kind", "path"}``,
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
    image_crops.check_resize(resize)
    image_crops.check_resize_mode(resize_mode)
    if crop not in ("center", "random"):
        raise ConfigError(f"data.preprocess.crop must be 'center' or 'random'; got {crop!r}")
    scale = image_crops.check_range(crop_scale, "crop_scale", 0.0)
    ratio = image_crops.check_range(crop_ratio, "crop_ratio", 0.0)
    if tokenizer is None:
        tokenizer = {"kind": "words", "path": vocabulary}
    tokens_of = load_tokenizer(tokenizer)
    check_vocab_size(tokens_of, vocab_size)
    path = caption_key.split("/")
    random_crop = training and crop == "random"
    if isinstance(extra_features, str) or not all(isinstance(k, str) for k in extra_features):
        raise ConfigError("data.preprocess.extra_features must be a list of feature names, "
                          f"e.g. ('label',); got {extra_features!r}")
    extra = standard_preprocess(tuple(extra_features), field="data.preprocess.extra_features") \
        if extra_features else None

    def preprocess(example: Mapping, epoch: int = 0, position: int = 0) -> Example:
        if image_key not in example:
            raise ConfigError(f"no image {image_key!r} in the example (it has "
                              f"{sorted(example)}); change data.preprocess.image_key")
        if random_crop:
            rng = np.random.default_rng((seed, position))
            image = image_crops.random_resized_crop(
                example[image_key], image_size, rng, scale=scale, ratio=ratio, resize=resize,
                reduced_decode=reduced_decode)
        else:  # evaluation decodes in full: open_clip's evaluation pixels exactly
            image = image_crops.evaluation_image(
                example[image_key], image_size, resize=resize, resize_mode=resize_mode,
                reduced_decode=reduced_decode and training)
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
        return {**(extra(example) if extra else {}), "image": image, "caption": tokens}

    return preprocess


PREPROCESSORS = {"standard": None, "image_text": image_text_preprocess}


def preprocess_options(config: ml_collections.ConfigDict) -> tuple[str, dict[str, Any]]:
    """``(name, options)`` of ``config.preprocess`` (the ``data`` block), without the fields the
    device applies (:data:`DEVICE_OPTIONS`)."""
    block = config.preprocess
    options = block.to_dict() if hasattr(block, "to_dict") else dict(block)
    name = options.pop("name", "standard")
    if name not in PREPROCESSORS:
        raise ConfigError(f"unknown data.preprocess.name {name!r}; valid: {sorted(PREPROCESSORS)}")
    for field in DEVICE_OPTIONS:
        options.pop(field, None)
    return name, options


def make_preprocess(config: ml_collections.ConfigDict, *,
                    training: bool = False) -> Callable[..., Example]:
    """The preprocessing of ``config.preprocess`` (``{"name": ..., **options}``): a function
    ``(example, epoch=0, position=0) -> Example``. ``training``: the training stream's (a
    random crop where configured), else evaluation's."""
    name, options = preprocess_options(config)
    if name == "standard":
        if options:
            raise ConfigError(f"the standard preprocessing takes no options; got {options}")
        return standard_preprocess(config.features)
    return PREPROCESSORS[name](**options, training=training, seed=config.get("seed", 0))


def encoded_images(config: ml_collections.ConfigDict) -> tuple[str, ...]:
    """The image features that :func:`open_split` hands over encoded: the image_text
    preprocessing decodes its image itself (at reduced size where it can)."""
    name, options = preprocess_options(config)
    return (options.get("image_key", "image"),) if name == "image_text" else ()


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
                  read_options: grain.ReadOptions | None = None,
                  worker_count: int = 0) -> grain.IterDataset:
    """This host's training batches ``(global_batch_size / P, ...)`` as a grain IterDataset.

    ``source``: random access (``len``, ``[i]``), e.g. from :func:`open_split`. Each epoch is a
    fresh permutation (seed + epoch); ``num_epochs=None`` repeats forever. With a finite
    ``num_epochs`` the stream is cut to whole global batches, so every host gets the same
    number of batches. ``preprocess(example, epoch, position)`` sees the example's global
    stream position and its epoch (``position // len(source)``), the same for any process
    count. ``worker_count > 0``: the batches made in that many grain worker processes (the
    same batches; module docstring).
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
    ds = ds.map_with_index(lambda position, example: (position, example))
    ds = ds[shard.index :: shard.count]
    preprocess = preprocess or standard_preprocess()
    ds = ds.map(lambda pair: preprocess(pair[1], epoch=pair[0] // n, position=pair[0]))
    ds = ds.batch(local, drop_remainder=True)
    return _in_workers(ds.to_iter_dataset(read_options), worker_count, read_options)


def eval_dataset(source, *, global_batch_size: int, shard: HostShard | None = None,
                 preprocess: Callable[..., Example] | None = None,
                 read_options: grain.ReadOptions | None = None,
                 worker_count: int = 0) -> grain.IterDataset:
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
    ds = ds.batch(local, drop_remainder=True).to_iter_dataset(read_options)
    return _in_workers(ds, worker_count, read_options)


def _in_workers(ds: grain.IterDataset, worker_count: int,
                read_options: grain.ReadOptions | None) -> grain.IterDataset:
    """``ds`` made in ``worker_count`` grain worker processes (0: in this one)."""
    if isinstance(worker_count, bool) or not isinstance(worker_count, int) or worker_count < 0:
        raise ConfigError(f"data.worker_count must be an integer >= 0; got {worker_count!r}")
    if worker_count == 0:
        return ds
    from absl import flags

    if not flags.FLAGS.is_parsed():  # grain's workers read its absl flags: their defaults
        flags.FLAGS.mark_as_parsed()  # where no absl.app parsed them (a notebook, a test)
    buffer = read_options.prefetch_buffer_size if read_options else 1
    return ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=worker_count,
                                                       per_worker_buffer_size=max(1, buffer)))


def train_iterator(config: ml_collections.ConfigDict, mesh: Mesh, *,
                   shard: HostShard | None = None) -> grain.DatasetIterator:
    """Global training batches (dicts of ``jax.Array`` sharded over ``mesh``'s ``data`` axis).

    ``config``: the ``data`` block (:func:`default_data_config`). Checkpoint the iterator with
    ``grain.checkpoint.CheckpointSave`` / ``CheckpointRestore`` or ``get_state`` /
    ``set_state``.
    """
    config = _checked(config)
    source = open_split(config.name, config.train_split, config.data_dir or None,
                        config.options.to_dict() or None, encoded_images=encoded_images(config))
    ds = train_dataset(source, global_batch_size=config.batch_size, seed=config.seed,
                       shuffle=config.shuffle, num_epochs=config.num_epochs, shard=shard,
                       preprocess=make_preprocess(config, training=True),
                       read_options=_read_options(config), worker_count=config.worker_count)
    return iter(ds.map(functools.partial(global_batch, mesh=mesh)))


def eval_iterator(config: ml_collections.ConfigDict, mesh: Mesh, *,
                  split: str | None = None,
                  shard: HostShard | None = None) -> grain.DatasetIterator:
    """One padded pass over ``split`` (default ``config.eval_split``) as global batches."""
    config = _checked(config)
    source = open_split(config.name, split or config.eval_split, config.data_dir or None,
                        config.options.to_dict() or None, encoded_images=encoded_images(config))
    ds = eval_dataset(source, global_batch_size=config.eval_batch_size, shard=shard,
                      preprocess=make_preprocess(config),
                      read_options=_read_options(config), worker_count=config.worker_count)
    return iter(ds.map(functools.partial(global_batch, mesh=mesh)))


def _read_options(config: ml_collections.ConfigDict) -> grain.ReadOptions:
    return grain.ReadOptions(num_threads=config.num_threads,
                             prefetch_buffer_size=config.prefetch)


def _checked(config: Any) -> ml_collections.ConfigDict:
    valid = default_data_config()
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
