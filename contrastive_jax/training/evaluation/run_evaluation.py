"""The evaluation run: a trained model, in inference mode, over a dataset's splits, and the
scores of its features and embeddings (:func:`evaluate`, after and during training).

- :func:`extract_features`: encoder features and labels (inference mode, padded evaluation
  pass gathered from every process);
- :func:`pair_embeddings`: the embeddings the loss compares for positive pairs (two augmented
  views for SimCLR/MoCo; sample and caption for dual encoders);
- :func:`prompt_embeddings`: text-tower embeddings of every class prompt (zero-shot);
- :func:`class_name_zero_shot`: zero-shot top-1/top-5 with class names and prompt templates
  (``evaluation.zero_shot``) on any TFDS image dataset's split.

The benchmark tasks of ``evaluation.tasks`` run on the same inference functions
(:mod:`~contrastive_jax.training.evaluation.training_tasks`).

The named evaluations that score these passes (linear probe, kNN, alignment, uniformity,
retrieval, zero-shot, the tasks) are :mod:`~contrastive_jax.training.evaluation.evaluators`'.

The jitted inference functions are built once per model, so periodic evaluations reuse their
compilations.
"""

from __future__ import annotations

import contextlib
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from contrastive_jax.errors import ConfigError
from contrastive_jax.mesh import DATA_AXIS, global_batch
from contrastive_jax.training import evaluation
from contrastive_jax.training.augmentations import two_views
from contrastive_jax.training.augmentations.pixels import (
    Pixels,
    model_input,
    normalize,
    pixel_normalization,
    unit_range,
)
from contrastive_jax.training.data import eval_dataset, eval_iterator, open_split
from contrastive_jax.training.data.example_preprocessing import (
    decodes_images,
    evaluation_resize,
    standard_preprocess,
)
from contrastive_jax.training.data.image_crops import evaluation_image
from contrastive_jax.training.data.text import captions
from contrastive_jax.training.data.text import prompt_templates as prompts_of
from contrastive_jax.training.data.text.text_tokenizers import check_vocab_size, load_tokenizer
from contrastive_jax.training.models.scanned_layers import batch_sharded


def gathered(arrays: tuple, mask) -> list[np.ndarray]:
    """Every process's rows of ``arrays`` (global batches), padding rows (mask 0) dropped."""
    *arrays, mask = multihost_utils.process_allgather((*arrays, mask), tiled=True)
    keep = np.asarray(mask, bool)
    return [np.asarray(a)[keep] for a in arrays]


@functools.lru_cache(maxsize=8)
def _inference(graphdef, input_key: str, text_key: str, augment_json: str, pixels: Pixels,
               mesh=None):
    """The jitted inference functions of one model, built once per (model, inputs, views) so
    that periodic evaluations reuse their compilations.

    ``features(params, rest, x)``: the encoder features; ``pairs(params, rest, batch, key)``:
    the embeddings of positive pairs (see :func:`pair_embeddings`); ``texts(params, rest,
    tokens)``: text-tower embeddings. Images (uint8 or in [0, 1]) are the model's input as in
    training: in [0, 1], the views (if any) drawn, then ``pixels``' normalisation
    (:mod:`contrastive_jax.training.augmentations.pixels`).
    """
    augment = json.loads(augment_json)

    def features(params, rest, x):
        with _on(mesh):
            return nnx.merge(graphdef, params, rest).representations(model_input(x, pixels))

    def pairs(params, rest, batch, key):
        model = nnx.merge(graphdef, params, rest)
        x = unit_range(batch[input_key])
        with _on(mesh):
            if hasattr(model, "embed_texts"):
                return (model.embed_samples(normalize(x, pixels)),
                        model.embed_texts(batch[text_key]))
            v1, v2 = (normalize(v, pixels) for v in two_views(x, key, augment))
            return model(v1, train=False)[0], model(v2, train=False)[0]

    def texts(params, rest, tokens):
        with _on(mesh):
            return nnx.merge(graphdef, params, rest).embed_texts(tokens)

    return jax.jit(features), jax.jit(pairs), jax.jit(texts)


def _on(mesh):
    """Scanned blocks keep a batch split over ``mesh``'s data axis (``None``: no mesh, a batch
    on one device; :func:`~contrastive_jax.training.models.scanned_layers.batch_sharded`)."""
    return contextlib.nullcontext() if mesh is None else batch_sharded(mesh, DATA_AXIS)


def inference_functions(graphdef, config, mesh=None):
    """:func:`_inference`'s ``(features, pairs, texts)`` for the model ``graphdef`` with
    ``config``'s inputs, views and pixels."""
    augment = config.get("augment")
    return _inference(graphdef, config.input_key, config.get("text_key", "caption"),
                      json.dumps(None if augment is None else augment.to_dict(),
                                 sort_keys=True),
                      pixel_normalization(config.data.get("preprocess")), mesh)


