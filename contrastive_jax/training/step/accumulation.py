"""One step's gradients, on the whole global batch or exactly accumulated over micro-batches.

A contrastive loss couples every example of the global batch (each one is every other's
negative), so summing the gradients of ``K`` micro-batch losses is a different objective
(each micro-batch would see only its own negatives; docs/derivations.md §14.7).
:func:`step_gradients` with ``accumulation_steps = K > 1`` computes the
gradient of the *global-batch* loss in three passes (the gradient cache, [GradCache] in
docs/references.md), holding the activations of one micro-batch at a time:

1. the rows of every micro-batch without gradient (a ``lax.scan``): ``r = embed(theta, x)``,
   ``(B, d)`` in all, and the method's no-gradient targets (MoCo's momentum keys);
2. the loss on the global rows and its gradient with respect to the rows and to the loss's
   own parameters (log-scale, SigLIP bias): ``L(r, s)``, ``dL/dr``, ``dL/ds`` (any ``impl``,
   any sharded ``strategy``: the tiled and ring losses keep this ``O(B d)``);
3. each micro-batch's forward again, with the same per-example keys (augmentations,
   dropout), and its slice of ``dL/dr`` pulled back through the encoders (``jax.vjp``):
   ``dL/dtheta = sum_k J_k^T (dL/dr)_k``, summed in the parameters' dtype.

By the chain rule this is the gradient of the global loss: equal to ``K = 1`` up to rounding
(``tests/test_accumulation.py``: 1e-12 relative in float64, every method, 1 and 8 devices,
dense, tiled and ring losses). BatchNorm is per micro-batch by definition (ghost BatchNorm,
[GhostBN]): each micro-batch normalises by its own statistics and the running averages move
once per micro-batch, so models with BatchNorm are not exact across ``K``.

Micro-batches are strided, not contiguous: micro-batch ``k`` takes rows
``k m .. (k + 1) m - 1`` of every device's shard (``m = B / (D K)``), so each one is still
spread over all ``D`` data devices and no data moves between devices to form it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax.errors import ConfigError
from contrastive_jax.mesh import DATA_AXIS
from contrastive_jax.training.methods import Method, MethodContext
from contrastive_jax.training.models.locked_towers import (
    merge_frozen,
    split_frozen,
    with_zero_gradients,
)


def check_accumulation(batch_size: int, steps: Any, data_devices: int) -> int:
    """``steps`` as an int after checking that ``batch_size`` splits into ``steps`` micro-batches
    of whole rows on each of ``data_devices`` devices; a :class:`ConfigError` naming the
    numbers otherwise."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"accumulation_steps must be an integer >= 1; got {steps!r}")
    if batch_size % steps:
        raise ConfigError(f"accumulation_steps = {steps} does not divide the global batch "
                          f"{batch_size}; pick a divisor of {batch_size}")
    micro = batch_size // steps
    if micro % data_devices:
        raise ConfigError(
            f"accumulation_steps = {steps} gives micro-batches of {micro} rows, not divisible "
            f"by the {data_devices} data devices; the micro-batch (batch_size / "
            f"accumulation_steps) must be a multiple of {data_devices}")
    return steps


def accumulation_steps(config, data_devices: int) -> int:
    """``config.accumulation_steps`` (K micro-batches per global batch), checked against
    ``config.data.batch_size`` and the ``data_devices`` by :func:`check_accumulation`: the one
    place the trainer reads it."""
    return check_accumulation(config.data.batch_size, config.accumulation_steps, data_devices)


def to_micro_batches(tree, steps: int, data_devices: int):
    """Every ``(B, ...)`` leaf as ``(K, B / K, ...)``; micro-batch ``k`` holds rows
    ``k m .. (k + 1) m - 1`` of each device's ``B / D`` rows (``m = B / (D K)``)."""
    def split(a):
        d, m = data_devices, a.shape[0] // (data_devices * steps)
        a = a.reshape(d, steps, m, *a.shape[1:]).swapaxes(0, 1)
        return a.reshape(steps, d * m, *a.shape[3:])
    return jax.tree.map(split, tree)


