"""The train step: ``state, metrics = step(state, batch)``, one jitted pure function.

:func:`train_step` is one optimisation step of any method (the method supplies the loss,
:class:`~contrastive_jax.training.methods.Method`); :func:`make_context` is what the method
needs from the config (static under ``jit``); :func:`compiled_step` jits the step over the
mesh with the state's shardings (:mod:`~contrastive_jax.training.step.state_sharding`). The
loop that calls it is :mod:`contrastive_jax.training.train`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax.mesh import DATA_AXIS
from contrastive_jax.training.augmentations.pixels import pixel_normalization
from contrastive_jax.training.methods import Method, MethodContext
from contrastive_jax.training.models.locked_towers import frozen_names, keep_frozen
from contrastive_jax.training.models.scanned_layers import batch_sharded
from contrastive_jax.training.step.accumulation import accumulation_steps, step_gradients
from contrastive_jax.training.step.optimizers import clamp_log_scale, current_learning_rate
from contrastive_jax.training.step.state_sharding import state_shardings
from contrastive_jax.training.step.train_state import TrainState, all_finite


def train_step(state: TrainState, batch: dict, *, graphdef, tx: optax.GradientTransformation,
               method: Method, ctx: MethodContext,
               learning_rate: optax.Schedule | None = None,
               accumulation_steps: int = 1) -> tuple[TrainState, dict]:
    """One optimisation step; a pure function of the state and the batch.

    The step's key is ``fold_in(state.rng, state.step)``, split into one key per example of
    the global batch (augmentations, dropout), so a resumed run draws the same keys and an
    example draws the same randomness in any micro-batch. The gradient is that of the
    global-batch loss, with ``accumulation_steps = K`` micro-batches exactly as with one
    (:func:`~contrastive_jax.training.step.accumulation.step_gradients`). A NaN or inf anywhere in
    the batch makes the loss NaN. A non-finite loss or gradient, or updated parameters whose
    float32 norm overflows (an update that sent them past ~1e19: a learning rate of 1e30, say),
    skips the update (the step counter, ``skipped``
    and ``skipped_in_a_row`` advance, nothing else changes), so the state, and every
    checkpoint of it, only ever holds finite parameters.
    """
    rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    keys = jax.random.split(rng, jax.tree.leaves(batch)[0].shape[0])
    with batch_sharded(ctx.mesh, DATA_AXIS):  # scanned blocks keep the batch split
        loss, grads, metrics, outputs, rest, extra = step_gradients(
            state.params, state.rest, batch, keys, state.extra, graphdef=graphdef,
            method=method, ctx=ctx, accumulation_steps=accumulation_steps)
    # a NaN or inf in the batch makes the loss NaN whatever the encoders do with it (XLA:CPU's
    # fused max drops NaN: mean(relu(x)) of an all-NaN x is 0, so BatchNorm + ReLU + mean
    # pooling can turn a NaN example into finite features)
    loss = jnp.where(all_finite(batch), loss, jnp.nan)
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


def make_context(config, mesh: Mesh, graphdef, method: Method) -> MethodContext:
    """What the method needs from the config (static under ``jit``); the loss settings are the
    method's own, parsed once by :func:`~contrastive_jax.training.methods.method_for`."""
    augment = config.get("augment")
    data = config.get("data") or {}
    return MethodContext(loss=method.loss_settings, mesh=mesh,
                         input_key=config.input_key, text_key=config.get("text_key", "caption"),
                         augment=None if augment is None else augment.to_dict(),
                         graphdef=graphdef, frozen=frozen_names(config.model),
                         pixels=pixel_normalization(data.get("preprocess")))


def compiled_step(config, mesh: Mesh, graphdef, state: TrainState,
                  tx: optax.GradientTransformation, steps: int, method: Method):
    """:func:`train_step` jitted over the mesh: the state (donated) keeps the shardings of
    ``config.sharding`` (:func:`~contrastive_jax.training.step.state_sharding.state_shardings`),
    the batch is split over ``data``."""
    ctx = make_context(config, mesh, graphdef, method)
    schedule = functools.partial(current_learning_rate, config.optimizer.to_dict(), steps)
    step = functools.partial(train_step, graphdef=graphdef, tx=tx, method=method, ctx=ctx,
                             learning_rate=schedule,
                             accumulation_steps=accumulation_steps(config, mesh.shape[DATA_AXIS]))
    shardings = state_shardings(config.get("sharding"), mesh, state)
    return jax.jit(step, out_shardings=(shardings, NamedSharding(mesh, P())), donate_argnums=0)
