"""MoCo: queries from view 1, momentum-encoder keys from view 2, a queue of past keys.

[MoCo] (docs/references.md). The key encoder is a second copy of the parameters, never
differentiated, moved towards the query parameters after every step by an exponential moving
average, ``theta_k <- m theta_k + (1 - m) theta_q`` (``optax.incremental_update``); the queue
is a FIFO ``(K, d)`` buffer of past keys: each step enqueues the global batch's keys over the
oldest ones, so ``K`` must be a multiple of the global batch. Both live in the train state's
``extra`` (``key_params``, ``key_rest``, ``queue``, ``queue_pointer``) and in checkpoints.

The method's settings are the config's ``moco`` block (:class:`MoCoSettings`)::

    config.moco = {"momentum": 0.99, "queue_size": 4096}

(before, ``model.momentum`` and ``model.queue_size``: now a :class:`ConfigError` naming the new
key; a workdir recorded with them resumes,
:func:`contrastive_jax.training.run.workdir.config_record.upgrade`).

**Shuffling BN** ([MoCo] §3.3): with a ResNet whose BatchNorm runs over groups of the batch
(``model.encoder.bn_groups = G > 1``,
:mod:`~contrastive_jax.training.models.encoders.ghost_batch_norm`: MoCo's per-GPU BatchNorm),
the key encoder sees view 2 in a shuffled order
(:func:`shuffled_order`) and its keys are put back in order, so a query and its positive key
are normalised by different groups' statistics and cannot be matched by them; the queue's keys,
from earlier batches, never shared them. With ``G = 1`` (one BatchNorm over the batch) nothing
is shuffled.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from contrastive_jax.errors import ConfigError
from contrastive_jax.losses import moco_infonce
from contrastive_jax.losses.parts.normalize import l2_normalize
from contrastive_jax.training.augmentations import augment_each
from contrastive_jax.training.augmentations.family import check_recipe_input
from contrastive_jax.training.augmentations.pixels import normalize, unit_range
from contrastive_jax.training.methods.base import (
    Method,
    MethodContext,
    example_keys,
    temperature_of,
)
from contrastive_jax.training.methods.step_metrics import contrastive_top1, first_anchors, mean_norm


def momentum_update(key_params, query_params, momentum: float):
    """``m * key + (1 - m) * query`` leaf by leaf."""
    if not 0.0 <= momentum <= 1.0:
        raise ConfigError(f"momentum must lie in [0, 1]; got {momentum}")
    return optax.incremental_update(query_params, key_params, step_size=1.0 - momentum)


def check_queue_size(queue_size: int, global_batch: int) -> None:
    """A :class:`ConfigError` unless ``queue_size`` is a positive multiple of ``global_batch``."""
    if queue_size < global_batch or queue_size % global_batch:
        raise ConfigError(f"MoCo queue size {queue_size} must be a positive multiple of the "
                          f"global batch {global_batch}; change moco.queue_size or "
                          "data.batch_size")


def init_queue(key: jax.Array, size: int, dim: int) -> jax.Array:
    """A ``(size, dim)`` queue of random unit vectors (MoCo's initialisation)."""
    q = jax.random.normal(key, (size, dim), jnp.float32)
    return q / jnp.linalg.norm(q, axis=1, keepdims=True)


def enqueue(queue: jax.Array, pointer: jax.Array, keys: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Write ``keys (B, d)`` over rows ``pointer .. pointer + B - 1``; the next pointer.

    ``B`` divides ``K`` (:func:`check_queue_size`), so a write never wraps.
    """
    keys = jax.lax.stop_gradient(keys).astype(queue.dtype)
    queue = jax.lax.dynamic_update_slice(queue, keys, (pointer, jnp.zeros_like(pointer)))
    return queue, (pointer + keys.shape[0]) % queue.shape[0]


def _view(x, aug_keys, view: int, ctx: MethodContext):
    """View ``view`` of :func:`~contrastive_jax.training.augmentations.two_views_each`, on
    ``[0, 1]`` pixels, then normalised (:mod:`~contrastive_jax.training.augmentations.pixels`)."""
    view = augment_each(unit_range(x), jax.vmap(jax.random.split)(aug_keys)[:, view],
                        ctx.augment, view=view)
    return normalize(view, ctx.pixels)


def shuffled_order(keys: jax.Array) -> jax.Array:
    """A permutation of the batch drawn from the examples' step keys ``(B,)``: the order of one
    random 32-bit word per example (``fold_in(key, SHUFFLE_SALT)``), so it depends on the
    examples only, not on how the batch is split over devices."""
    words = jax.vmap(lambda key: jax.random.bits(jax.random.fold_in(key, SHUFFLE_SALT)))(keys)
    return jnp.argsort(words, stable=True)


SHUFFLE_SALT = 0x5EED  # keeps the shuffle's words apart from the examples' other draws


@dataclasses.dataclass(frozen=True)
class MoCoSettings:
    """The ``moco`` block of a config: the key encoder's EMA ``momentum`` m in [0, 1] and the
    ``queue_size`` K of past keys (a positive multiple of the global batch)."""

    momentum: float = 0.99
    queue_size: int = 4096

    @classmethod
    def from_block(cls, block: Mapping[str, Any] | None) -> MoCoSettings:
        """The settings of a ``moco`` block (absent: the defaults); unknown keys and values of
        the wrong kind are a :class:`ConfigError`."""
        block = dict(block or {})
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(block) - fields)
        if unknown:
            raise ConfigError(f"unknown moco settings {unknown}; valid: {sorted(fields)}")
        settings = cls(**block)
        if isinstance(settings.queue_size, bool) or not isinstance(settings.queue_size, int):
            raise ConfigError(f"moco.queue_size must be an int; got {settings.queue_size!r}")
        if isinstance(settings.momentum, bool) or not isinstance(settings.momentum, int | float):
            raise ConfigError(f"moco.momentum must be a float; got {settings.momentum!r}")
        if not 0.0 <= settings.momentum <= 1.0:
            raise ConfigError(f"moco.momentum must lie in [0, 1]; got {settings.momentum}")
        return settings


@dataclasses.dataclass(frozen=True)
class MoCo(Method):
    """InfoNCE of queries against their keys and the queue; momentum and queue after each step."""

    momentum: float = 0.99
    queue_size: int = 4096
    seed: int = 0  # the queue's initialisation draws from key(seed + 1)
    shuffle_keys: bool = False  # the encoder's BatchNorm runs over groups: shuffle the keys
    name: ClassVar[str] = "moco"
    losses: ClassVar[tuple[str, ...]] = ("moco",)
    settings_block: ClassVar[str] = "moco"

    @classmethod
    def from_config(cls, config, loss_settings) -> MoCo:
        """MoCo with the config's ``moco`` block (:class:`MoCoSettings`) and ``seed``; the
        settings' old place (``model.momentum``, ``model.queue_size``) is a
        :class:`ConfigError` naming the new key."""
        moved = sorted(k for k in ("momentum", "queue_size") if k in config.get("model", {}))
        if moved:
            raise ConfigError("; ".join(f"model.{k} is a setting of MoCo now: set "
                                        f"config.moco.{k} instead" for k in moved))
        settings = MoCoSettings.from_block(config.get(cls.settings_block))
        bn_groups = config.get("model", {}).get("encoder", {}).get("bn_groups", 1)
        return cls(loss_settings=loss_settings, momentum=settings.momentum,
                   queue_size=settings.queue_size, seed=config.seed,
                   shuffle_keys=bn_groups != 1)

    def check(self, config) -> None:
        check_queue_size(self.queue_size, config.data.batch_size)
        check_recipe_input(config.get("augment"), config.data.get("preprocess"))
        if not 0.0 <= self.momentum <= 1.0:
            raise ConfigError(f"moco.momentum must lie in [0, 1]; got {self.momentum}")

    def init_extra(self, model, params, rest, config):
        return {
            "key_params": jax.tree.map(jnp.copy, params),
            "key_rest": jax.tree.map(jnp.copy, rest),
            "queue": init_queue(jax.random.key(self.seed + 1), self.queue_size,
                                model.head.out_features),
            "queue_pointer": jnp.zeros((), jnp.int32),
        }

    def targets(self, batch, keys, extra, ctx: MethodContext):
        """The momentum encoder's keys of view 2 (no gradient); its BatchNorm state moves.
        ``shuffle_keys`` (the encoder's ``bn_groups > 1``): view 2 enters the key encoder in
        the order :func:`shuffled_order` and its keys are put back, so a query and its key are
        normalised with different groups' statistics ([MoCo] §3.3, "Shuffling BN")."""
        aug_keys, dropout_keys = example_keys(keys)
        v2 = _view(batch[ctx.input_key], aug_keys, 1, ctx)
        key_model = nnx.merge(ctx.graphdef, extra["key_params"], extra["key_rest"], copy=True)
        if self.shuffle_keys:
            order = shuffled_order(keys)
            k, _ = key_model(v2[order], train=True, dropout_keys=dropout_keys[order])
            k = k[jnp.argsort(order)]
        else:
            k, _ = key_model(v2, train=True, dropout_keys=dropout_keys)
        return ({"keys": jax.lax.stop_gradient(k)},
                {**extra, "key_rest": nnx.state(key_model, nnx.Not(nnx.Param))})

    def embed(self, model, batch, keys, ctx: MethodContext):
        aug_keys, dropout_keys = example_keys(keys)
        v1 = _view(batch[ctx.input_key], aug_keys, 0, ctx)
        q, h = model(v1, train=True, dropout_keys=dropout_keys)
        return {"q": q, "h": h}

    def objective(self, model, rows, targets, batch, extra, ctx: MethodContext):
        q, k, queue = rows["q"], targets["keys"], extra["queue"]
        tau = temperature_of(model, ctx.loss)
        loss = moco_infonce(q, k, queue, tau)
        m = first_anchors(q.shape[0])
        candidates = jnp.concatenate([k[:m], queue])
        metrics = {
            "top1": contrastive_top1(q[:m], candidates, jnp.arange(m)),
            # log(K + 1) - L: not a bound with a queue of stale keys (docs/derivations.md)
            "mi_bound": math.log(queue.shape[0] + 1) - loss,
            "embedding_norm": mean_norm(q),
            "feature_norm": mean_norm(rows["h"]),
            "temperature": jnp.asarray(tau, jnp.float32),
        }
        return loss, metrics, {"keys": k}

    def after_update(self, extra, params, outputs, ctx):
        queue, pointer = enqueue(extra["queue"], extra["queue_pointer"],
                                 l2_normalize(outputs["keys"]))
        return {"key_params": momentum_update(extra["key_params"], params, self.momentum),
                "key_rest": extra["key_rest"], "queue": queue, "queue_pointer": pointer}
