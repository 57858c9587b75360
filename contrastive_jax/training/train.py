"""The trainer: any method, from one config, on a device mesh.

``train_and_evaluate(config, workdir)`` is the whole run:

1. :func:`prepare_run`: the mesh (``config.mesh``, default all devices on ``data``), the method
   (:func:`contrastive_jax.training.methods.method_for`), the training stream (global batches
   sharded over ``data``, :mod:`contrastive_jax.training.data`), the model and the optimiser in
   a fresh :class:`~contrastive_jax.training.step.train_state.TrainState` placed on the mesh as
   ``config.sharding`` says (replicated, or split over ``data``: FSDP,
   :mod:`contrastive_jax.training.step.state_sharding`),
   restored from the latest checkpoint in ``workdir`` when there is one (with the data
   iterator's position, so the run continues the exact stream), else initialised from
   ``config.model.init_from`` if set (:mod:`contrastive_jax.training.run.init_from`);
2. the loop: ``state, metrics = step(state, batch)`` (one jitted pure function of the graph
   definition, the state, the batch and the step's key:
   :func:`~contrastive_jax.training.step.train_step.train_step`; with
   ``config.accumulation_steps = K`` the global batch runs as ``K`` micro-batches with the
   gradient unchanged, :mod:`contrastive_jax.training.step.accumulation`), progress lines
   and TensorBoard scalars every ``log_every`` steps, checkpoints every ``checkpoint_every``
   steps and at the end, optional evaluations every ``evaluation.every`` steps, a
   ``jax.profiler`` trace of the steps ``config.profile`` names
   (:mod:`contrastive_jax.training.run.profiling`);
3. the evaluation of the trained model (:func:`~contrastive_jax.training.evaluation.
   run_evaluation.evaluate`: linear probe, kNN, alignment and uniformity; for dual encoders
   retrieval Recall@k and zero-shot accuracy) and ``workdir/results.json`` (with the run's
   provenance: :func:`~contrastive_jax.training.run.provenance.provenance`), or, for a run a
   signal stopped, its checkpoint and what to do next (:mod:`contrastive_jax.training.
   run_results`, which also holds the periodic evaluation).

The method supplies the loss and whatever it adds to the state and the results
(:class:`~contrastive_jax.training.methods.Method`); nothing here knows which method runs.
Under ``jit`` the batch is split over ``data`` and the parameters are replicated or, under
FSDP, gathered where they are used (their gradients reduce-scattered): the encoders
run data-parallel, BatchNorm statistics are over the global batch (SimCLR's global BN), and the
gradients are all-reduced by XLA. The loss is the single-device loss on the global arrays or a
sharded loss (``loss.strategy``), both exact over the global batch.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import jax
import ml_collections
import optax
from etils import epath

from contrastive_jax.accelerators import device_peak_flops
from contrastive_jax.errors import ConfigError, NonFiniteError
from contrastive_jax.training.data import open_split, train_iterator
from contrastive_jax.training.data.sources import damaged_data_error
from contrastive_jax.training.methods import Method
from contrastive_jax.training.run import checkpoints, init_from, profiling
from contrastive_jax.training.run.compilation_cache import ModelFlopsMemo
from contrastive_jax.training.run.preemption import StopSignal
from contrastive_jax.training.run.progress import MetricWindow, Progress, scale_settings
from contrastive_jax.training.run.skipped_updates import check_skipped_updates
from contrastive_jax.training.run.workdir.config_record import check_config, write_config
from contrastive_jax.training.run.workdir.workdir_lock import workdir_lock
from contrastive_jax.training.run_results import (
    Clock,
    LoopEnd,
    evaluate_at,
    final_results,
    previous_results,
    stopped,
)
from contrastive_jax.training.run_spec import RunSpec, resolve
from contrastive_jax.training.step import model_flops
from contrastive_jax.training.step.state_sharding import state_shardings
from contrastive_jax.training.step.train_state import TrainState, create_state
from contrastive_jax.training.step.train_step import compiled_step


@dataclasses.dataclass
class Run:
    """The fixed parts of one training run, built once by :func:`prepare_run` from its
    :class:`~contrastive_jax.training.run_spec.RunSpec`."""

    spec: RunSpec
    graphdef: Any
    tx: optax.GradientTransformation
    source: Any  # the training split (random access; None for a stream of shards)
    stream: Any  # the checkpointable iterator of global batches
    start: float = dataclasses.field(default_factory=time.perf_counter)
    profile: profiling.ProfileWindow | None = None  # the traced steps (config.profile)

    config = property(lambda self: self.spec.config)
    workdir = property(lambda self: self.spec.workdir)
    mesh = property(lambda self: self.spec.mesh)
    method = property(lambda self: self.spec.method)
    steps = property(lambda self: self.spec.steps)
    accumulation_steps = property(lambda self: self.spec.accumulation_steps)
    batch_size = property(lambda self: self.spec.batch_size)

    def step_fn(self, state: TrainState):
        """The compiled train step for states shaped like ``state``."""
        return compiled_step(self.config, self.mesh, self.graphdef, state, self.tx, self.steps,
                             self.method)


def prepare_run(run: RunSpec | ml_collections.ConfigDict,
                workdir: str | os.PathLike | None = None,
                method: Method | None = None) -> tuple[Run, TrainState]:
    """The run's data, model and optimiser, and a fresh state on its mesh, from its
    :class:`RunSpec` (a config is resolved first: :func:`~contrastive_jax.training.run_spec.
    resolve` with ``workdir`` and ``method``). Bad settings fail in the resolve step, before
    any compilation, with a :class:`ConfigError`."""
    start = time.perf_counter()
    spec = run if isinstance(run, RunSpec) else resolve(run, workdir, method=method)
    config = spec.config
    source = None if config.data.get("source", "tfds") == "shards" else open_split(
        config.data.name, config.data.train_split, config.data.data_dir or None,
        config.data.options.to_dict() or None)
    graphdef, state, tx = create_state(config, spec.steps, spec.method)
    state = jax.device_put(state, state_shardings(config.get("sharding"), spec.mesh, state))
    run = Run(spec, graphdef, tx, source, train_iterator(config.data, spec.mesh), start,
              profiling.profile_window(config.get("profile"), spec.steps))
    return run, state


def train_and_evaluate(run: RunSpec | ml_collections.ConfigDict, workdir: str | None = None, *,
                       accept_config_change: bool = False,
                       resplit_data: bool = False) -> dict[str, Any]:
    """Train, checkpoint, evaluate; returns (and writes to ``workdir/results.json``) the results.

    ``run``: the run's :class:`RunSpec`, or a config, resolved here with ``workdir``
    (:func:`~contrastive_jax.training.run_spec.resolve`). The workdir is locked for the run
    (:mod:`~contrastive_jax.training.run.workdir.workdir_lock`) and its ``config.json`` records
    the spec's config; resuming with a different config raises a :class:`ConfigError` listing
    the differences unless ``accept_config_change``
    (:mod:`~contrastive_jax.training.run.workdir.config_record`). ``resplit_data``: resume a
    checkpoint written by another number of processes
    (:func:`~contrastive_jax.training.run.checkpoints.restore_latest`).
    """
    config = run.config if isinstance(run, RunSpec) else run
    try:
        spec = run if isinstance(run, RunSpec) else resolve(run, workdir)
        if spec.workdir is None:
            raise ConfigError("train_and_evaluate needs a workdir: resolve(config, workdir)")
        for line in spec.messages:
            print(line, flush=True)
        spec.workdir.mkdir(parents=True, exist_ok=True)
        with workdir_lock(spec.workdir):
            return _locked(spec, accept_config_change, resplit_data)
    except Exception as err:  # damaged record files show only when read
        damaged = damaged_data_error(err, config.data.name, config.data.data_dir or None)
        if damaged is None:
            raise
        raise damaged from None


def _locked(spec: RunSpec, accept_config_change: bool, resplit_data: bool = False
            ) -> dict[str, Any]:
    """:func:`train_and_evaluate` once it holds the workdir's lock."""
    config = spec.config
    run, state = prepare_run(spec)
    manager = checkpoints.manager(run.workdir, every=config.checkpoint_every,
                                  keep=config.keep_checkpoints,
                                  timeout_s=config.get("checkpoint_timeout_s", 1200))
    try:
        changed = check_config(config, spec.workdir, resuming_from=manager.latest_step(),
                               accept_change=accept_config_change)
        return _train(run, state, manager, config_changed=bool(changed),
                      resplit_data=resplit_data)
    except NonFiniteError as err:  # its checkpoints may hold the parameters that diverged
        first = err.step - err.in_a_row
        try:
            moved = checkpoints.set_aside_from(manager, first, "diverged")
            left = manager.all_steps()
        finally:
            manager.close()
        then = f"resumes from step {max(left)}" if left else "starts from scratch"
        where = (f"The checkpoints of steps >= {first} hold the parameters that led there; they "
                 f"were moved to {epath.Path(moved[0]).parent}, so" if moved else
                 f"No checkpoint was saved from step {first} on (none while updates are "
                 "skipped), so")
        raise NonFiniteError(f"{err} {where} the next run {then}.", step=err.step,
                             in_a_row=err.in_a_row) from None
    except BaseException:
        manager.close()  # release orbax's threads and files before the error propagates
        raise
    finally:  # stop the input worker processes and free their shared memory, whatever happened
        close_stream(run.stream)


