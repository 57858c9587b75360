"""Many training runs in one process (the scripts under ``experiments/``).

:func:`start_run` sets a config up exactly as the trainer does (mesh, fresh replicated state,
compiled step, data stream) without checkpoints or progress output, for an experiment that
reads the state between steps. :func:`run_one` runs
:func:`contrastive_jax.training.train.train_and_evaluate` in a temporary workdir and adds the
late-training means of its logged metrics (:func:`tail_means`): one batch's contrastive top-1
or ``log N - L`` is a noisy Monte Carlo value (002 A.12.5, remark 2), the mean over the last
logged batches a steadier one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import pathlib
import statistics
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any


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


def tail_means(records: Sequence[Mapping[str, Any]], total_steps: int, keys: Sequence[str],
               fraction: float = 0.2) -> dict[str, float]:
    """Mean of each of ``keys`` over the ``metrics.jsonl`` records with ``prefix == "train"``
    logged after step ``(1 - fraction) * total_steps`` (empty dict if there is none)."""
    tail = [r for r in records if r.get("prefix") == "train"
            and r["step"] > (1 - fraction) * total_steps]
    return {k: statistics.fmean(r[k] for r in tail) for k in keys} if tail else {}


def run_one(config, *, keys: Sequence[str], fraction: float = 0.2,
            verbose: bool = False) -> dict[str, Any] | None:
    """``train_and_evaluate(config)`` in a temporary workdir, plus ``tail_metrics``
    (:func:`tail_means` of ``keys`` over its ``metrics.jsonl``).

    Returns None if the run stopped on non-finite steps (``NonFiniteError``: a diverged
    setting is a result, not a crash); a run stopped by a signal ends the caller
    (``SystemExit``). The trainer's console lines are swallowed unless ``verbose``.
    """
    from contrastive_jax.errors import NonFiniteError
    from contrastive_jax.training.train import train_and_evaluate

    sink = contextlib.nullcontext() if verbose else contextlib.redirect_stdout(io.StringIO())
    with tempfile.TemporaryDirectory() as workdir, sink:
        try:
            result = train_and_evaluate(config, workdir)
        except NonFiniteError:
            return None
        if "stopped_at" in result:  # SIGTERM/SIGINT: the trainer checkpointed and returned
            raise SystemExit(f"interrupted by a signal at step {result['stopped_at']}")
        lines = (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines if line.strip()]
    return {**result, "tail_metrics": tail_means(records, result["steps"], keys, fraction)}
