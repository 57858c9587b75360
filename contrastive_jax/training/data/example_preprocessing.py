"""What each example of a split becomes on its way into a batch (the ``data.preprocess``
block): NumPy dicts of the features a model reads, on the host, in grain's threads or worker
processes (:mod:`~contrastive_jax.training.data.pipeline`).

- ``standard`` (:func:`standard_preprocess`): the features of ``data.features`` kept as they
  are stored, in JAX's dtypes (images to float32 in [0, 1]);
- ``image_text`` (:func:`image_text_preprocess`): an image decoded and cropped to a square
  uint8 array (a random resized crop in training, open_clip's evaluation transform otherwise)
  and its caption tokenised;
- ``image`` (:func:`image_preprocess`): an image decoded and cropped to uint8, in training
  ``views`` random resized crops of it (SimCLR's and MoCo's two views per example).

The fields the device applies (``mean``, ``std``: :data:`DEVICE_OPTIONS`) are not the host's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_collections
import numpy as np

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.data import image_crops

Example = dict[str, np.ndarray]


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


def image_preprocess(*, image_key: str = "image", image_size: int = 224, views: int = 1,
                     crop: str = "center", crop_scale: Sequence[float] = (0.08, 1.0),
                     crop_ratio: Sequence[float] = (3 / 4, 4 / 3), resize: str = "bilinear",
                     resize_mode: str = "shortest", reduced_decode: bool = True,
                     extra_features: Sequence[str] = (), training: bool = False,
                     seed: int = 0) -> Callable[..., Example]:
    """Image example (e.g. ImageNet's ``{"image", "label"}``) -> ``{"image"}`` and the
    ``extra_features`` (e.g. ``("label",)``), for the image-only methods (SimCLR, MoCo).

    The image (encoded bytes or an (H, W, 3) uint8 array) becomes **uint8**
    (:mod:`contrastive_jax.training.data.image_crops`): in training with ``crop="random"``,
    ``views`` random resized crops of the decoded image (area fraction in ``crop_scale``,
    aspect ratio in ``crop_ratio``; SimCLR's and MoCo's torchvision crop, [SimCLR] Appendix A),
    the image decoded once (:func:`~contrastive_jax.training.data.image_crops.
    random_resized_crops`): ``(views, image_size, image_size, 3)``, or ``(image_size,
    image_size, 3)`` for one view; the boxes drawn from ``(seed, position)`` as in
    :func:`image_text_preprocess`. Otherwise (evaluation, or ``crop="center"``: an image the
    device crops, e.g. at 256 for a 224 crop) one ``(image_size, image_size, 3)`` image by
    open_clip's evaluation transform of ``resize_mode``. The device augments the views
    (``augment``: :func:`contrastive_jax.training.augmentations.recipe_augment_config`).
    ``resize``: ``"bilinear"`` (torchvision's default) or ``"bicubic"``.
    """
    image_crops.check_resize(resize)
    image_crops.check_resize_mode(resize_mode)
    if crop not in ("center", "random"):
        raise ConfigError(f"data.preprocess.crop must be 'center' or 'random'; got {crop!r}")
    if isinstance(views, bool) or not isinstance(views, int) or views < 1:
        raise ConfigError(f"data.preprocess.views must be an integer >= 1; got {views!r}")
    if views > 1 and crop != "random":
        raise ConfigError(f"data.preprocess.views={views} needs crop='random' (views are "
                          "random resized crops); set crop='random' or views=1")
    scale = image_crops.check_range(crop_scale, "crop_scale", 0.0)
    ratio = image_crops.check_range(crop_ratio, "crop_ratio", 0.0)
    if isinstance(extra_features, str) or not all(isinstance(k, str) for k in extra_features):
        raise ConfigError("data.preprocess.extra_features must be a list of feature names, "
                          f"e.g. ('label',); got {extra_features!r}")
    extra = standard_preprocess(tuple(extra_features), field="data.preprocess.extra_features") \
        if extra_features else None
    random_crop = training and crop == "random"

    def preprocess(example: Mapping, epoch: int = 0, position: int = 0) -> Example:
        del epoch  # the crops depend on the stream position only
        if image_key not in example:
            raise ConfigError(f"no image {image_key!r} in the example (it has "
                              f"{sorted(example)}); change data.preprocess.image_key")
        if random_crop:
            image = image_crops.random_resized_crops(
                example[image_key], image_size, np.random.default_rng((seed, position)), views,
                scale=scale, ratio=ratio, resize=resize, reduced_decode=reduced_decode)
            image = image[0] if views == 1 else image
        else:
            image = image_crops.evaluation_image(
                example[image_key], image_size, resize=resize, resize_mode=resize_mode,
                reduced_decode=reduced_decode and training)
        return {**(extra(example) if extra else {}), "image": image}

    return preprocess


PREPROCESSORS = {"standard": None, "image_text": image_text_preprocess,
                 "image": image_preprocess}
DEFAULT_RESIZE = {"image_text": "bicubic", "image": "bilinear"}
"""The preprocessings that decode and crop images on the host (uint8 to the device), with the
resize kernel each uses when ``data.preprocess.resize`` is unset."""


def decodes_images(preprocess: Mapping[str, Any] | None) -> bool:
    """Whether a ``data.preprocess`` block decodes and crops its images on the host
    (:data:`DEFAULT_RESIZE`: ``image_text``, ``image``), sending uint8 to the device."""
    return (preprocess or {}).get("name", "standard") in DEFAULT_RESIZE


def evaluation_resize(preprocess: Mapping[str, Any]) -> str:
    """The resize kernel of a decoding preprocessing's evaluation crop."""
    return preprocess.get("resize", DEFAULT_RESIZE[preprocess.get("name", "image_text")])


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
    """The image features that :func:`~.sources.open_split` hands over encoded: the image_text
    and image preprocessings decode their image themselves (at reduced size where they can)."""
    name, options = preprocess_options(config)
    return (options.get("image_key", "image"),) if name in DEFAULT_RESIZE else ()


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