def close_stream(stream: Any) -> None:
    """Close the training iterator (grain's ``DatasetIterator.close``: its worker processes
    stop and their shared-memory buffers are unlinked now, not at interpreter exit, where an
    error that ended the run would otherwise leave them behind); an iterator without
    ``close`` is left alone."""
    close = getattr(stream, "close", None)
    if callable(close):
        close()


def _train(run: Run, state: TrainState, ckpt, *, config_changed: bool = False,
           resplit_data: bool = False) -> dict[str, Any]:
    """The body of :func:`train_and_evaluate` once the checkpoint manager exists: resume or
    start, record the config, run the loop, then the stop or the final results."""
    state, resumed, loaded = _resume_or_start(run, state, ckpt, resplit_data)
    write_config(run.config, run.workdir, changed_at=resumed if config_changed else None)
    first = int(state.step)
    previous = previous_results(run.workdir)
    if first >= run.steps and previous.get("steps") == run.steps:  # finished: nothing to redo
        print(f"already finished: step {first} of {run.steps}; results in "
              f"{run.workdir / 'results.json'}")
        ckpt.close()
        return previous
    progress = Progress(run.workdir, run.steps, run.batch_size, run.config.log_every, first,
                        chips=int(run.mesh.devices.size),
                        peak_flops=device_peak_flops(run.mesh.devices.flat[0].device_kind))
    progress.message(_start_line(run, resumed))
    for line in loaded:
        progress.message(line)
    end = _loop(run, state, ckpt, progress, first, resumed)
    if end.stopped_at is not None:
        return stopped(run, ckpt, progress, end, resumed)
    # evaluations of the steps this run resumes after, from the run(s) before it
    history = [e for e in previous.get("evaluations", []) if e.get("step", 0) <= first]
    return final_results(run, ckpt, progress, end, resumed, history + end.evaluations)


