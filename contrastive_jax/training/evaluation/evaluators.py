"""The evaluations of a run, by name: each an :class:`Evaluator` that owns its metrics.

A run's evaluation (after training, and every ``evaluation.every`` steps) is the list of
evaluators ``evaluation.evaluators`` names, in the order of :data:`EVALUATORS`; the empty
default takes the ones the config's other ``evaluation`` fields ask for (:func:`selected`),
as big_vision's ``config.evals`` lists its evaluators:

==================  =========================================  ================================
name                metrics (results.json, TensorBoard         runs by default when
                    ``eval/NAME``, the progress lines)
==================  =========================================  ================================
``classification``  ``linear_probe``, ``linear_probe_l2``,    ``evaluation.classification``
                    ``knn`` (the encoder's features; needs     (True)
                    labels)
``geometry``        ``alignment``, ``uniformity`` of the       always
                    embeddings the loss compares
``retrieval``       ``x_to_y_r{1,5,10}``, ``y_to_x_r...``      a dual encoder
                    (sample <-> caption)
``zero_shot``       ``zero_shot`` (+ ``zero_shot_top5`` with   a dual encoder with
                    class names)                               ``zero_shot_prompts`` or
                                                               ``zero_shot.class_names``
``tasks``           ``KIND/DATASET/METRIC`` of each benchmark  ``evaluation.tasks`` set
                    task (docs/evaluation.md)
==================  =========================================  ================================

The trainer, its progress lines and ``results.json`` know none of these names: they print an
evaluator's ``title``, log every metric it returns, and show the ones its ``shown`` keeps. A
new evaluation is one :class:`Evaluator` added to :data:`EVALUATORS` (docs/architecture.md,
"Extending"). Settings are checked when the run starts (:func:`selected`, from the run's
resolve step), not at its first evaluation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from flax import nnx

from contrastive_jax.errors import ConfigError
from contrastive_jax.training import evaluation
from contrastive_jax.training.evaluation import run_evaluation as passes
from contrastive_jax.training.evaluation import training_tasks


@dataclasses.dataclass
class Context:
    """What every evaluator of one evaluation shares: the model (``graphdef``, ``state`` with
    ``params`` and ``rest``), the run's config and mesh, and the evaluation split's pair
    embeddings computed once (:meth:`pairs`)."""

    graphdef: Any
    state: Any
    config: Any
    mesh: Any
    _pairs: dict | None = None

    @property
    def has_text_tower(self) -> bool:
        return hasattr(nnx.merge(self.graphdef, self.state.params, self.state.rest),
                       "embed_texts")

    def pairs(self) -> dict[str, np.ndarray]:
        """:func:`~.run_evaluation.pair_embeddings` of the evaluation split, with the labels
        and ``evaluation.retrieval_match``'s feature (computed at the first call)."""
        if self._pairs is None:
            match = self.config.evaluation.get("retrieval_match", "")
            self._pairs = passes.pair_embeddings(
                self.graphdef, self.state, self.config, self.mesh,
                self.config.data.eval_split, keys=("label", match) if match else ("label",))
        return self._pairs


@dataclasses.dataclass(frozen=True)
class Evaluator:
    """One named evaluation: ``title`` (what the status line says it computes, for a
    config), ``metrics``
    (the names of the scores it returns for a config, which it owns; a name ending in ``/``
    owns every score under it, as a benchmark task's ``KIND/DATASET/``), ``run`` (the scores
    of one model), ``default`` (whether a config's evaluation runs it when
    ``evaluation.evaluators`` is empty), ``check`` (the config's settings for it, raising a
    :class:`ConfigError` when the run starts) and ``hidden`` (metrics logged but left off the
    console line)."""

    name: str
    title: Callable[[Any], str]
    metrics: Callable[[Any], tuple[str, ...]]
    run: Callable[[Context], dict[str, float]]
    default: Callable[[Any], bool]
    check: Callable[[Any], None] = lambda config: None
    hidden: tuple[str, ...] = ()

    def owns(self, metric: str, config) -> bool:
        """Whether ``metric`` is one of this evaluator's scores for ``config``."""
        return any(metric == name or (name.endswith("/") and metric.startswith(name))
                   for name in self.metrics(config))


