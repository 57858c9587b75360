"""Evaluation of learned representations, and the pass that gets them from a trained model.

Scores, each a pure function of arrays (tested on data whose answer is known):
:mod:`~contrastive_jax.training.evaluation.probes` (linear probe, kNN),
:mod:`~contrastive_jax.training.evaluation.zero_shot`,
:mod:`~contrastive_jax.training.evaluation.retrieval` (Recall@k),
:mod:`~contrastive_jax.training.evaluation.geometry` (alignment, uniformity).
:mod:`~contrastive_jax.training.evaluation.run_evaluation` runs a trained model (inference mode)
over a split and reports them all (its :func:`evaluate`).
"""

from contrastive_jax.training.evaluation.geometry import alignment, uniformity
from contrastive_jax.training.evaluation.probes import knn_accuracy, linear_probe
from contrastive_jax.training.evaluation.retrieval import retrieval_recall
from contrastive_jax.training.evaluation.zero_shot import (
    zero_shot_accuracy,
    zero_shot_topk,
    zero_shot_weights,
)

__all__ = ["alignment", "knn_accuracy", "linear_probe", "retrieval_recall", "uniformity",
           "zero_shot_accuracy", "zero_shot_topk", "zero_shot_weights"]
