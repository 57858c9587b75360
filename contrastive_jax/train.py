"""The trainer: SimCLR, MoCo, CLIP and SigLIP from one config, on a device mesh.

``train_and_evaluate(config, workdir)`` is the whole run:

1. the mesh (``config.mesh``, default all devices on ``data``), the training stream (global
   batches sharded over ``data``, :mod:`contrastive_jax.data`), the model
   (:func:`contrastive_jax.models.build_model`) and the optimiser
   (:func:`contrastive_jax.optimizers.build_optimizer`);
2. the train state, a plain pytree replicated on the mesh::

       {"step", "params", "rest" (BatchNorm statistics...), "opt_state", "rng", "skipped",
        MoCo only: "key_params", "key_rest", "queue", "queue_pointer"}

   restored from the latest checkpoint in ``workdir`` when there is one (with the data
   iterator's position, so the run continues the exact stream);
3. the loop: ``state, metrics = train_step(state, batch)`` (one jitted pure function of the
   graph definition, the state, the batch and the step's key), progress lines and TensorBoard
   scalars every ``log_every`` steps, checkpoints every ``checkpoint_every`` steps and at the
   end, optional evaluations every ``evaluation.every`` steps;
4. the evaluation of the frozen model (:func:`evaluate`: linear probe, kNN, alignment and
   uniformity; for dual encoders retrieval Recall@k and zero-shot accuracy;
   :mod:`contrastive_jax.model_evaluation`) and ``workdir/results.json``.

Under ``jit`` the parameters are replicated and the batch is split over ``data``: the
encoders run data-parallel, BatchNorm statistics are over the global batch (SimCLR's global
BN, 004), and the gradients are all-reduced by XLA. The loss is the single-device loss on the
global arrays or a sharded loss (``loss.strategy``), both exact over the global batch.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import pathlib
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax import checkpointing
from contrastive_jax.data import open_split, train_iterator
from contrastive_jax.data.correlated_gaussians import mutual_information
from contrastive_jax.losses.normalize import l2_normalize
from contrastive_jax.model_evaluation import evaluate
from contrastive_jax.models import build_model, moco
from contrastive_jax.objectives import Context, LossSettings, objective_for
from contrastive_jax.optimizers import build_optimizer, current_learning_rate, is_temperature
from contrastive_jax.preemption import StopSignal
from contrastive_jax.progress import Progress
from contrastive_jax.sharding import DATA_AXIS, check_divisible, make_mesh

MOCO_KEYS = ("key_params", "key_rest", "queue", "queue_pointer")


def total_steps(config: ml_collections.ConfigDict, train_size: int) -> int:
    """``config.total_steps`` if set, else ``ceil(num_epochs * train_size / batch_size)``."""
    if config.get("total_steps", 0):
        return int(config.total_steps)
    steps = math.ceil(config.num_epochs * train_size / config.data.batch_size)
    if steps < 1:
        raise ValueError("set total_steps or num_epochs > 0")
    return steps


def create_state(config: ml_collections.ConfigDict, steps: int):
    """``(graphdef, state, tx)``: the model split into its graph and state, a fresh state."""
    model = build_model(config.model, nnx.Rngs(config.seed))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = build_optimizer(config.optimizer, steps, params)
    state = {
        "step": jnp.zeros((), jnp.int32),
        "params": params,
        "rest": rest,
        "opt_state": tx.init(params),
        "rng": jax.random.key_data(jax.random.key(config.seed)),
        "skipped": jnp.zeros((), jnp.int32),
        "skipped_in_a_row": jnp.zeros((), jnp.int32),
    }
    if config.model.name == "moco":
        moco.check_queue_size(config.model.queue_size, config.data.batch_size)
        dim = model.head.out_features
        state["key_params"] = jax.tree.map(jnp.copy, params)
        state["key_rest"] = jax.tree.map(jnp.copy, rest)
        state["queue"] = moco.init_queue(jax.random.key(config.seed + 1),
                                         config.model.queue_size, dim)
        state["queue_pointer"] = jnp.zeros((), jnp.int32)
    return graphdef, state, tx


def clamp_log_scale(params, max_scale: float):
    """The learnable ``log_scale`` clamped just below ``log(max_scale)`` after each update.

    The loss already caps the scale with zero gradient where the cap binds (``log_scale >=
    log(max_scale)``, 000 P8); clamping the parameter too, as open_clip does, keeps it from
    drifting above the cap. It is clamped to the largest value of its dtype *below*
    ``log(max_scale)`` (scale ``100 - 5e-5`` in float32), where the cap does not bind, so the
    gradient reaches it and it moves down again as soon as the gradient says so; clamped at
    ``log(max_scale)`` itself it would stay there for good.
    """
    top = math.log(max_scale)

    def below_top(dtype):
        value = np.asarray(top, dtype)
        return np.nextafter(value, np.asarray(-np.inf, dtype)) if value >= top else value

    def clamp(path, leaf):
        if is_temperature(path) and path[0].key == "log_scale":
            return jnp.minimum(leaf, below_top(leaf.dtype))
        return leaf

    return jax.tree_util.tree_map_with_path(clamp, params)


def train_step(state: dict, batch: dict, *, graphdef, tx: optax.GradientTransformation,
               ctx: Context, momentum: float = 0.0,
               learning_rate: optax.Schedule | None = None) -> tuple[dict, dict]:
    """One optimisation step; a pure function of the state and the batch.

    The step's key is ``fold_in(state["rng"], state["step"])`` (augmentations, dropout), so a
    resumed run draws the same keys. A non-finite loss or gradient skips the update (the step
    counter, ``skipped`` and ``skipped_in_a_row`` advance, nothing else changes).
    """
    objective = objective_for(ctx.loss.name)
    rng = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), state["step"])
    extras = {k: state[k] for k in MOCO_KEYS if k in state}

    def loss_fn(params):
        model = nnx.merge(graphdef, params, state["rest"], copy=True)
        loss, metrics, outputs = objective(model, batch, rng, extras, ctx)
        return loss, (metrics, outputs, nnx.state(model, nnx.Not(nnx.Param)))

    (loss, (metrics, outputs, rest)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        state["params"])
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    params = clamp_log_scale(optax.apply_updates(state["params"], updates), ctx.loss.max_scale)
    new = dict(state, params=params, rest=rest, opt_state=opt_state)
    if "queue" in state:
        new["key_params"] = moco.momentum_update(state["key_params"], params, momentum)
        new["key_rest"] = outputs["key_rest"]
        new["queue"], new["queue_pointer"] = moco.enqueue(
            state["queue"], state["queue_pointer"], l2_normalize(outputs["keys"]))
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    new = jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, state)
    new["step"] = state["step"] + 1
    new["skipped"] = state["skipped"] + (~finite).astype(jnp.int32)
    new["skipped_in_a_row"] = jnp.where(finite, 0, state["skipped_in_a_row"] + 1)
    metrics = {**metrics, "loss": loss, "grad_norm": grad_norm,
               "skipped": new["skipped"].astype(jnp.float32),
               "skipped_in_a_row": new["skipped_in_a_row"]}
    if learning_rate is not None:
        metrics["learning_rate"] = learning_rate(state["step"])
    return new, metrics


def params_digest(state: dict) -> str:
    """SHA-256 of the parameters and the other model state (BatchNorm statistics), leaf by leaf
    in tree order: equal digests mean bit-identical models."""
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves((state["params"], state["rest"])):
        value = np.asarray(leaf.addressable_data(0) if isinstance(leaf, jax.Array) else leaf)
        digest.update(str((value.shape, value.dtype.str)).encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    return digest.hexdigest()


class NonFiniteError(RuntimeError):
    """Too many consecutive steps with a non-finite loss or gradient."""


def _replicated(mesh: Mesh, tree):
    return jax.tree.map(lambda _: NamedSharding(mesh, P()), tree)


def _check_finite(step: int, in_a_row, limit: int) -> None:
    in_a_row = int(in_a_row)
    if limit and in_a_row >= limit:
        raise NonFiniteError(
            f"step {step}: the loss or gradient was non-finite for {in_a_row} steps in a row "
            f"(each update skipped); stopping. Lower the learning rate, check the data, or "
            f"raise max_skipped_in_a_row (now {limit}).")


def make_context(config, mesh: Mesh, graphdef) -> Context:
    """What the objective needs from the config (static under ``jit``)."""
    augment = config.get("augment")
    return Context(loss=LossSettings.from_config(config.loss), mesh=mesh,
                   input_key=config.input_key, text_key=config.get("text_key", "caption"),
                   augment=None if augment is None else augment.to_dict(), graphdef=graphdef)


def compiled_step(config, mesh, graphdef, state, tx, steps: int):
    """``train_step`` jitted over the mesh: state replicated (donated), batch on ``data``."""
    ctx = make_context(config, mesh, graphdef)
    momentum = config.model.get("momentum", 0.0)
    schedule = functools.partial(current_learning_rate, config.optimizer.to_dict(), steps)
    step = functools.partial(train_step, graphdef=graphdef, tx=tx, ctx=ctx, momentum=momentum,
                             learning_rate=schedule)
    shardings = _replicated(mesh, state)
    return jax.jit(step, out_shardings=(shardings, NamedSharding(mesh, P())),
                   donate_argnums=0)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Train, checkpoint, evaluate; returns (and writes to ``workdir/results.json``) the results."""
    start = time.perf_counter()
    LossSettings.from_config(config.loss)  # bad loss settings fail before any work
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    mesh = make_mesh(dict(config.get("mesh", {"data": -1})))
    check_divisible(config.data.batch_size, jax.process_count(), "processes")
    check_divisible(config.data.batch_size, mesh.shape[DATA_AXIS])
    source = open_split(config.data.name, config.data.train_split,
                        config.data.data_dir or None, config.data.options.to_dict() or None)
    steps = total_steps(config, len(source))
    graphdef, state, tx = create_state(config, steps)
    state = jax.device_put(state, _replicated(mesh, state))
    stream = train_iterator(config.data, mesh)
    ckpt = checkpointing.manager(workdir, every=config.checkpoint_every,
                                 keep=config.keep_checkpoints)
    try:
        return _train(config, workdir, mesh, steps, graphdef, state, tx, stream, ckpt, start,
                      source)
    except BaseException:
        ckpt.close()  # release orbax's threads and files before the error propagates
        raise


