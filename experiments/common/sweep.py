"""Many training runs in one process (the scripts under ``experiments/``).

:func:`run_one` runs :func:`contrastive_jax.training.train.train_and_evaluate` in a temporary
workdir and adds the late-training means of its logged metrics (:func:`tail_means`): one
batch's contrastive top-1 or ``log N - L`` is a noisy Monte Carlo value (docs/derivations.md
§15.3, limit 2), the mean over the last logged batches a steadier one. :func:`start_run` sets a
config up exactly as the trainer does (mesh, fresh replicated state, compiled step, data stream)
without checkpoints or progress output, and :func:`train_recording` trains it step by step for
an experiment that reads the state between steps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import statistics
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

LOG_EVERY = 5  # steps between logged training metrics in the ablations' runs
TAIL_FRACTION = 0.2  # late training: the last 20% of the steps
WARMUP_FRACTION = 31 / 625  # the main job (configs/simclr_mnist1d.py): 31 warmup steps of 625


def warmup_steps(total_steps: int, fraction: float = WARMUP_FRACTION) -> int:
    """Linear-warmup steps: ``round(fraction * total_steps)``, at least 1 and below the total
    (the main job's warmup + cosine shape over a shorter or longer run)."""
    return min(max(1, round(fraction * total_steps)), total_steps - 1)


def train_size(config) -> int:
    """Training examples of ``config``'s dataset (the main job's MNIST-1D: 4000)."""
    from contrastive_jax.training.data import open_split

    return len(open_split(config.data.name, config.data.train_split, None, None))


@dataclasses.dataclass
class StartedRun:
    """What :func:`start_run` returns: ``state, metrics = step_fn(state, next(stream))``
    ``steps`` times (``state`` is donated), then evaluate with ``graphdef`` on ``mesh``."""

    mesh: Any
    steps: int
    graphdef: Any
    state: Any  # a TrainState
    step_fn: Any
    stream: Any


def start_run(config) -> StartedRun:
    """``config``'s mesh, step count, fresh state (replicated), jitted train step and training
    stream, built by the trainer's own :func:`contrastive_jax.training.train.prepare_run`."""
    from contrastive_jax.training.train import prepare_run

    with tempfile.TemporaryDirectory() as workdir:
        run, state = prepare_run(config, workdir)
    return StartedRun(run.mesh, run.steps, run.graphdef, state, run.step_fn(state), run.stream)


def train_recording(config, every: int, record: Callable[[Any, Any, Any], dict], *,
                    before: Callable[[Any], Any] | None = None,
                    final_eval: bool = True) -> tuple[list[dict], dict]:
    """Train ``config`` (:func:`start_run`); after the first, the last and every ``every``-th
    step append ``{"step": step, **record(state, metrics, prior)}``, where ``prior`` is
    ``before(state)`` taken before that step (the state is donated) or None. Returns the rows
    and the trained encoder's evaluation (``{}`` without ``final_eval``)."""
    import jax

    from contrastive_jax.training.evaluation.evaluators import evaluate

    started = start_run(config)
    state, rows = started.state, []
    for step in range(1, started.steps + 1):
        due = step % every == 0 or step in (1, started.steps)
        prior = before(state) if due and before is not None else None
        state, metrics = started.step_fn(state, next(started.stream))
        if due:
            rows.append({"step": step, **record(state, jax.device_get(metrics), prior)})
    final = evaluate(started.graphdef, state, config, started.mesh) if final_eval else {}
    return rows, final


def tail_means(records: Sequence[Mapping[str, Any]], total_steps: int, keys: Sequence[str],
               fraction: float = TAIL_FRACTION) -> dict[str, float]:
    """Mean of each of ``keys`` over the ``metrics.jsonl`` records with ``prefix == "train"``
    logged after step ``(1 - fraction) * total_steps`` (empty dict if there is none)."""
    tail = [r for r in records if r.get("prefix") == "train"
            and r["step"] > (1 - fraction) * total_steps]
    return {k: statistics.fmean(r[k] for r in tail) for k in keys} if tail else {}


def run_one(config, *, keys: Sequence[str], fraction: float = TAIL_FRACTION,
            verbose: bool = False) -> dict[str, Any] | None:
    """``train_and_evaluate(config)`` in a temporary workdir, plus ``tail_metrics``
    (:func:`tail_means` of ``keys`` over its ``metrics.jsonl``).

    Returns None if the run stopped on non-finite steps (``NonFiniteError``: a diverged
    setting is a result, not a crash); a run stopped by a signal ends the caller
    (``SystemExit``). The trainer's console lines are swallowed unless ``verbose``.
    """
    from contrastive_jax.errors import NonFiniteError
    from contrastive_jax.training.run.progress import read_metrics_lines
    from contrastive_jax.training.train import train_and_evaluate

    sink = contextlib.nullcontext() if verbose else contextlib.redirect_stdout(io.StringIO())
    with tempfile.TemporaryDirectory() as workdir, sink:
        try:
            result = train_and_evaluate(config, workdir)
        except NonFiniteError:
            return None
        if "stopped_at" in result:  # SIGTERM/SIGINT: the trainer checkpointed and returned
            raise SystemExit(f"interrupted by a signal at step {result['stopped_at']}")
        records = [json.loads(line) for line in read_metrics_lines(workdir) if line.strip()]
    return {**result, "tail_metrics": tail_means(records, result["steps"], keys, fraction)}


def late_metrics(result: Mapping[str, Any]) -> tuple[dict[str, float], bool]:
    """``(metrics, ok)`` of a :func:`run_one` result: the last step's training metrics updated
    with their late-training means, and whether the run finished finite (its late and last
    loss, probe and kNN)."""
    last = result["final_train_metrics"]
    late = {**last, **result.get("tail_metrics", {})}
    values = (late["loss"], last["loss"], result["linear_probe"], result["knn"])
    return late, all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def step_temporaries_mb(config) -> float:
    """XLA's temporary memory (MiB) of ``config``'s compiled train step
    (``memory_analysis().temp_size_in_bytes``; the activations held for the backward pass),
    compiled for the shapes of its first training batch on this machine's backend."""
    started = start_run(config)
    compiled = started.step_fn.lower(started.state, next(started.stream)).compile()
    return compiled.memory_analysis().temp_size_in_bytes / 2**20


def micro_batch_trials(config, budget_mb: float, *, most: int = 64) -> dict[int, float]:
    """``{K: MiB}``: the compiled step's temporaries (:func:`step_temporaries_mb`) with
    ``config.accumulation_steps = K`` for K = 1, 2, 4, ... (powers of two dividing the batch),
    up to the first within ``budget_mb``, which is the last key. Raises ValueError if even
    ``most`` micro-batches do not fit."""
    trials, k, batch = {}, 1, config.data.batch_size
    while k <= min(most, batch):
        if batch % k == 0:
            trial = config.copy_and_resolve_references()
            trial.accumulation_steps = k
            trials[k] = step_temporaries_mb(trial)
            if trials[k] <= budget_mb:
                return trials
        k *= 2
    raise ValueError(f"batch {batch} does not fit {budget_mb} MiB of step temporaries with up "
                     f"to {most} micro-batches ({trials}): raise the budget")