def extract_features(graphdef, state, config, mesh, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Encoder features ``(n, features)`` and labels ``(n,)`` of every example of ``split``, in
    inference mode (no dropout, BatchNorm's running statistics; no gradient)."""
    features = inference_functions(graphdef, config, mesh)[0]
    feats, labels = [], []
    for batch in eval_iterator(config.data, mesh, split=split):
        f = features(state.params, state.rest, batch[config.input_key])
        f, y = gathered((f, batch["label"]), batch["mask"])
        feats.append(f)
        labels.append(y)
    return np.concatenate(feats), np.concatenate(labels)


def pair_embeddings(graphdef, state, config, mesh, split: str,
                    keys: tuple[str, ...] = ("label",)) -> dict[str, np.ndarray]:
    """The embeddings the loss compares, for positive pairs over ``split`` (inference mode).

    A dual encoder: ``x`` the sample tower's, ``y`` the text tower's embedding of its caption.
    SimCLR / MoCo: ``x`` and ``y`` the encoder + head outputs of two augmented views of each
    example (the augmentation keys fixed by ``config.seed``). Plus the batch features named in
    ``keys`` that the data has. Not normalised (the metrics normalise).
    """
    pairs = inference_functions(graphdef, config, mesh)[1]
    key = jax.random.key(config.seed)
    columns: dict[str, list] = {}
    for index, batch in enumerate(eval_iterator(config.data, mesh, split=split)):
        x, y = pairs(state.params, state.rest, batch, jax.random.fold_in(key, index))
        extra = [k for k in dict.fromkeys(keys) if k in batch]
        rows = gathered((x, y, *(batch[k] for k in extra)), batch["mask"])
        for name, value in zip(["x", "y", *extra], rows, strict=True):
            columns.setdefault(name, []).append(value)
    return {name: np.concatenate(parts) for name, parts in columns.items()}


def prompt_embeddings(graphdef, state, config, modality: str) -> np.ndarray:
    """Text-tower embeddings ``(10, templates, d)`` of every class prompt (zero-shot)."""
    tokens = captions.class_prompts(modality)
    texts = inference_functions(graphdef, config)[2]
    flat = texts(state.params, state.rest, jnp.asarray(tokens.reshape(-1,
                                                                            tokens.shape[-1])))
    return np.asarray(flat).reshape(*tokens.shape[:2], -1)


ZERO_SHOT_FIELDS = ("class_names", "templates", "dataset", "split", "input_key", "label_key",
                    "batch_size")
PROMPT_CHUNK = 256  # prompts per text-tower call (one compilation for any class count)


@functools.lru_cache(maxsize=8)
def sample_embedder(graphdef, pixels: Pixels, mesh=None):
    """The jitted ``(params, rest, x) -> embed_samples(model_input(x, pixels))`` of one
    model (a batch split over ``mesh``'s data axis)."""
    def embed(params, rest, x):
        with _on(mesh):
            return nnx.merge(graphdef, params, rest).embed_samples(model_input(x, pixels))

    return jax.jit(embed)


def run_tokenizer(config) -> tuple:
    """The run's tokenizer and token length: ``data.preprocess.tokenizer`` (or ``vocabulary``)
    and ``max_tokens`` with the ``image_text`` preprocessing (ConfigError when its ids need
    more than ``data.preprocess.vocab_size`` embedding rows); otherwise (captions tokenised in
    the dataset, e.g. ``digit_captions``) the package's word vocabulary and
    ``model.text_encoder.max_tokens``."""
    pre = config.data.get("preprocess", {})
    if pre.get("name", "standard") == "image_text":
        spec = pre.get("tokenizer") or {"kind": "words", "path": pre.get("vocabulary", "")}
        tokenizer = load_tokenizer(dict(spec))
        check_vocab_size(tokenizer, pre.get("vocab_size"), "data.preprocess.vocab_size")
        return tokenizer, int(pre.get("max_tokens", 32))
    length = config.model.get("text_encoder", {}).get("max_tokens", captions.MAX_TOKENS)
    return load_tokenizer({"kind": "words", "path": ""}), int(length)


def class_name_prompt_embeddings(graphdef, state, config, class_names, templates) -> np.ndarray:
    """Text-tower embeddings ``(C, T, d)`` of every ``templates[t].format(class_names[c])``,
    tokenised by the run's tokenizer (:func:`run_tokenizer`), ``PROMPT_CHUNK`` prompts a call."""
    tokenizer, max_tokens = run_tokenizer(config)
    tokens = prompts_of.prompt_tokens(class_names, templates, tokenizer, max_tokens)
    flat = tokens.reshape(-1, max_tokens)
    n = len(flat)
    flat = np.concatenate([flat, np.repeat(flat[:1], -n % PROMPT_CHUNK, axis=0)])
    texts = inference_functions(graphdef, config)[2]
    out = [np.asarray(texts(state.params, state.rest, jnp.asarray(flat[i:i + PROMPT_CHUNK])))
           for i in range(0, len(flat), PROMPT_CHUNK)]
    return np.concatenate(out)[:n].reshape(len(class_names), len(templates), -1)


def _zero_shot_settings(config) -> dict:
    zs = config.evaluation.zero_shot
    zs = zs.to_dict() if hasattr(zs, "to_dict") else dict(zs)
    unknown = sorted(set(zs) - set(ZERO_SHOT_FIELDS))
    if unknown:
        raise ConfigError(f"unknown evaluation.zero_shot fields {unknown}; valid: "
                          f"{sorted(ZERO_SHOT_FIELDS)}")
    size = zs.get("batch_size", 0) or config.data.eval_batch_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"evaluation.zero_shot.batch_size must be a positive integer (0: "
                          f"data.eval_batch_size); got {size!r}")
    return {"dataset": zs.get("dataset") or config.data.name,
            "split": zs.get("split") or config.data.eval_split,
            "input_key": zs.get("input_key") or config.input_key,
            "label_key": zs.get("label_key") or "label", "batch_size": size,
            "class_names": zs.get("class_names", ""), "templates": zs.get("templates", "")}


def zero_shot_samples(graphdef, state, config, mesh, source, input_key: str,
                      label_key: str, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Sample-tower embeddings ``(n, d)`` and labels ``(n,)`` of every example of ``source``
    (one padded pass, every process's rows gathered). Inputs as in evaluation: with the
    ``image_text`` or ``image`` preprocessing, the image (encoded bytes or (H, W, 3) uint8) becomes
    ``data.preprocess.image_size`` uint8 by its ``resize`` and ``resize_mode`` (centre crop or
    squash, decoded in full), and
    normalised on the device (``data.preprocess.mean`` / ``std``); otherwise the standard
    preprocessing (uint8 images to [0, 1])."""
    pre = config.data.get("preprocess", {})
    size = pre.get("image_size", 224) if decodes_images(pre) else None
    crop = functools.partial(evaluation_image, size=size,
                             resize=evaluation_resize(pre) if size else "bicubic",
                             resize_mode=pre.get("resize_mode", "shortest"),
                             reduced_decode=False)  # in full, as open_clip's evaluation
    standard = standard_preprocess((input_key, label_key))
    label_of = standard_preprocess((label_key,))

    def preprocess(example, epoch: int = 0):
        del epoch
        missing = [k for k in (input_key, label_key) if k not in example]
        if missing:
            raise ConfigError(f"evaluation.zero_shot: {missing} not in the examples of the "
                              f"zero-shot dataset (it has {sorted(example)}); change "
                              "evaluation.zero_shot.input_key / label_key")
        if size is not None:  # uint8 to the device
            return {"x": crop(example[input_key]),
                    "label": label_of(example)[label_key]}
        out = standard(example)
        return {"x": out[input_key], "label": out[label_key]}

    embed = sample_embedder(graphdef, pixel_normalization(config.data.get("preprocess")),
                             mesh)
    xs, ys = [], []
    for batch in eval_dataset(source, global_batch_size=batch_size, preprocess=preprocess):
        batch = global_batch(batch, mesh)
        x = embed(state.params, state.rest, batch["x"])
        x, y = gathered((x, batch["label"]), batch["mask"])
        xs.append(x)
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)


def class_name_zero_shot(graphdef, state, config, mesh) -> dict[str, float]:
    """Zero-shot accuracy with class names and templates (``evaluation.zero_shot``):
    ``{"zero_shot": top-1, "zero_shot_top5": top-5}`` (top-5 with at least 5 classes).

    Class ``c``'s weight is the normalised mean over templates of the normalised text
    embeddings of ``templates[t].format(name_c)`` ([CLIP] Sec. 3.1.4); an example of
    ``dataset[split]`` is classified by the cosine of its sample embedding with each weight
    (:func:`contrastive_jax.training.evaluation.zero_shot.zero_shot_topk`). ConfigError for a
    bad field, or labels outside ``[0, len(class_names))``.
    """
    zs = _zero_shot_settings(config)
    templates = prompts_of.resolve_templates(zs["templates"])
    decoded = decodes_images(config.data.get("preprocess"))
    source = open_split(zs["dataset"], zs["split"], config.data.data_dir or None,
                        encoded_images=(zs["input_key"],) if decoded else ())
    names = prompts_of.resolve_class_names(
        zs["class_names"],
        label_names=lambda: prompts_of.tfds_label_names(source.dataset_info, zs["label_key"]))
    x, labels = zero_shot_samples(graphdef, state, config, mesh, source, zs["input_key"],
                                  zs["label_key"], zs["batch_size"])
    if labels.size and (labels.min() < 0 or labels.max() >= len(names)):
        raise ConfigError(f"{zs['dataset']}[{zs['split']}] has labels in [{labels.min()}, "
                          f"{labels.max()}] but evaluation.zero_shot.class_names gave "
                          f"{len(names)} names; give one name per class")
    prompts = class_name_prompt_embeddings(graphdef, state, config, names, templates)
    scores = evaluation.zero_shot_topk(x, labels, prompts)
    return {"zero_shot": scores["top1"], **({"zero_shot_top5": scores["top5"]}
                                            if "top5" in scores else {})}