def from_micro_batches(tree, data_devices: int):
    """The inverse of :func:`to_micro_batches`: ``(K, B / K, ...)`` leaves back to ``(B, ...)``
    in the global batch's row order."""
    def join(a):
        k, d = a.shape[0], data_devices
        a = a.reshape(k, d, a.shape[1] // d, *a.shape[2:]).swapaxes(0, 1)
        return a.reshape(-1, *a.shape[3:])
    return jax.tree.map(join, tree)


def step_gradients(params, rest, batch: Mapping[str, jax.Array], keys: jax.Array,
                   extra: Mapping[str, Any], *, graphdef, method: Method, ctx: MethodContext,
                   accumulation_steps: int = 1):
    """The loss of one global batch and its gradient with respect to ``params``.

    Args:
      params, rest: the model's ``nnx.Param`` state and its other state (BatchNorm statistics).
      batch: the global batch, every leaf ``(B, ...)``, sharded over the mesh's data axis.
      keys: ``(B,)`` per-example PRNG keys (augmentations, dropout).
      extra: the method's state (:meth:`Method.init_extra`).
      accumulation_steps: ``K``; 1 differentiates the whole batch at once, ``K > 1`` runs the
        three passes of the module docstring. ``B`` must split as :func:`check_accumulation`
        says.

    Returns:
      ``(loss, grads, metrics, outputs, rest, extra)``: ``grads`` shaped like ``params``;
      zeros for the frozen parameters (``ctx.frozen``), which are not differentiated;
      ``metrics`` and ``outputs`` of :meth:`Method.objective` on the global batch; the model's
      new non-parameter state and the method's state after :meth:`Method.targets`.
    """
    d = ctx.mesh.shape[DATA_AXIS]  # checked first: True or 1.0 is an error, not K = 1
    k = check_accumulation(keys.shape[0], accumulation_steps, d)

    def rows_of(p, r, part, part_keys):
        model = nnx.merge(graphdef, p, r, copy=True)
        return method.embed(model, part, part_keys, ctx), nnx.state(model, nnx.Not(nnx.Param))

    def objective(p, rows, targets, new_rest, new_extra):
        model = nnx.merge(graphdef, p, new_rest, copy=True)
        return method.objective(model, rows, targets, batch, new_extra, ctx)

    # only the trainable parameters are differentiated: the frozen ones (ctx.frozen) enter as
    # constants, so no backward pass is built through a frozen tower (models/locked_towers.py)
    trainable, fixed = split_frozen(params, ctx.frozen)

    def whole(t):
        return merge_frozen(t, fixed)

    if k == 1:
        targets, extra = method.targets(batch, keys, extra, ctx)

        def loss_fn(t):
            rows, new_rest = rows_of(whole(t), rest, batch, keys)
            loss, metrics, outputs = objective(whole(t), rows, targets, new_rest, extra)
            return loss, (metrics, outputs, new_rest)

        (loss, (metrics, outputs, rest)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            trainable)
        return loss, with_zero_gradients(grads, fixed), metrics, outputs, rest, extra

    spread = NamedSharding(ctx.mesh, P(None, DATA_AXIS))
    parts = jax.lax.with_sharding_constraint(to_micro_batches((batch, keys), k, d), spread)

    # pass 1: rows and targets of every micro-batch, no gradient
    def first(carry_extra, part):
        part_batch, part_keys = part
        targets, carry_extra = method.targets(part_batch, part_keys, carry_extra, ctx)
        rows, _ = rows_of(params, rest, part_batch, part_keys)
        return carry_extra, (jax.lax.stop_gradient(rows), targets)

    extra, (rows, targets) = jax.lax.scan(first, dict(extra), parts)
    rows, targets = from_micro_batches((rows, targets), d)

    # pass 2: the global loss, its gradient w.r.t. the rows and the loss's own parameters
    (loss, (metrics, outputs)), (grads, row_grads) = jax.value_and_grad(
        lambda t, r: _split_aux(objective(whole(t), r, targets, rest, extra)), argnums=(0, 1),
        has_aux=True)(trainable, rows)

    # pass 3: each micro-batch's forward again, its slice of dL/drows pulled back
    row_grads = jax.lax.with_sharding_constraint(to_micro_batches(row_grads, k, d), spread)

    def third(carry, part):
        total, carry_rest = carry
        (part_batch, part_keys), part_grads = part
        _, pull, carry_rest = jax.vjp(
            lambda t: rows_of(whole(t), carry_rest, part_batch, part_keys), trainable,
            has_aux=True)
        (g,) = pull(part_grads)
        return (jax.tree.map(jnp.add, total, g), carry_rest), None

    (grads, rest), _ = jax.lax.scan(third, (grads, rest), (parts, row_grads))
    return loss, with_zero_gradients(grads, fixed), metrics, outputs, rest, extra


def _split_aux(result):
    loss, metrics, outputs = result
    return loss, (metrics, outputs)
