"""The trainer: any method, from one config, on a device mesh.

``train_and_evaluate(config, workdir)`` is the whole run:

1. :func:`prepare_run`: the mesh (``config.mesh``, default all devices on ``data``), the method
   (:func:`contrastive_jax.training.methods.method_for`), the training stream (global batches
   sharded over ``data``, :mod:`contrastive_jax.training.data`), the model and the optimiser in
   a fresh :class:`~contrastive_jax.training.train_state.TrainState` placed on the mesh as
   ``config.sharding`` says (replicated, or split over ``data``: FSDP,
   :mod:`contrastive_jax.training.state_sharding`),
   restored from the latest checkpoint in ``workdir`` when there is one (with the data
   iterator's position, so the run continues the exact stream), else initialised from
   ``config.model.init_from`` if set (:mod:`contrastive_jax.training.pretrained`);
2. the loop: ``state, metrics = step(state, batch)`` (one jitted pure function of the graph
   definition, the state, the batch and the step's key: :func:`train_step`; with
   ``config.accumulation_steps = K`` the global batch runs as ``K`` micro-batches with the
   gradient unchanged, :mod:`contrastive_jax.training.accumulation`), progress lines
   and TensorBoard scalars every ``log_every`` steps, checkpoints every ``checkpoint_every``
   steps and at the end, optional evaluations every ``evaluation.every`` steps;
3. the evaluation of the trained model (:func:`~contrastive_jax.training.evaluation.
   run_evaluation.evaluate`: linear probe, kNN, alignment and uniformity; for dual encoders
   retrieval Recall@k and zero-shot accuracy) and ``workdir/results.json``.

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
import functools
import json
import math
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from etils import epath
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax.errors import ConfigError, NonFiniteError
from contrastive_jax.mesh import DATA_AXIS, check_divisible, make_mesh
from contrastive_jax.training import checkpoints, json_output, pretrained
from contrastive_jax.training.accumulation import check_accumulation, step_gradients
from contrastive_jax.training.config_record import check_config, write_config
from contrastive_jax.training.data import open_split, train_iterator
from contrastive_jax.training.data.sources import damaged_data_error
from contrastive_jax.training.evaluation.run_evaluation import evaluate
from contrastive_jax.training.frozen_towers import frozen_names, keep_frozen
from contrastive_jax.training.methods import LossSettings, Method, MethodContext, method_for
from contrastive_jax.training.optimizers import clamp_log_scale, current_learning_rate
from contrastive_jax.training.preemption import StopSignal
from contrastive_jax.training.progress import (
    MetricWindow,
    Progress,
    evaluation_names,
    scale_settings,
)
from contrastive_jax.training.state_sharding import state_shardings
from contrastive_jax.training.train_state import TrainState, create_state, params_digest
from contrastive_jax.training.workdir_lock import workdir_lock
from contrastive_jax.training.workdir_path import workdir_path


def total_steps(config: ml_collections.ConfigDict, train_size: int) -> int:
    """``config.total_steps`` if set, else ``ceil(num_epochs * train_size / batch_size)``."""
    if config.get("total_steps", 0):
        return int(config.total_steps)
    steps = math.ceil(config.num_epochs * train_size / config.data.batch_size)
    if steps < 1:
        raise ConfigError("set total_steps or num_epochs > 0")
    return steps


def train_step(state: TrainState, batch: dict, *, graphdef, tx: optax.GradientTransformation,
               method: Method, ctx: MethodContext,
               learning_rate: optax.Schedule | None = None,
               accumulation_steps: int = 1) -> tuple[TrainState, dict]:
    """One optimisation step; a pure function of the state and the batch.

    The step's key is ``fold_in(state.rng, state.step)``, split into one key per example of
    the global batch (augmentations, dropout), so a resumed run draws the same keys and an
    example draws the same randomness in any micro-batch. The gradient is that of the
    global-batch loss, with ``accumulation_steps = K`` micro-batches exactly as with one
    (:func:`~contrastive_jax.training.accumulation.step_gradients`). A NaN or inf anywhere in
    the batch makes the loss NaN. A non-finite loss or gradient, or updated parameters whose
    float32 norm overflows (an update that sent them past ~1e19: a learning rate of 1e30, say),
    skips the update (the step counter, ``skipped``
    and ``skipped_in_a_row`` advance, nothing else changes), so the state, and every
    checkpoint of it, only ever holds finite parameters.
    """
    rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    keys = jax.random.split(rng, jax.tree.leaves(batch)[0].shape[0])
    loss, grads, metrics, outputs, rest, extra = step_gradients(
        state.params, state.rest, batch, keys, state.extra, graphdef=graphdef, method=method,
        ctx=ctx, accumulation_steps=accumulation_steps)
    # a NaN or inf in the batch makes the loss NaN whatever the encoders do with it (XLA:CPU's
    # fused max drops NaN: mean(relu(x)) of an all-NaN x is 0, so BatchNorm + ReLU + mean
    # pooling can turn a NaN example into finite features)
    loss = jnp.where(checkpoints.all_finite(batch), loss, jnp.nan)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = clamp_log_scale(optax.apply_updates(state.params, updates), ctx.loss.max_scale)
    params = keep_frozen(params, state.params, ctx.frozen)  # bit-identical, -0.0 included
    extra = method.after_update(extra, params, outputs, ctx)
    new = state.replace(params=params, rest=rest, opt_state=opt_state, extra=extra)
    grad_norm = optax.tree.norm(grads)
    finite = (jnp.isfinite(loss) & jnp.isfinite(grad_norm)
              & jnp.isfinite(optax.tree.norm((params, rest))))
    new = jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, state)
    new = new.replace(step=state.step + 1,
                      skipped=state.skipped + (~finite).astype(jnp.int32),
                      skipped_in_a_row=jnp.where(finite, 0, state.skipped_in_a_row + 1))
    metrics = {**metrics, "loss": loss, "grad_norm": grad_norm,
               "skipped": new.skipped.astype(jnp.float32),
               "skipped_in_a_row": new.skipped_in_a_row}
    if learning_rate is not None:
        metrics["learning_rate"] = learning_rate(state.step)
    return new, metrics


def _previous_results(workdir: epath.Path) -> dict[str, Any]:
    """The workdir's ``results.json`` (written by an earlier run), or ``{}``."""
    try:
        return json.loads((workdir / "results.json").read_text())
    except (OSError, ValueError):
        return {}


