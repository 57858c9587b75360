"""MoCo v3: predicted queries against momentum keys of the other view, symmetric, no queue.

[MoCoV3] §3, Algorithm 1 (docs/references.md; docs/derivations.md §10.4). The query
encoder ``f_q`` is the model: backbone ``f``, projector ``g`` (``model.head``) and predictor
``p`` (``model.predictor``, :meth:`~contrastive_jax.training.models.ProjectedEncoder.predict`);
the key encoder ``f_k`` is a momentum copy of the backbone and projector, run without the
predictor. Each example gives two views ``x1, x2``, each through its own forward pass (so
BatchNorm normalises each view over the global batch, as the official code's SyncBN does)::

    q1, q2 = p(g(f(x1))), p(g(f(x2)))             queries, (N, d), differentiated
    k1, k2 = g_k(f_k(x1)), g_k(f_k(x2))           keys, (N, d), no gradient
    L = ctr(q1, k2) + ctr(q2, k1)
    ctr(q, k) = 2 tau * mean_i CE(q_hat k_hat^T / tau, i)   over the GLOBAL batch of keys

``ctr`` is ``clip_loss(q, k, log(1 / tau), direction="x_to_y")`` (the loss block's ``impl``
and ``block_size``) or, with a ``loss.strategy``, its sharded form over the mesh's data axis,
times ``2 tau``. After each step the key encoder moves towards the query encoder,
``theta_k <- m_t theta_k + (1 - m_t) theta_q``, with ``m_t`` from :func:`momentum_at`
(``m`` from ``m0`` to 1 by a half cosine, the official recipes' ``--moco-m-cos``). Frozen
parameters (``model.frozen``, e.g. ``"encoder/embed"``: the ViT's random patch projection,
[MoCoV3] §4.2) stay equal, bit for bit, in both encoders.

The method's settings are the config's ``moco_v3`` block (:class:`MoCoV3Settings`)::

    config.moco_v3 = {"momentum": 0.99, "momentum_schedule": "cosine", "schedule_steps": 0}

The state it keeps (``extra``, in checkpoints): ``key_params``, ``key_rest`` (a copy of the
model's parameters and BatchNorm statistics; the predictor's entries are carried because
``nnx.merge`` needs the whole graph, but the key encoder never runs them) and
``momentum_step``, the number of momentum updates applied (``t``; a skipped step does not
advance it).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from contrastive_jax.errors import ConfigError
from contrastive_jax.losses import clip_loss
from contrastive_jax.losses.sharded import sharded_clip_loss
from contrastive_jax.training.augmentations import two_views_each
from contrastive_jax.training.augmentations.family import check_recipe_input
from contrastive_jax.training.augmentations.pixels import normalize, unit_range
from contrastive_jax.training.methods.base import (
    LossSettings,
    Method,
    MethodContext,
    example_keys,
)
from contrastive_jax.training.methods.step_metrics import contrastive_top1, first_anchors, mean_norm
from contrastive_jax.training.models.dropout import fold_each
from contrastive_jax.training.models.locked_towers import keep_frozen

SCHEDULES = ("cosine", "constant")


def momentum_at(step, total_steps: int, base: float, schedule: str = "cosine") -> jax.Array:
    """The key encoder's momentum after ``step`` of ``total_steps`` updates (docs/derivations.md
    §10.4; [MoCoV3]'s official recipes): ``"cosine"``,
    ``m_t = 1 - (1 - m0) (cos(pi t / T) + 1) / 2`` (``m0`` at ``t = 0``, ``(1 + m0) / 2`` at
    ``T / 2``, 1 at ``T``; ``t`` past ``T`` stays at 1), or ``"constant"``, ``m_t = m0``.
    ``step`` may be traced; the result is a scalar of the default float dtype (float64 under
    ``jax.enable_x64``)."""
    dtype = jnp.result_type(float)
    base_m = jnp.asarray(base, dtype)
    if schedule == "constant":
        return base_m
    if schedule != "cosine":
        raise ConfigError(f"unknown moco_v3.momentum_schedule {schedule!r}; valid: "
                          f"{list(SCHEDULES)}")
    if total_steps < 1:
        raise ConfigError("moco_v3.momentum_schedule = 'cosine' needs the run's length in "
                          "steps, which num_epochs does not give the method: set "
                          "config.total_steps or config.moco_v3.schedule_steps")
    t = jnp.minimum(jnp.asarray(step, dtype), total_steps)
    return 1 - (1 - base_m) * (jnp.cos(jnp.pi * t / total_steps) + 1) / 2


def contrastive_term(loss: LossSettings, mesh: Mesh, q: jax.Array, k: jax.Array,
                     temperature: float) -> jax.Array:
    """``ctr(q, k) = 2 tau * (1/N) sum_i -log softmax_j(q_hat_i . k_hat_j / tau)_i`` for
    ``q, k (N, d)`` over the global batch ([MoCoV3] Algorithm 1; docs/derivations.md §10.4):
    :func:`~contrastive_jax.losses.clip_loss` in the ``x_to_y`` direction at scale
    ``1 / tau`` (uncapped), with the loss block's ``impl`` and block, or with a
    ``loss.strategy`` :func:`~contrastive_jax.losses.sharded.sharded_clip_loss` over
    ``mesh``. The keys take no gradient in MoCo v3 (they come from the momentum encoder)."""
    log_scale = -math.log(temperature)
    if loss.strategy:
        term = sharded_clip_loss(q, k, log_scale, mesh=mesh, strategy=loss.strategy,
                                 max_scale=math.inf, direction="x_to_y", block_size=loss.block)
    else:
        term = clip_loss(q, k, log_scale, max_scale=math.inf, direction="x_to_y",
                         impl=loss.impl, **loss.tiled_kwargs())
    return 2 * temperature * term


def _views(x: jax.Array, aug_keys: jax.Array, ctx: MethodContext):
    """The two views of :func:`~contrastive_jax.training.augmentations.two_views_each` on
    ``[0, 1]`` pixels, then normalised (the same pair for the query and the key encoder)."""
    v1, v2 = two_views_each(unit_range(x), aug_keys, ctx.augment)
    return normalize(v1, ctx.pixels), normalize(v2, ctx.pixels)


@dataclasses.dataclass(frozen=True)
class MoCoV3Settings:
    """The ``moco_v3`` block of a config: the key encoder's base ``momentum`` m0 in [0, 1],
    its ``momentum_schedule`` (``"cosine"`` from m0 to 1, or ``"constant"``) and
    ``schedule_steps``, the T of the cosine (0: the run's ``total_steps``)."""

    momentum: float = 0.99
    momentum_schedule: str = "cosine"
    schedule_steps: int = 0

    @classmethod
    def from_block(cls, block: Mapping[str, Any] | None) -> MoCoV3Settings:
        """The settings of a ``moco_v3`` block (absent: the defaults); unknown keys and values
        of the wrong kind are a :class:`ConfigError` saying what to change."""
        block = dict(block or {})
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(block) - fields)
        if unknown:
            raise ConfigError(f"unknown moco_v3 settings {unknown}; valid: {sorted(fields)}")
        s = cls(**block)
        m = s.momentum
        if isinstance(m, bool) or not isinstance(m, int | float) or not 0.0 <= m <= 1.0:
            raise ConfigError(f"moco_v3.momentum must be a number in [0, 1] (the paper: 0.99); "
                              f"got {m!r}")
        if s.momentum_schedule not in SCHEDULES:
            raise ConfigError(f"unknown moco_v3.momentum_schedule {s.momentum_schedule!r}; "
                              f"valid: {list(SCHEDULES)}")
        steps = s.schedule_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ConfigError(f"moco_v3.schedule_steps must be an int >= 0 (0: the run's "
                              f"total_steps); got {steps!r}")
        return s


