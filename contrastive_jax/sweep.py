"""Many training runs in one process (the ablation scripts under ``experiments/``).

:func:`run_one` runs :func:`contrastive_jax.train.train_and_evaluate` in a temporary workdir
and adds the late-training means of its logged metrics (:func:`tail_means`): one batch's
contrastive top-1 or ``log N - L`` is a noisy Monte Carlo value (002 A.12.5, remark 2), the mean
over the last logged batches a steadier one.
"""

from __future__ import annotations

import contextlib
import io
import json
import pathlib
import statistics
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any


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