def _resume_or_start(run: Run, state: TrainState, ckpt, resplit_data: bool = False
                     ) -> tuple[TrainState, int | None, list[str]]:
    """``(state, resumed step or None, lines to print)``: the latest checkpoint restored, else a
    fresh state initialised from ``model.init_from`` (a resumed run starts from its own)."""
    state, resumed = checkpoints.restore_latest(ckpt, state, run.stream,
                                                resplit_data=resplit_data)
    if resumed is not None:
        return state, resumed, []
    fresh, loaded = init_from.initialized_state(state, run.graphdef, run.config, run.method,
                                                run.spec.sources or None)
    return (jax.device_put(fresh, state_shardings(run.config.get("sharding"), run.mesh, state)),
            None, loaded)


def _start_line(run: Run, resumed: int | None) -> str:
    """The status line a run opens with: what it does, on what, where."""
    k, batch = run.accumulation_steps, run.batch_size
    micro = f" ({k} micro-batches of {batch // k})" if k > 1 else ""
    return (f"{'resumed from step ' + str(resumed) if resumed is not None else 'start'}"
            f": {run.steps} steps of {batch}{micro} on {run.mesh.devices.size} devices "
            f"({jax.process_count()} processes){scale_settings(run.config)}, "
            f"workdir {run.workdir}")