@dataclasses.dataclass(frozen=True)
class MoCoV3(Method):
    """Symmetric ``ctr(q1, k2) + ctr(q2, k1)`` of predicted queries against momentum keys;
    the scheduled momentum update after each step."""

    momentum: float = 0.99
    momentum_schedule: str = "cosine"
    schedule_steps: int = 0  # T of the cosine (from_config: schedule_steps or total_steps)
    name: ClassVar[str] = "moco_v3"
    losses: ClassVar[tuple[str, ...]] = ("moco_v3",)
    settings_block: ClassVar[str] = "moco_v3"

    @classmethod
    def from_config(cls, config, loss_settings) -> MoCoV3:
        """MoCo v3 with the config's ``moco_v3`` block (:class:`MoCoV3Settings`); the cosine's
        ``T`` is ``schedule_steps``, else ``config.total_steps``."""
        s = MoCoV3Settings.from_block(config.get(cls.settings_block))
        return cls(loss_settings=loss_settings, momentum=float(s.momentum),
                   momentum_schedule=s.momentum_schedule,
                   schedule_steps=s.schedule_steps or int(config.get("total_steps", 0)))

    def check(self, config) -> None:
        check_recipe_input(config.get("augment"), config.data.get("preprocess"))
        model, loss = config.model, self.loss_settings
        momentum_at(0, self.schedule_steps, self.momentum, self.momentum_schedule)  # T known
        if model.get("name") != "projected_encoder" or not model.get("predictor"):
            raise ConfigError("moco_v3 trains a projected encoder with a predictor: set "
                              "model.name = 'projected_encoder' and model.predictor (e.g. "
                              "{'hidden': 4096, 'out': 256, 'layers': 2, 'out_batch_norm': "
                              "True})")
        if model.get("learn_temperature"):
            raise ConfigError("moco_v3's loss is scaled by 2 tau, a fixed temperature: set "
                              "model.learn_temperature = False and loss.temperature")
        if loss.positive_ids or loss.direction != "both":
            raise ConfigError("loss.positive_ids and loss.direction do not apply to moco_v3 "
                              "(each query's positive is its example's key from the other "
                              "view, both ways): set loss.positive_ids = '' and "
                              "loss.direction = 'both'")

    def init_extra(self, model, params, rest, config):
        return {"key_params": jax.tree.map(jnp.copy, params),
                "key_rest": jax.tree.map(jnp.copy, rest),
                "momentum_step": jnp.zeros((), jnp.int32)}

    def targets(self, batch, keys, extra, ctx: MethodContext):
        """The momentum encoder's keys of both views (no gradient); its BatchNorm state moves
        (one pass per view)."""
        aug_keys, dropout_keys = example_keys(keys)
        views = _views(batch[ctx.input_key], aug_keys, ctx)
        key_model = nnx.merge(ctx.graphdef, extra["key_params"], extra["key_rest"], copy=True)
        k = [key_model(v, train=True, dropout_keys=fold_each(dropout_keys, 2 + i))[0]
             for i, v in enumerate(views)]
        return ({"k1": jax.lax.stop_gradient(k[0]), "k2": jax.lax.stop_gradient(k[1])},
                {**extra, "key_rest": nnx.state(key_model, nnx.Not(nnx.Param))})

    def embed(self, model, batch, keys, ctx: MethodContext):
        aug_keys, dropout_keys = example_keys(keys)
        rows = {}
        for i, v in enumerate(_views(batch[ctx.input_key], aug_keys, ctx)):
            z, h = model(v, train=True, dropout_keys=fold_each(dropout_keys, i))
            rows[f"q{i + 1}"], rows[f"h{i + 1}"] = model.predict(z, train=True), h
        return rows

    def objective(self, model, rows, targets, batch, extra, ctx: MethodContext):
        tau = ctx.loss.temperature
        q1, q2, k1, k2 = rows["q1"], rows["q2"], targets["k1"], targets["k2"]
        loss = (contrastive_term(ctx.loss, ctx.mesh, q1, k2, tau)
                + contrastive_term(ctx.loss, ctx.mesh, q2, k1, tau))
        n, m = q1.shape[0], first_anchors(q1.shape[0])
        metrics = {
            "top1": contrastive_top1(q1[:m], k2, jnp.arange(m)),
            # each term is 2 tau times an InfoNCE over N keys: log N - L / (4 tau) (§15)
            "mi_bound": math.log(n) - loss / (4 * tau),
            "embedding_norm": mean_norm(jnp.concatenate([q1, q2])),
            "feature_norm": mean_norm(jnp.concatenate([rows["h1"], rows["h2"]])),
            "temperature": jnp.asarray(tau, jnp.float32),
            "momentum": momentum_at(extra["momentum_step"] + 1, self.schedule_steps,
                                    self.momentum, self.momentum_schedule).astype(jnp.float32),
        }
        return loss, metrics, {}

    def after_update(self, extra, params, outputs, ctx):
        """``theta_k <- m_t theta_k + (1 - m_t) theta_q`` with ``t`` the updates so far plus
        one; the frozen parameters (``ctx.frozen``) copied from the query encoder."""
        t = extra["momentum_step"] + 1
        m = momentum_at(t, self.schedule_steps, self.momentum, self.momentum_schedule)
        key = jax.tree.map(lambda k, q: m.astype(k.dtype) * k + (1 - m).astype(k.dtype) * q,
                           extra["key_params"], params)
        return {**extra, "key_params": keep_frozen(key, params, ctx.frozen),
                "momentum_step": t}
