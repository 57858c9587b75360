"""A training run's evaluations and its end: the periodic evaluation of the frozen model, and
after the loop either a stopped run's checkpoint message or the final evaluation and
``workdir/results.json`` (with the run's provenance:
:func:`~contrastive_jax.training.run.provenance.provenance`).

The loop (:mod:`contrastive_jax.training.train`) calls these with its
:class:`~contrastive_jax.training.train.Run` (``run`` below: the run's spec, graph definition,
training split and start time), the checkpoint manager and the :class:`Progress` that logs.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import jax
import numpy as np
from etils import epath

from contrastive_jax.training.evaluation.evaluators import evaluate, summary_line, titles
from contrastive_jax.training.run.preemption import Interrupted, interrupt_on_signal
from contrastive_jax.training.run.progress import Progress
from contrastive_jax.training.run.provenance import provenance
from contrastive_jax.training.run.workdir import json_output
from contrastive_jax.training.step.train_state import TrainState, params_digest


def previous_results(workdir: epath.Path) -> dict[str, Any]:
    """The workdir's ``results.json`` (written by an earlier run), or ``{}``."""
    try:
        return json.loads((workdir / "results.json").read_text())
    except (OSError, ValueError):
        return {}


@dataclasses.dataclass
class Clock:
    """Training time: from the end of the first (compiling) step, less the evaluations."""

    train_start: float
    eval_time: float = 0.0

    def train_s(self, now: float) -> float:
        return now - self.train_start - self.eval_time


@dataclasses.dataclass
class LoopEnd:
    """Where the training loop (:func:`contrastive_jax.training.train.train_and_evaluate`) left
    the run."""

    state: TrainState
    metrics: dict  # the last step's
    clock: Clock
    evaluations: list  # the periodic evaluations of this run
    stopped_at: int | None = None  # the step after which a signal stopped it
    cause: str = ""  # what stopped it


def evaluate_at(run: Any, state: TrainState, step: int, progress: Progress,
                 clock: Clock) -> dict[str, Any]:
    """A periodic evaluation of the frozen model (its time kept out of the training time)."""
    eval_start = time.perf_counter()
    evaluators = run.spec.evaluators
    progress.message(f"evaluating at step {step}: {titles(evaluators, run.config)}...")
    result = {"step": step, "wall_s": round(eval_start - run.start, 2),
              "train_s": round(clock.train_s(eval_start), 2),
              **evaluate(run.graphdef, state, run.config, run.mesh, evaluators)}
    clock.eval_time += time.perf_counter() - eval_start
    progress.restart_clock(step)  # examples/s counts training only
    progress.scalars("eval", step, {k: v for k, v in result.items() if k != "step"})
    progress.message(f"eval at step {step}: {summary_line(evaluators, result, run.config)}")
    return result


def stopped(run: Any, ckpt, progress: Progress, end: LoopEnd, resumed: int | None
             ) -> dict[str, Any]:
    """A run stopped by a signal: its checkpoint written, what to do next said."""
    ckpt.wait_until_finished()
    ckpt.close()
    progress.message(f"stopped by {end.cause} after step {end.stopped_at}: "
                     f"checkpoint saved in {run.workdir / 'checkpoints'}; run the same command "
                     "to resume")
    progress.close()
    return {"steps": run.steps, "stopped_at": end.stopped_at, "resumed_from": resumed}


def input_report(report: dict[str, dict[str, int]]) -> dict[str, Any]:
    """A stream's skip counts summed over every process (an all-gather: every process calls
    it; ``report["skipped"]`` holds every reason, in one order on every process), with the
    shards that failed on this process (``failed_shards``: path -> failed reads) and the
    failed reads of all processes (``failed_shard_reads``)."""
    from jax.experimental import multihost_utils

    reasons = list(report["skipped"])
    mine = np.array([report["skipped"][r] for r in reasons]
                    + [sum(report["failed_shards"].values())], np.int64)
    every = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, mine.size).sum(0) \
        if jax.process_count() > 1 else mine
    return {"skipped": {r: int(n) for r, n in zip(reasons, every[:-1], strict=True) if n},
            "failed_shard_reads": int(every[-1]), "failed_shards": report["failed_shards"]}


def final_results(run: Any, ckpt, progress: Progress, end: LoopEnd, resumed: int | None,
             history: list) -> dict[str, Any]:
    """The final evaluation and ``workdir/results.json`` of a finished run."""
    config, state = run.config, end.state
    try:
        # SIGTERM as SIGINT: stop now, the training is saved. Installed before the wait for
        # the last checkpoint and before the message, so no signal finds the default handler
        # (which would kill the process without a word).
        with interrupt_on_signal():
            ckpt.wait_until_finished()
            train_time = end.clock.train_s(time.perf_counter())
            evaluators = run.spec.evaluators
            if config.evaluation.enabled:
                progress.message(f"final evaluation: {titles(evaluators, config)}...")
            final = evaluate(run.graphdef, state, config, run.mesh, evaluators) \
                if config.evaluation.enabled else {}
    except Interrupted as stop:
        ckpt.close()  # waits for the last checkpoint if the signal came during that wait
        when = "during the final evaluation" if config.evaluation.enabled else "at the end"
        progress.message(f"stopped by {stop.signal_name} {when}: the training is finished and "
                         f"saved (checkpoint {run.steps} in {run.workdir / 'checkpoints'}); run "
                         "the same command to evaluate it and write results.json")
        progress.close()
        return {"steps": run.steps, "stopped_at": run.steps, "resumed_from": resumed}
    history.append({"step": run.steps, "wall_s": round(time.perf_counter() - run.start, 2),
                    "train_s": round(train_time, 2), **final})
    progress.scalars("eval", run.steps, {k: v for k, v in history[-1].items() if k != "step"})
    results = {
        "steps": run.steps,
        "resumed_from": resumed,
        "global_batch": run.batch_size,
        "accumulation_steps": run.accumulation_steps,
        "devices": int(run.mesh.devices.size),
        "processes": jax.process_count(),
        "train_time_s": round(train_time, 2),
        "wall_time_s": round(time.perf_counter() - run.start, 2),
        **final,
        "final_train_metrics": {k: float(np.asarray(v)) for k, v in jax.device_get(
            end.metrics).items()},
        "evaluations": history,
        "params_sha256": params_digest(state),
        "provenance": provenance(),  # date, commit, versions, devices (run.provenance)
    }
    results.update(run.method.results(run.source, config))
    if callable(getattr(run.stream, "report", None)):  # a stream of shards
        results["input"] = input_report(run.stream.report())
    if jax.process_index() == 0:
        json_output.write_atomic(run.workdir / "results.json", results)
    scores = summary_line(run.spec.evaluators, final, config)
    progress.message(f"done in {results['wall_time_s']:.0f} s"
                     f"{': ' + scores if scores else ''} -> {run.workdir / 'results.json'}")
    progress.close()
    ckpt.close()
    return results
