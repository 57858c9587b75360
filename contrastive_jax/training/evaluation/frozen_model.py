"""The frozen model on a dataset split: what :func:`evaluate` measures after (and during) training.

- :func:`extract_features`: encoder features and labels (inference mode, padded evaluation
  pass gathered from every process);
- :func:`pair_embeddings`: the embeddings the loss compares for positive pairs (two augmented
  views for SimCLR/MoCo; sample and caption for dual encoders);
- :func:`prompt_embeddings`: text-tower embeddings of every class prompt (zero-shot);
- :func:`evaluate`: linear probe, kNN, alignment, uniformity, retrieval and zero-shot
  (the scores themselves: :mod:`contrastive_jax.training.evaluation`).

The jitted inference functions are built once per model, so periodic evaluations reuse their
compilations.
"""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from contrastive_jax.errors import ConfigError
from contrastive_jax.training import evaluation
from contrastive_jax.training.augmentations import two_views
from contrastive_jax.training.data import captions, eval_iterator


def _gathered(arrays: tuple, mask) -> list[np.ndarray]:
    """Every process's rows of ``arrays`` (global batches), padding rows (mask 0) dropped."""
    *arrays, mask = multihost_utils.process_allgather((*arrays, mask), tiled=True)
    keep = np.asarray(mask, bool)
    return [np.asarray(a)[keep] for a in arrays]


@functools.lru_cache(maxsize=8)
def _inference(graphdef, input_key: str, text_key: str, augment_json: str):
    """The jitted inference functions of one model, built once per (model, inputs, views) so
    that periodic evaluations reuse their compilations.

    ``features(params, rest, x)``: the encoder features; ``pairs(params, rest, batch, key)``:
    the embeddings of positive pairs (see :func:`pair_embeddings`); ``texts(params, rest,
    tokens)``: text-tower embeddings.
    """
    augment = json.loads(augment_json)

    def features(params, rest, x):
        return nnx.merge(graphdef, params, rest).features(x)

    def pairs(params, rest, batch, key):
        model = nnx.merge(graphdef, params, rest)
        x = batch[input_key]
        if hasattr(model, "embed_texts"):
            return model.embed_samples(x), model.embed_texts(batch[text_key])
        v1, v2 = two_views(x, key, augment)
        return model(v1, train=False)[0], model(v2, train=False)[0]

    def texts(params, rest, tokens):
        return nnx.merge(graphdef, params, rest).embed_texts(tokens)

    return jax.jit(features), jax.jit(pairs), jax.jit(texts)


def _inference_for(graphdef, config):
    augment = config.get("augment")
    return _inference(graphdef, config.input_key, config.get("text_key", "caption"),
                      json.dumps(None if augment is None else augment.to_dict(),
                                 sort_keys=True))


def extract_features(graphdef, state, config, mesh, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Frozen encoder features and labels of every example of ``split`` (inference mode)."""
    features = _inference_for(graphdef, config)[0]
    feats, labels = [], []
    for batch in eval_iterator(config.data, mesh, split=split):
        f = features(state.params, state.rest, batch[config.input_key])
        f, y = _gathered((f, batch["label"]), batch["mask"])
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
    pairs = _inference_for(graphdef, config)[1]
    key = jax.random.key(config.seed)
    columns: dict[str, list] = {}
    for index, batch in enumerate(eval_iterator(config.data, mesh, split=split)):
        x, y = pairs(state.params, state.rest, batch, jax.random.fold_in(key, index))
        extra = [k for k in dict.fromkeys(keys) if k in batch]
        rows = _gathered((x, y, *(batch[k] for k in extra)), batch["mask"])
        for name, value in zip(["x", "y", *extra], rows, strict=True):
            columns.setdefault(name, []).append(value)
    return {name: np.concatenate(parts) for name, parts in columns.items()}


def prompt_embeddings(graphdef, state, config, modality: str) -> np.ndarray:
    """Text-tower embeddings ``(10, templates, d)`` of every class prompt (zero-shot)."""
    tokens = captions.class_prompts(modality)
    texts = _inference_for(graphdef, config)[2]
    flat = texts(state.params, state.rest, jnp.asarray(tokens.reshape(-1,
                                                                            tokens.shape[-1])))
    return np.asarray(flat).reshape(*tokens.shape[:2], -1)


def evaluate(graphdef, state, config, mesh) -> dict:
    """The frozen model on the evaluation split (features fitted on the train split).

    Linear probe and kNN on the encoder features (unless ``evaluation.classification`` is
    False: data without labels); always alignment and uniformity of the
    embeddings the loss compares (Wang & Isola 2020). A dual encoder adds retrieval
    Recall@1/5/10 both ways (a candidate is correct when it is the pair's own, or, with
    ``evaluation.retrieval_match`` naming a batch feature, when that feature is equal) and,
    with ``evaluation.zero_shot_prompts`` set to a modality of
    :func:`contrastive_jax.training.data.captions.class_prompts`, zero-shot accuracy.
    """
    ev = config.evaluation
    results = {}
    if ev.get("classification", True):  # needs labels
        train_x, train_y = extract_features(graphdef, state, config, mesh,
                                            config.data.train_split)
        test_x, test_y = extract_features(graphdef, state, config, mesh, config.data.eval_split)
        probe = evaluation.linear_probe(train_x, train_y, test_x, test_y, l2_grid=ev.l2_grid)
        knn = evaluation.knn_accuracy(train_x, train_y, test_x, test_y, k=ev.knn_k,
                                      temperature=ev.knn_temperature)
        results = {"linear_probe": probe["accuracy"], "linear_probe_l2": probe["l2"], "knn": knn}
    match = ev.get("retrieval_match", "")
    pairs = pair_embeddings(graphdef, state, config, mesh, config.data.eval_split,
                            keys=("label", match) if match else ("label",))
    results["alignment"] = evaluation.alignment(pairs["x"], pairs["y"])
    results["uniformity"] = evaluation.uniformity(pairs["x"])
    if hasattr(nnx.merge(graphdef, state.params, state.rest), "embed_texts"):
        if match and match not in pairs:
            raise ConfigError(f"evaluation.retrieval_match = {match!r} is not a feature of the "
                             f"evaluation batches of {config.data.name} (add it to "
                             "data.features, or set '' to match each pair only)")
        results.update(evaluation.retrieval_recall(pairs["x"], pairs["y"],
                                                   match_ids=pairs[match] if match else None))
        if ev.get("zero_shot_prompts"):
            prompts = prompt_embeddings(graphdef, state, config, ev.zero_shot_prompts)
            results["zero_shot"] = evaluation.zero_shot_accuracy(pairs["x"], pairs["label"],
                                                                 prompts)
    return results