def _train(config, workdir, mesh, steps, graphdef, state, tx, stream, ckpt, start, source):
    """The body of :func:`train_and_evaluate` once the checkpoint manager exists."""
    state, resumed = checkpointing.restore_latest(ckpt, state, stream)
    first = int(state["step"])
    progress = Progress(workdir, steps, config.data.batch_size, config.log_every, first)
    progress.message(f"{'resumed from step ' + str(resumed) if resumed is not None else 'start'}"
                     f": {steps} steps of {config.data.batch_size} on {mesh.devices.size} "
                     f"devices ({jax.process_count()} processes), workdir {workdir}")
    step_fn = compiled_step(config, mesh, graphdef, state, tx, steps)
    history, metrics, eval_time = [], {}, 0.0
    train_start = time.perf_counter()  # reset after the first step: excludes compilation
    limit = config.get("max_skipped_in_a_row", 10)
    stopped_at, pending = None, None
    with StopSignal() as stop:
        for step in range(first + 1, steps + 1):
            batch = next(stream)
            state, metrics = step_fn(state, batch)
            if pending is not None:  # the previous step's guard, read while this one runs
                _check_finite(*pending, limit)
            pending = (step, metrics["skipped_in_a_row"])
            if step == first + 1:  # compiled: time the rest
                jax.block_until_ready(metrics)
                progress.restart_clock(step)
                train_start = time.perf_counter()
            if progress.due(step):
                progress.log_train(step, jax.device_get(metrics))
            if stop.should_stop():
                _check_finite(*pending, limit)
                checkpointing.save(ckpt, step, state, stream, force=True)
                stopped_at = step
                break
            checkpointing.save(ckpt, step, state, stream, force=step == steps)
            every = config.evaluation.every if config.evaluation.enabled else 0
            if every and step % every == 0 and step != steps:
                eval_start = time.perf_counter()
                result = {"step": step, "wall_s": round(eval_start - start, 2),
                          "train_s": round(eval_start - train_start - eval_time, 2),
                          **evaluate(graphdef, state, config, mesh)}
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
        cause = f"signal {stop.received}" if stop.received else "a signal to another process"
        progress.message(f"stopped by {cause} after step {stopped_at}: "
                         f"checkpoint saved in {workdir / 'checkpoints'}; run the same command "
                         "to resume")
        progress.close()
        return {"steps": steps, "stopped_at": stopped_at, "resumed_from": resumed}
    ckpt.wait_until_finished()
    train_time = time.perf_counter() - train_start - eval_time
    final = evaluate(graphdef, state, config, mesh) if config.evaluation.enabled else {}
    history.append({"step": steps, "wall_s": round(time.perf_counter() - start, 2),
                    "train_s": round(train_time, 2), **final})
    progress.scalars("eval", steps, {k: v for k, v in history[-1].items() if k != "step"})
    results = {
        "steps": steps,
        "resumed_from": resumed,
        "global_batch": config.data.batch_size,
        "devices": int(mesh.devices.size),
        "processes": jax.process_count(),
        "train_time_s": round(train_time, 2),
        "wall_time_s": round(time.perf_counter() - start, 2),
        **final,
        "final_train_metrics": {k: float(np.asarray(v)) for k, v in jax.device_get(
            metrics).items()},
        "evaluations": history,
        "params_sha256": params_digest(state),
    }
    if hasattr(source, "rho"):  # correlated_gaussians: the true value the bound estimates
        results["true_mutual_information"] = mutual_information(source.dim, source.rho)
    if jax.process_index() == 0:
        (workdir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    summary = ", ".join(f"{k} {v:.4f}" for k, v in final.items() if k != "linear_probe_l2")
    progress.message(f"done in {results['wall_time_s']:.0f} s"
                     f"{': ' + summary if summary else ''} -> {workdir / 'results.json'}")
    progress.close()
    ckpt.close()
    return results