def _check_finite(step: int, in_a_row, limit: int) -> None:
    in_a_row = int(in_a_row)
    if limit and in_a_row >= limit:
        raise NonFiniteError(
            f"step {step}: the loss, gradient or updated parameters were non-finite for "
            f"{in_a_row} steps in a row (each update skipped); stopping. Lower the learning "
            f"rate, check the data, or raise max_skipped_in_a_row (now {limit}).",
            step=step, in_a_row=in_a_row)


def make_context(config, mesh: Mesh, graphdef) -> MethodContext:
    """What the method needs from the config (static under ``jit``)."""
    augment = config.get("augment")
    return MethodContext(loss=LossSettings.from_config(config.loss), mesh=mesh,
                         input_key=config.input_key, text_key=config.get("text_key", "caption"),
                         augment=None if augment is None else augment.to_dict(),
                         graphdef=graphdef, frozen=frozen_names(config.model))


def compiled_step(config, mesh: Mesh, graphdef, state: TrainState,
                  tx: optax.GradientTransformation, steps: int, method: Method):
    """:func:`train_step` jitted over the mesh: the state (donated) keeps the shardings of
    ``config.sharding`` (:func:`~contrastive_jax.training.state_sharding.state_shardings`),
    the batch is split over ``data``."""
    ctx = make_context(config, mesh, graphdef)
    schedule = functools.partial(current_learning_rate, config.optimizer.to_dict(), steps)
    step = functools.partial(train_step, graphdef=graphdef, tx=tx, method=method, ctx=ctx,
                             learning_rate=schedule,
                             accumulation_steps=config.get("accumulation_steps", 1))
    shardings = state_shardings(config.get("sharding"), mesh, state)
    return jax.jit(step, out_shardings=(shardings, NamedSharding(mesh, P())), donate_argnums=0)


@dataclasses.dataclass
class Run:
    """The fixed parts of one training run, built once by :func:`prepare_run`."""

    config: ml_collections.ConfigDict
    workdir: epath.Path  # a local path or gs://... (workdir_path)
    mesh: Mesh
    method: Method
    steps: int
    graphdef: Any
    tx: optax.GradientTransformation
    source: Any  # the training split (random access)
    stream: Any  # the checkpointable iterator of global batches
    start: float = dataclasses.field(default_factory=time.perf_counter)

    @property
    def batch_size(self) -> int:
        return self.config.data.batch_size

    def step_fn(self, state: TrainState):
        """The compiled train step for states shaped like ``state``."""
        return compiled_step(self.config, self.mesh, self.graphdef, state, self.tx, self.steps,
                             self.method)


def check_batch(config: ml_collections.ConfigDict, mesh: Mesh) -> None:
    """The global batch divides over the processes and the ``data`` devices, and so do its
    micro-batches; a :class:`ConfigError` saying what to change otherwise."""
    check_divisible(config.data.batch_size, jax.process_count(), "processes")
    check_divisible(config.data.batch_size, mesh.shape[DATA_AXIS])
    check_accumulation(config.data.batch_size, config.get("accumulation_steps", 1),
                       mesh.shape[DATA_AXIS])


