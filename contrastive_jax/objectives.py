"""Training objectives: model outputs on a batch -> (loss, metrics), one function per method.

The ``loss`` block of a config::

    name         "nt_xent" (SimCLR) | "moco" | "clip" | "siglip"
    temperature  fixed tau for nt_xent and moco (a learnable one: model.learn_temperature)
    impl         single-device loss: "tiled" | "analytic" | "autodiff" (see clip_loss / nt_xent)
    strategy     "" (the single-device loss on the global arrays, partitioned by XLA) or a
                 sharded strategy: "all_gather" | "all_gather_no_grad" | "ring" (shard_map over
                 the mesh's data axis; exact negatives across devices, contrastive_jax.sharding)
    block_size   tile rows for tiled and sharded losses (0: the default)
    max_scale    cap on the logit scale, 100 (000 P8); ``float("inf")`` removes the cap (the
                 ablation of 000 P8: nothing then stops a winning model from sharpening)
    normalize    nt_xent only: False drops the L2 normalisation (dot-product logits z_i.z_j / tau,
                 SimCLR Table 5's "no l2 norm"; 000 P10); needs impl "autodiff" and no strategy
    direction    clip only: "both" (symmetric, 001) | "x_to_y" | "y_to_x" (one-directional
                 InfoNCE, the mutual-information estimator of 002 A.12.10)

Every objective also reports the mutual-information lower bound ``log N - L`` with ``N`` the
candidates per anchor (002 A.12.10; for MoCo's queue this is not a bound, 002 A.12.4), the
contrastive top-1 on the first anchors, and the mean norm of the embeddings before
normalisation (000 P7, P10).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from contrastive_jax.augmentations import augment, two_views
from contrastive_jax.losses import clip_loss, moco_infonce, nt_xent
from contrastive_jax.losses.siglip import siglip_loss
from contrastive_jax.losses.temperature import logit_scale
from contrastive_jax.metrics import contrastive_top1, first_anchors, mean_norm
from contrastive_jax.sharding import STRATEGIES, sharded_clip_loss, sharded_nt_xent

OBJECTIVES = ("nt_xent", "moco", "clip", "siglip")
IMPLS = ("tiled", "analytic", "autodiff")


@dataclasses.dataclass(frozen=True)
class LossSettings:
    """The ``loss`` block, checked."""

    name: str = "nt_xent"
    temperature: float = 0.1
    impl: str = "tiled"
    strategy: str = ""
    block_size: int = 0
    max_scale: float = 100.0
    direction: str = "both"
    normalize: bool = True

    def __post_init__(self):
        if self.name not in OBJECTIVES:
            raise ValueError(f"unknown loss {self.name!r}; valid: {list(OBJECTIVES)}")
        if self.impl not in IMPLS:
            raise ValueError(f"unknown loss.impl {self.impl!r}; valid: {list(IMPLS)}")
        if self.strategy and self.strategy not in STRATEGIES:
            raise ValueError(f"unknown loss.strategy {self.strategy!r}; valid: '' or "
                             f"{list(STRATEGIES)}")
        if self.strategy and self.name not in ("nt_xent", "clip"):
            raise ValueError(f"loss.strategy applies to nt_xent and clip; {self.name} runs on "
                             "the global arrays (set loss.strategy = '')")
        if not self.normalize and (self.name != "nt_xent" or self.impl != "autodiff"
                                   or self.strategy):
            raise ValueError("loss.normalize = False (dot-product logits) is an nt_xent ablation "
                             "implemented by impl='autodiff' without a strategy; got "
                             f"name={self.name!r}, impl={self.impl!r}, "
                             f"strategy={self.strategy!r} (set loss.impl = 'autodiff' and "
                             "loss.strategy = '')")
        if not self.max_scale > 0:
            raise ValueError(f"loss.max_scale must be > 0 (inf: no cap); got {self.max_scale}")
        if not self.temperature > 0:
            raise ValueError(f"loss.temperature must be > 0; got {self.temperature}")

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> LossSettings:
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(config) - fields)
        if unknown:
            raise ValueError(f"unknown loss settings {unknown}; valid: {sorted(fields)}")
        return cls(**dict(config))


@dataclasses.dataclass(frozen=True)
class Context:
    """What an objective needs besides the model and the batch (all static under jit)."""

    loss: LossSettings
    mesh: Mesh
    input_key: str
    text_key: str
    augment: Any  # a frozen augmentation config, or None
    graphdef: Any = None  # MoCo: to rebuild the key encoder


def _block(loss: LossSettings) -> int | None:
    return loss.block_size or None


def _temperature(model, loss: LossSettings):
    """A learnable SimCLR/MoCo temperature ``1 / min(exp(log_scale), max_scale)``, or fixed."""
    if getattr(model, "log_scale", None) is not None:
        return 1.0 / logit_scale(model.log_scale[...], loss.max_scale)
    return loss.temperature


def nt_xent_objective(model, batch, rng, extras, ctx: Context):
    """SimCLR (004): two views of each example through one encoder + head, NT-Xent on 2N."""
    x = batch[ctx.input_key]
    aug_key, dropout_key = jax.random.split(rng)
    v1, v2 = two_views(x, aug_key, ctx.augment)
    z, h = model(jnp.concatenate([v1, v2]), train=True, rngs=nnx.Rngs(dropout=dropout_key))
    n = x.shape[0]
    z1, z2 = z[:n], z[n:]
    tau = _temperature(model, ctx.loss)
    if ctx.loss.strategy:
        loss = sharded_nt_xent(z1, z2, tau, mesh=ctx.mesh, strategy=ctx.loss.strategy,
                               block_size=_block(ctx.loss))
    else:
        loss = nt_xent(z1, z2, tau, impl=ctx.loss.impl, normalize=ctx.loss.normalize,
                       **({"block_size": _block(ctx.loss)} if ctx.loss.impl == "tiled" else {}))
    m = first_anchors(n)
    anchors = jnp.arange(m)
    metrics = {
        "top1": contrastive_top1(z1[:m], z, anchors + n, exclude=anchors,
                                 normalize=ctx.loss.normalize),
        "mi_bound": math.log(2 * n - 1) - loss,
        "embedding_norm": mean_norm(z),
        "feature_norm": mean_norm(h),
        "temperature": jnp.asarray(tau, jnp.float32),
    }
    return loss, metrics, {}


def moco_objective(model, batch, rng, extras, ctx: Context):
    """MoCo (004): queries from view 1, momentum keys from view 2, the queue as negatives."""
    x = batch[ctx.input_key]
    aug_key, dropout_key = jax.random.split(rng)
    v1, v2 = two_views(x, aug_key, ctx.augment)
    q, h = model(v1, train=True, rngs=nnx.Rngs(dropout=dropout_key))
    key_model = nnx.merge(ctx.graphdef, extras["key_params"], extras["key_rest"], copy=True)
    k, _ = key_model(v2, train=True, rngs=nnx.Rngs(dropout=dropout_key))
    k = jax.lax.stop_gradient(k)
    tau = _temperature(model, ctx.loss)
    loss = moco_infonce(q, k, extras["queue"], tau)
    m = first_anchors(x.shape[0])
    candidates = jnp.concatenate([k[:m], extras["queue"]])
    metrics = {
        "top1": contrastive_top1(q[:m], candidates, jnp.arange(m)),
        "mi_bound": math.log(extras["queue"].shape[0] + 1) - loss,
        "embedding_norm": mean_norm(q),
        "feature_norm": mean_norm(h),
        "temperature": jnp.asarray(tau, jnp.float32),
    }
    outputs = {"keys": k, "key_rest": nnx.state(key_model, nnx.Not(nnx.Param))}
    return loss, metrics, outputs


def clip_objective(model, batch, rng, extras, ctx: Context):
    """CLIP (001) or SigLIP: sample tower vs text tower on the paired batch."""
    sample, tokens = batch[ctx.input_key], batch[ctx.text_key]
    aug_key, dropout_key = jax.random.split(rng)
    if ctx.augment is not None:
        sample = augment(sample, aug_key, ctx.augment)
    x, y = model(sample, tokens, train=True, rngs=nnx.Rngs(dropout=dropout_key))
    log_scale = model.log_scale[...]
    if ctx.loss.name == "siglip":
        loss = siglip_loss(x, y, log_scale, model.bias[...], max_scale=ctx.loss.max_scale)
    elif ctx.loss.strategy:
        loss = sharded_clip_loss(x, y, log_scale, mesh=ctx.mesh, strategy=ctx.loss.strategy,
                                 max_scale=ctx.loss.max_scale, direction=ctx.loss.direction,
                                 block_size=_block(ctx.loss))
    else:
        loss = clip_loss(x, y, log_scale, max_scale=ctx.loss.max_scale, impl=ctx.loss.impl,
                         direction=ctx.loss.direction,
                         **({"block_size": _block(ctx.loss)} if ctx.loss.impl == "tiled" else {}))
    n = x.shape[0]
    m = first_anchors(n)
    metrics = {
        "top1": contrastive_top1(x[:m], y, jnp.arange(m)),
        "mi_bound": math.log(n) - loss,
        "embedding_norm": 0.5 * (mean_norm(x) + mean_norm(y)),
        "logit_scale": logit_scale(log_scale, ctx.loss.max_scale),
    }
    return loss, metrics, {}


def objective_for(name: str):
    return {"nt_xent": nt_xent_objective, "moco": moco_objective, "clip": clip_objective,
            "siglip": clip_objective}[name]
