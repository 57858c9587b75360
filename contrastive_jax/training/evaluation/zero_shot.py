"""Zero-shot classification with a dual encoder: class weights from prompt embeddings."""

from __future__ import annotations

import numpy as np

from contrastive_jax.errors import InputError
from contrastive_jax.training.evaluation.geometry import as_matrix, unit_rows


def zero_shot_weights(prompt_embeddings) -> np.ndarray:
    """Class weights ``(C, d)`` from prompt embeddings ``(C, T, d)`` (T templates per class).

    ``w_c = normalise(mean_t normalise(e_ct))``: CLIP's prompt ensembling (Radford et al.
    2021, Sec. 3.1.4). A ``(C, d)`` input is one template per class.
    """
    e = np.asarray(prompt_embeddings, np.float64)
    if e.ndim == 2:
        e = e[:, None]
    if e.ndim != 3:
        raise InputError(f"prompt embeddings must be (classes, templates, d); got {e.shape}")
    return unit_rows(unit_rows(e).mean(axis=1))


def _checked(sample_embeddings, labels, prompt_embeddings):
    """``(x (n, d), labels (n,), w (C, d))`` with the shapes and label range checked."""
    x = as_matrix("sample_embeddings", sample_embeddings)
    w = zero_shot_weights(prompt_embeddings)
    labels = np.asarray(labels)
    if w.shape[1] != x.shape[1]:
        raise InputError(f"sample embeddings have d={x.shape[1]}, prompts d={w.shape[1]}")
    if labels.shape != (len(x),) or labels.min() < 0 or labels.max() >= len(w):
        raise InputError(f"labels must be ({len(x)},) ints in [0, {len(w)}); got shape "
                         f"{labels.shape}, range [{labels.min()}, {labels.max()}]")
    return x, labels, w


def zero_shot_accuracy(sample_embeddings, labels, prompt_embeddings) -> float:
    """Accuracy of ``argmax_c cos(x_i, w_c)`` with ``w`` from :func:`zero_shot_weights`.

    sample_embeddings (n, d) from the sample tower, labels (n,) ints in [0, C),
    prompt_embeddings (C, T, d) or (C, d) from the text tower. No training on labels.
    """
    x, labels, w = _checked(sample_embeddings, labels, prompt_embeddings)
    return float(np.mean(np.argmax(unit_rows(x) @ w.T, axis=1) == labels))


def zero_shot_topk(sample_embeddings, labels, prompt_embeddings,
                   ks: tuple[int, ...] = (1, 5)) -> dict[str, float]:
    """Top-k zero-shot accuracies ``{"top1": ..., "top5": ...}`` for each ``k`` in ``ks`` with
    ``k <= C`` (CLIP's ImageNet protocol reports top-1 and top-5, [CLIP] Sec. 3.1).

    Example ``i`` counts as correct at ``k`` when fewer than ``k`` classes score strictly higher
    than its true class ``s_ic = cos(x_i, w_c)``, ``w`` from :func:`zero_shot_weights` (ties
    count in the example's favour; top-1 equals :func:`zero_shot_accuracy` when no two classes
    tie). A non-finite embedding gives NaN scores, so that example is wrong at every k.
    """
    x, labels, w = _checked(sample_embeddings, labels, prompt_embeddings)
    scores = unit_rows(x) @ w.T
    true = scores[np.arange(len(x)), labels]
    above = np.sum(scores > true[:, None], axis=1)
    finite = np.isfinite(scores).all(axis=1)
    return {f"top{k}": float(np.mean((above < k) & finite)) for k in ks if k <= len(w)}