def prepare_run(config: ml_collections.ConfigDict, workdir: str | os.PathLike
                ) -> tuple[Run, TrainState]:
    """The run's mesh, method, data, model and optimiser, and a fresh state on the mesh.

    Bad settings fail here, before any compilation, with a :class:`ConfigError`.
    """
    start = time.perf_counter()
    method = method_for(config)
    mesh = make_mesh(dict(config.get("mesh", {"data": -1})))
    check_batch(config, mesh)
    source = open_split(config.data.name, config.data.train_split,
                        config.data.data_dir or None, config.data.options.to_dict() or None)
    steps = total_steps(config, len(source))
    graphdef, state, tx = create_state(config, steps, method)
    state = jax.device_put(state, state_shardings(config.get("sharding"), mesh, state))
    run = Run(config, workdir_path(workdir), mesh, method, steps, graphdef, tx, source,
              train_iterator(config.data, mesh), start)
    return run, state


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       accept_config_change: bool = False) -> dict[str, Any]:
    """Train, checkpoint, evaluate; returns (and writes to ``workdir/results.json``) the results.

    The workdir is locked for the run (:mod:`~contrastive_jax.training.workdir_lock`) and its
    ``config.json`` records ``config``; resuming with a different config raises a
    :class:`ConfigError` listing the differences unless ``accept_config_change``
    (:mod:`~contrastive_jax.training.config_record`).
    """
    LossSettings.from_config(config.loss)  # bad loss settings fail before any work
    workdir_path(workdir).mkdir(parents=True, exist_ok=True)
    with workdir_lock(workdir):
        try:
            return _locked(config, workdir, accept_config_change)
        except Exception as err:  # damaged record files show only when read
            damaged = damaged_data_error(err, config.data.name, config.data.data_dir or None)
            if damaged is None:
                raise
            raise damaged from None


def _locked(config: ml_collections.ConfigDict, workdir: str,
            accept_config_change: bool) -> dict[str, Any]:
    """:func:`train_and_evaluate` once it holds the workdir's lock."""
    run, state = prepare_run(config, workdir)
    manager = checkpoints.manager(run.workdir, every=config.checkpoint_every,
                                  keep=config.keep_checkpoints)
    try:
        changed = check_config(config, workdir, resuming_from=manager.latest_step(),
                               accept_change=accept_config_change)
        return _train(run, state, manager, config_changed=bool(changed))
    except NonFiniteError as err:  # its checkpoints may hold the parameters that diverged
        first = err.step - err.in_a_row
        try:
            moved = checkpoints.set_aside_from(manager, first, "diverged")
            left = manager.all_steps()
        finally:
            manager.close()
        if not moved:
            raise
        then = f"resumes from step {max(left)}" if left else "starts from scratch"
        raise NonFiniteError(
            f"{err} The checkpoints of steps >= {first} hold the parameters that led there; "
            f"they were moved to {epath.Path(moved[0]).parent}, so the next run {then}.",
            step=err.step, in_a_row=err.in_a_row) from None
    except BaseException:
        manager.close()  # release orbax's threads and files before the error propagates
        raise


