"""Classification metrics from class scores, as the benchmarks report them: top-k accuracy and
mean per-class recall (docs/evaluation.md, "Metrics").

The scores ``s (n, C)`` are any per-class scores (zero-shot cosines, a probe's logits). Classes
are ranked by score, highest first; **ties go to the lower class index** (the order a stable
sort, ``numpy.argmax`` and ``torch.argmax`` give), so the predicted class is the first
maximum and ``acc@1`` is the fraction of examples whose prediction is their label. A row with a
non-finite score is wrong at every ``k`` and predicts no class.

- ``acc@k`` = ``mean_i [rank_i < k]`` with ``rank_i = #{c : s_ic > s_iy} + #{c < y : s_ic =
  s_iy}`` (``y = labels[i]``; CLIP's top-1/top-5, [CLIP] Sec. 3.1);
- ``mean_per_class_recall`` = ``mean_{c in present} #{i : y_i = c, pred_i = c} / #{i : y_i = c}``
  over the classes that have examples (scikit-learn's ``balanced_accuracy_score`` of the
  predictions, which CLIP_benchmark and DataComp report; classes with no example are left out,
  as there).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from contrastive_jax.errors import InputError


def label_ranks(scores, labels) -> np.ndarray:
    """``(n,)`` the rank of each example's label among the classes (0 = predicted; ties to the
    lower index); ``n_classes`` for a row with a non-finite score (wrong at every k).

    scores (n, C) float, labels (n,) ints in [0, C).
    """
    scores, labels = _checked(scores, labels)
    n, classes = scores.shape
    true = scores[np.arange(n), labels][:, None]
    lower = np.arange(classes)[None, :] < labels[:, None]
    rank = np.sum(scores > true, axis=1) + np.sum((scores == true) & lower, axis=1)
    return np.where(np.isfinite(scores).all(axis=1), rank, classes)


def classification_metrics(scores, labels, ks: Sequence[int] = (1, 5)) -> dict[str, float]:
    """``{"acc1", "acc5", "mean_per_class_recall"}`` of class scores (module docstring).

    scores (n, C), labels (n,) ints in [0, C). ``acc{k}`` for each ``k`` in ``ks`` with
    ``k <= C`` (a 2-class task has no acc5). An :class:`InputError` for shapes that do not match
    or labels out of range.
    """
    if not ks or min(ks) < 1:
        raise InputError(f"ks must be positive integers; got {tuple(ks)}")
    scores, labels = _checked(scores, labels)
    rank = label_ranks(scores, labels)
    out = {f"acc{k}": float(np.mean(rank < k)) for k in ks if k <= scores.shape[1]}
    correct = rank == 0  # the prediction is the label
    present = np.unique(labels)
    out["mean_per_class_recall"] = float(np.mean([correct[labels == c].mean()
                                                  for c in present]))
    return out


def _checked(scores, labels) -> tuple[np.ndarray, np.ndarray]:
    scores, labels = np.asarray(scores), np.asarray(labels)
    if scores.ndim != 2 or labels.shape != (len(scores),) or not len(scores):
        raise InputError(f"scores must be (n, classes) and labels (n,) with n >= 1; got "
                         f"{scores.shape} and {labels.shape}")
    if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0 or \
            labels.max() >= scores.shape[1]:
        raise InputError(f"labels must be integers in [0, {scores.shape[1]}) (one score per "
                         f"class); got {labels.dtype} in [{labels.min()}, {labels.max()}]")
    return scores, labels