def _loop(run: Run, state: TrainState, ckpt, progress: Progress, first: int,
          resumed: int | None) -> LoopEnd:
    """Steps ``first + 1 .. steps``: train, log, checkpoint, evaluate every
    ``evaluation.every`` steps, stop (after a checkpoint) on a signal, and stop with a
    :class:`NonFiniteError` after ``max_skipped_in_a_row`` skipped updates.

    Between its sync points the loop never waits for the device: a step is dispatched, the
    previous step's skip counter read (the one-step-delayed guard: the device has the new
    step queued meanwhile), the stop decision taken on the host (:class:`StopSignal`), and
    the next batch prepared. The sync points, each in :func:`_sync_point`: the first step
    (compilation), the guard read, a logging step, a checkpoint save, an evaluation, a profiled
    window's ends. Everything else runs under ``jax.transfer_guard_device_to_host(
    config.transfer_guard)`` ("allow" by default; "disallow" makes any other device read an
    error, tests/test_host_sync.py)."""
    config, stream = run.config, run.stream
    step_fn = run.step_fn(state)
    window = MetricWindow()
    metrics, evaluations = {}, []
    clock = Clock(time.perf_counter())  # reset after the first step: excludes compilation
    limit = config.max_skipped_in_a_row
    every = config.evaluation.every if config.evaluation.enabled else 0
    pending = None
    reported = None  # the stream's skip counts last logged
    guard = config.get("transfer_guard", "allow")
    flops = model_flops.Counter(config, run.mesh, run.method, run.steps,
                                memo=ModelFlopsMemo(config, run.mesh, run.steps))
    with StopSignal(timeout_s=_stop_timeout(config)) as stop, profiling.StepProfiler(
            run.profile, run.workdir, first + 1, progress.message) as profile, \
            jax.transfer_guard_device_to_host(guard):
        for step in range(first + 1, run.steps + 1):
            with _sync_point("profile"):
                profile.before_step(step)  # a trace of the window's steps, batch included
            batch = next(stream)
            if step == first + 1:
                progress.message(f"compiling the train step ({'restored' if resumed else 'fresh'}"
                                 " state; the first step includes compilation)...")
                flops.start(state, batch)  # model FLOPs, counted beside the compile
            state, metrics = step_fn(state, batch)
            # on the host, before this step's device reads: another process may be waiting
            # for this one's answer (CoordinatedStop)
            stopping = stop.should_stop(step)
            with _sync_point("profile"):
                profile.after_step(step, (state, metrics))
            window.add(metrics)
            if pending is not None and limit:  # the previous step's guard, read while this
                with _sync_point("guard"):     # one runs
                    check_skipped_updates(*pending, limit)
            pending = (step, metrics["skipped_in_a_row"])
            if step == first + 1:  # compiled: time the rest
                with _sync_point("compiled"):
                    jax.block_until_ready(metrics)
                progress.message(f"compiled and ran step {step} in "
                                 f"{time.perf_counter() - clock.train_start:.1f} s")
                # the count of model FLOPs ran beside the compilation; what is left of it
                # is waited for here, outside the timed steps (which it would slow down)
                progress.set_model_flops(*flops.result())
                progress.restart_clock(step)
                clock.train_start = time.perf_counter()
            if progress.due(step):
                with _sync_point("log"):
                    progress.log_train(step, window.mean())
                    reported = _input_report(stream, progress, reported)
            if stopping:
                with _sync_point("stop"):
                    check_skipped_updates(*pending, limit)
                    checkpoints.save(ckpt, step, state, stream, force=True)
                return LoopEnd(state, metrics, clock, evaluations, step, stop.cause())
            if step == run.steps or ckpt.should_save(step):  # due: asked once (host only)
                with _sync_point("checkpoint"):
                    checkpoints.save(ckpt, step, state, stream, force=True,
                                     skipped_in_a_row=metrics["skipped_in_a_row"] if limit
                                     else None)
            if every and step % every == 0 and step != run.steps:
                with _sync_point("evaluation"):
                    evaluations.append(evaluate_at(run, state, step, progress, clock))
        if pending is not None:
            with _sync_point("guard"):
                check_skipped_updates(*pending, limit, run_ended=True)
    return LoopEnd(state, metrics, clock, evaluations)


def _input_report(stream, progress: Progress, last: dict | None) -> dict | None:
    """A line with a stream's skipped members and failed shards (this process's readers)
    when they changed since ``last``; the counts (None for a stream without a report)."""
    report = getattr(stream, "report", None)
    if not callable(report):
        return None
    now = report()
    if now != last and (any(now["skipped"].values()) or now["failed_shards"]):
        skipped = ", ".join(f"{k} {v:,}" for k, v in now["skipped"].items() if v)
        failed = "; ".join(f"{path} ({n} epoch{'s' if n > 1 else ''})"
                           for path, n in now["failed_shards"].items())
        progress.message(f"input (process {jax.process_index()}): skipped {skipped or 'none'}"
                         + (f"; unreadable shards: {failed}" if failed else ""))
    return now


def _sync_point(what: str):
    """A place where the loop reads from the device on purpose (``what``: which of the loop's
    sync points, for a reader): device-to-host transfers allowed whatever
    ``config.transfer_guard`` says for the rest of the loop."""
    del what
    return jax.transfer_guard_device_to_host("allow")


def _stop_timeout(config: ml_collections.ConfigDict) -> float:
    """How long a stop waits for the other processes: the launch's heartbeat timeout."""
    return float((config.get("launch") or {}).get("heartbeat_timeout_s") or 100)