def _dual_encoder(config) -> bool:
    return config.model.get("name") == "dual_encoder"


def _classification(ctx: Context) -> dict[str, float]:
    ev, data = ctx.config.evaluation, ctx.config.data
    train_x, train_y = passes.extract_features(ctx.graphdef, ctx.state, ctx.config, ctx.mesh,
                                               data.train_split)
    test_x, test_y = passes.extract_features(ctx.graphdef, ctx.state, ctx.config, ctx.mesh,
                                             data.eval_split)
    probe = evaluation.linear_probe(train_x, train_y, test_x, test_y, l2_grid=ev.l2_grid)
    knn = evaluation.knn_accuracy(train_x, train_y, test_x, test_y, k=ev.knn_k,
                                  temperature=ev.knn_temperature)
    return {"linear_probe": probe["accuracy"], "linear_probe_l2": probe["l2"], "knn": knn}


def _geometry(ctx: Context) -> dict[str, float]:
    pairs = ctx.pairs()
    return {"alignment": evaluation.alignment(pairs["x"], pairs["y"]),
            "uniformity": evaluation.uniformity(pairs["x"])}


RECALL_KS = (1, 5, 10)


def _retrieval(ctx: Context) -> dict[str, float]:
    match = ctx.config.evaluation.get("retrieval_match", "")
    pairs = ctx.pairs()
    if match and match not in pairs:
        raise ConfigError(f"evaluation.retrieval_match = {match!r} is not a feature of the "
                          f"evaluation batches of {ctx.config.data.name} (add it to "
                          "data.features, or set '' to match each pair only)")
    return evaluation.retrieval_recall(pairs["x"], pairs["y"], ks=RECALL_KS,
                                       match_ids=pairs[match] if match else None)


def _class_names(config) -> Any:
    return config.evaluation.get("zero_shot", {}).get("class_names", "")


def _zero_shot(ctx: Context) -> dict[str, float]:
    if _class_names(ctx.config):
        return passes.class_name_zero_shot(ctx.graphdef, ctx.state, ctx.config, ctx.mesh)
    prompts = passes.prompt_embeddings(ctx.graphdef, ctx.state, ctx.config,
                                       ctx.config.evaluation.zero_shot_prompts)
    pairs = ctx.pairs()
    return {"zero_shot": evaluation.zero_shot_accuracy(pairs["x"], pairs["label"], prompts)}


def _check_zero_shot(config) -> None:
    if config.evaluation.get("zero_shot_prompts") and _class_names(config):
        raise ConfigError("set evaluation.zero_shot_prompts (the digit prompts) or "
                          "evaluation.zero_shot.class_names, not both")


def _task_metrics(config) -> tuple[str, ...]:
    return tuple(f"{task.name}/" for task in training_tasks.check_tasks(config))


def _tasks(ctx: Context) -> dict[str, float]:
    return training_tasks.benchmark_tasks(ctx.graphdef, ctx.state, ctx.config, ctx.mesh)


