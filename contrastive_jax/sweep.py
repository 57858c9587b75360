"""Many training runs in one process (the scripts under ``experiments/``).

:func:`start_run` sets a config up exactly as the trainer does (mesh, fresh replicated state,
compiled step, data stream) without checkpoints or progress output, for an experiment that
reads the state between steps. :func:`run_one` runs
:func:`contrastive_jax.train.train_and_evaluate` in a temporary workdir and adds the
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

import jax


@dataclasses.dataclass
class StartedRun:
    """What :func:`start_run` returns: ``state, metrics = step_fn(state, next(stream))``
    ``steps`` times (``state`` is donated), then evaluate with ``graphdef`` on ``mesh``."""

    mesh: Any
    steps: int
    graphdef: Any
    state: dict
    step_fn: Any
    stream: Any


def start_run(config) -> StartedRun:
    """``config``'s mesh, step count, fresh state (replicated), jitted train step and training
    stream, built by the trainer's own functions (:mod:`contrastive_jax.train`)."""
    from contrastive_jax import train
    from contrastive_jax.data import open_split, train_iterator
    from contrastive_jax.sharding import make_mesh

    mesh = make_mesh(dict(config.get("mesh", {"data": -1})))
    source = open_split(config.data.name, config.data.train_split,
                        config.data.data_dir or None, config.data.options.to_dict() or None)
    steps = train.total_steps(config, len(source))
    graphdef, state, tx = train.create_state(config, steps)
    state = jax.device_put(state, train._replicated(mesh, state))
    step_fn = train.compiled_step(config, mesh, graphdef, state, tx, steps)
    return StartedRun(mesh, steps, graphdef, state, step_fn, train_iterator(config.data, mesh))


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
    from contrastive_jax.train import NonFiniteError, train_and_evaluate

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