def _train(run: Run, state: TrainState, ckpt, *, config_changed: bool = False
           ) -> dict[str, Any]:
    """The body of :func:`train_and_evaluate` once the checkpoint manager exists."""
    config, workdir, mesh, steps, stream = (run.config, run.workdir, run.mesh, run.steps,
                                            run.stream)
    state, resumed = checkpoints.restore_latest(ckpt, state, stream)
    loaded = []
    if resumed is None:  # a fresh run starts from model.init_from; a resumed one from its own
        fresh, loaded = pretrained.initialize(state, run.graphdef, config, run.method)
        state = jax.device_put(fresh, state_shardings(config.get("sharding"), mesh, state))
    write_config(config, workdir, changed_at=resumed if config_changed else None)
    first = int(state.step)
    previous = _previous_results(workdir)
    if first >= steps and previous.get("steps") == steps:  # a finished run: nothing to redo
        print(f"already finished: step {first} of {steps}; results in {workdir / 'results.json'}")
        ckpt.close()
        return previous
    progress = Progress(workdir, steps, config.data.batch_size, config.log_every, first)
    k = config.get("accumulation_steps", 1)
    micro = f" ({k} micro-batches of {config.data.batch_size // k})" if k > 1 else ""
    progress.message(f"{'resumed from step ' + str(resumed) if resumed is not None else 'start'}"
                     f": {steps} steps of {config.data.batch_size}{micro} on "
                     f"{mesh.devices.size} devices ({jax.process_count()} processes)"
                     f"{scale_settings(config)}, workdir {workdir}")
    for line in loaded:
        progress.message(line)
    step_fn = run.step_fn(state)
    window = MetricWindow()
    # evaluations of the steps this run resumes after, from the run(s) before it
    history = [e for e in previous.get("evaluations", []) if e.get("step", 0) <= first]
    metrics, eval_time = {}, 0.0
    train_start = time.perf_counter()  # reset after the first step: excludes compilation
    limit = config.get("max_skipped_in_a_row", 10)
    stopped_at, pending = None, None
    with StopSignal() as stop:
        for step in range(first + 1, steps + 1):
            batch = next(stream)
            if step == first + 1:
                progress.message(f"compiling the train step ({'restored' if resumed else 'fresh'}"
                                 " state; the first step includes compilation)...")
            state, metrics = step_fn(state, batch)
            window.add(metrics)
            if pending is not None:  # the previous step's guard, read while this one runs
                _check_finite(*pending, limit)
            pending = (step, metrics["skipped_in_a_row"])
            if step == first + 1:  # compiled: time the rest
                jax.block_until_ready(metrics)
                progress.message(f"compiled and ran step {step} in "
                                 f"{time.perf_counter() - train_start:.1f} s")
                progress.restart_clock(step)
                train_start = time.perf_counter()
            if progress.due(step):
                progress.log_train(step, window.mean())
            if stop.should_stop(step):
                _check_finite(*pending, limit)
                checkpoints.save(ckpt, step, state, stream, force=True)
                stopped_at = step
                break
            checkpoints.save(ckpt, step, state, stream, force=step == steps)
            every = config.evaluation.every if config.evaluation.enabled else 0
            if every and step % every == 0 and step != steps:
                eval_start = time.perf_counter()
                progress.message(f"evaluating at step {step}: {evaluation_names(config)}...")
                result = {"step": step, "wall_s": round(eval_start - run.start, 2),
                          "train_s": round(eval_start - train_start - eval_time, 2),
                          **evaluate(run.graphdef, state, config, mesh)}
                eval_time += time.perf_counter() - eval_start
                progress.restart_clock(step)  # examples/s counts training only
                history.append(result)
                progress.scalars("eval", step, {k: v for k, v in result.items() if k != "step"})
                progress.message(f"eval at step {step}: linear probe "
                                 f"{result['linear_probe']:.4f}, kNN {result['knn']:.4f}")
        if pending is not None:
            _check_finite(*pending, limit)
    if stopped_at is not None:
        ckpt.wait_until_finished()
        ckpt.close()
        cause = (f"signal {stop.received}" if stop.received else
                 "JAX's preemption sync point (a SIGTERM on some host)" if stop.sync_point else
                 "a signal to another process")
        progress.message(f"stopped by {cause} after step {stopped_at}: "
                         f"checkpoint saved in {workdir / 'checkpoints'}; run the same command "
                         "to resume")
        progress.close()
        return {"steps": steps, "stopped_at": stopped_at, "resumed_from": resumed}
    ckpt.wait_until_finished()
    train_time = time.perf_counter() - train_start - eval_time
    if config.evaluation.enabled:
        progress.message(f"final evaluation: {evaluation_names(config)}...")
    final = evaluate(run.graphdef, state, config, mesh) if config.evaluation.enabled else {}
    history.append({"step": steps, "wall_s": round(time.perf_counter() - run.start, 2),
                    "train_s": round(train_time, 2), **final})
    progress.scalars("eval", steps, {k: v for k, v in history[-1].items() if k != "step"})
    results = {
        "steps": steps,
        "resumed_from": resumed,
        "global_batch": config.data.batch_size,
        "accumulation_steps": config.get("accumulation_steps", 1),
        "devices": int(mesh.devices.size),
        "processes": jax.process_count(),
        "train_time_s": round(train_time, 2),
        "wall_time_s": round(time.perf_counter() - run.start, 2),
        **final,
        "final_train_metrics": {k: float(np.asarray(v)) for k, v in jax.device_get(
            metrics).items()},
        "evaluations": history,
        "params_sha256": params_digest(state),
    }
    results.update(run.method.results(run.source, config))
    if jax.process_index() == 0:
        json_output.write_atomic(workdir / "results.json", results)
    summary = ", ".join(f"{k} {v:.4f}" for k, v in final.items() if k != "linear_probe_l2")
    progress.message(f"done in {results['wall_time_s']:.0f} s"
                     f"{': ' + summary if summary else ''} -> {workdir / 'results.json'}")
    progress.close()
    ckpt.close()
    return results