EVALUATORS: dict[str, Evaluator] = {e.name: e for e in (
    Evaluator("classification", lambda config: "linear probe, kNN",
              lambda config: ("linear_probe", "linear_probe_l2", "knn"), _classification,
              default=lambda config: bool(config.evaluation.get("classification", True)),
              hidden=("linear_probe_l2",)),
    Evaluator("geometry", lambda config: "alignment and uniformity",
              lambda config: ("alignment", "uniformity"), _geometry,
              default=lambda config: True),
    Evaluator("retrieval", lambda config: "retrieval",
              lambda config: tuple(f"{d}_r{k}" for d in ("x_to_y", "y_to_x")
                                   for k in RECALL_KS),
              _retrieval, default=_dual_encoder),
    Evaluator("zero_shot", lambda config: "zero-shot",
              lambda config: ("zero_shot", "zero_shot_top5") if _class_names(config)
              else ("zero_shot",),
              _zero_shot, check=_check_zero_shot,
              default=lambda config: _dual_encoder(config) and bool(
                  config.evaluation.get("zero_shot_prompts") or _class_names(config))),
    Evaluator("tasks", lambda config: "tasks " + ", ".join(config.evaluation.tasks),
              _task_metrics, _tasks, check=training_tasks.check_tasks,
              default=lambda config: bool(config.evaluation.get("tasks") or ())),
)}
# the evaluators that need a text tower
NEEDS_TEXT = ("retrieval", "zero_shot")


def selected(config) -> tuple[Evaluator, ...]:
    """The evaluators of ``config``'s evaluation, in :data:`EVALUATORS`' order:
    ``evaluation.evaluators`` (names), or with none named the defaults the other fields ask for
    (module docstring); each one's settings checked. A :class:`ConfigError` names an unknown
    evaluator, one that needs a text tower on a model without one, or a bad setting."""
    names = config.evaluation.get("evaluators") or ()
    unknown = sorted(set(names) - set(EVALUATORS))
    if unknown:
        raise ConfigError(f"unknown evaluation.evaluators {unknown}; valid: {list(EVALUATORS)}")
    if names:
        chosen = [e for e in EVALUATORS.values() if e.name in names]
        text = [e.name for e in chosen if e.name in NEEDS_TEXT]
        if text and not _dual_encoder(config):
            raise ConfigError(f"evaluation.evaluators {text} need a text tower, and model.name "
                              f"= {config.model.get('name')!r} has none")
    else:
        chosen = [e for e in EVALUATORS.values() if e.default(config)]
    for evaluator in chosen:
        evaluator.check(config)
    return tuple(chosen)


def evaluate(graphdef, state, config, mesh,
             evaluators: Sequence[Evaluator] | None = None) -> dict[str, float]:
    """The trained model, in inference mode, scored by each of ``evaluators`` (default:
    :func:`selected` of ``config``) on the evaluation split (the probes fitted on the train
    split's features): ``{metric: value}`` in the evaluators' order. An evaluator that
    returns a name it does not own (:attr:`Evaluator.metrics`) is a bug, raised."""
    evaluators = selected(config) if evaluators is None else evaluators
    ctx = Context(graphdef, state, config, mesh)
    results: dict[str, float] = {}
    for evaluator in evaluators:
        scores = evaluator.run(ctx)
        foreign = sorted(k for k in scores if not evaluator.owns(k, config))
        if foreign:
            raise AssertionError(f"evaluator {evaluator.name!r} returned {foreign}, which it "
                                 "does not declare")
        results.update(scores)
    return results


def titles(evaluators: Sequence[Evaluator], config) -> str:
    """``"linear probe, kNN, alignment and uniformity, retrieval"``: what an evaluation of
    ``config`` computes, for its status line."""
    return ", ".join(e.title(config) for e in evaluators) or "nothing"


def summary_line(evaluators: Sequence[Evaluator], results: Mapping[str, float],
            config) -> str:
    """``"linear_probe 0.9570, knn 0.9470, alignment ..."``: the scores of ``results`` the
    console line shows, each evaluator's own less its hidden ones; of a benchmark task's
    ``KIND/DATASET/METRIC`` scores only the first (its main metric)."""
    shown, tasks = [], set()
    for evaluator in evaluators:
        for name in results:
            if not evaluator.owns(name, config) or name in evaluator.hidden:
                continue
            task = name.rpartition("/")[0]
            if task in tasks:
                continue
            if task:
                tasks.add(task)
            shown.append(f"{name} {results[name]:.4f}")
    return ", ".join(shown)


__all__ = ["EVALUATORS", "Context", "Evaluator", "evaluate", "selected", "summary_line",
           "titles"]
