"""CLIP and SigLIP: a sample tower and a text tower on paired examples.

[CLIP], [SigLIP] (docs/references.md). CLIP's loss is :func:`contrastive_jax.losses.clip_loss`
(or its sharded form); SigLIP's is :func:`contrastive_jax.losses.siglip.siglip_loss`, one
binary decision per pair with a learnable bias. Both learn the logit scale. Each calls its loss
once, whatever the mesh (:meth:`~contrastive_jax.training.methods.base.LossSettings.clip_on`,
:meth:`~contrastive_jax.training.methods.base.LossSettings.siglip_on`).
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from contrastive_jax.losses.parts.temperature import logit_scale
from contrastive_jax.training.augmentations import augment_each
from contrastive_jax.training.augmentations.pixels import normalize, unit_range
from contrastive_jax.training.methods.base import Method, MethodContext, example_keys
from contrastive_jax.training.methods.step_metrics import contrastive_top1, first_anchors, mean_norm
from contrastive_jax.training.models.dropout import fold_each
from contrastive_jax.training.models.locked_towers import trains


def _pair_metrics(x, y, log_scale, ids, ctx: MethodContext) -> dict:
    m = first_anchors(x.shape[0])
    by_id = {} if ids is None else {"anchor_ids": ids[:m], "candidate_ids": ids}
    return {
        "top1": contrastive_top1(x[:m], y, jnp.arange(m), **by_id),
        "embedding_norm": 0.5 * (mean_norm(x) + mean_norm(y)),
        "logit_scale": logit_scale(log_scale, ctx.loss.max_scale),
    }


class _PairedTowers(Method):
    """What CLIP and SigLIP share: the rows of a step are the two towers' embeddings."""

    def embed(self, model, batch, keys, ctx: MethodContext) -> dict:
        """``{"x", "y"}``: the two towers' embeddings of the (augmented) samples and the
        captions, as ``model(sample, tokens, train=True)``, except that a frozen tower
        (``ctx.frozen``) runs in inference mode
        (:mod:`contrastive_jax.training.models.locked_towers`)."""
        sample, tokens = unit_range(batch[ctx.input_key]), batch[ctx.text_key]
        aug_keys, dropout_keys = example_keys(keys)
        if ctx.augment is not None:
            sample = augment_each(sample, aug_keys, ctx.augment)
        sample = normalize(sample, ctx.pixels)
        x = model.embed_samples(sample, train=trains("sample_encoder", ctx.frozen),
                                dropout_keys=fold_each(dropout_keys, 0))
        y = model.embed_texts(tokens, train=trains("text_encoder", ctx.frozen),
                              dropout_keys=fold_each(dropout_keys, 1))
        return {"x": x, "y": y}


class CLIP(_PairedTowers):
    """Symmetric (or one-directional) InfoNCE between the towers; reports ``log N - L``."""

    name = "clip"
    losses = ("clip",)

    def objective(self, model, rows, targets, batch, extra, ctx: MethodContext):
        x, y = rows["x"], rows["y"]
        log_scale, ids = model.log_scale[...], ctx.loss.ids(batch)
        loss = ctx.loss.clip_on(ctx.mesh, x, y, log_scale, ids)
        metrics = _pair_metrics(x, y, log_scale, ids, ctx)
        if ids is None:  # with positives by id, log N - L is not the bound (§15.3)
            metrics["mi_bound"] = math.log(x.shape[0]) - loss
        return loss, metrics, {}


class SigLIP(_PairedTowers):
    """The pairwise sigmoid loss; reports the learned bias (no InfoNCE bound applies)."""

    name = "siglip"
    losses = ("siglip",)

    def objective(self, model, rows, targets, batch, extra, ctx: MethodContext):
        x, y = rows["x"], rows["y"]
        log_scale, bias, ids = model.log_scale[...], model.bias[...], ctx.loss.ids(batch)
        loss = ctx.loss.siglip_on(ctx.mesh, x, y, log_scale, bias, ids)
        return loss, {**_pair_metrics(x, y, log_scale, ids, ctx), "bias": bias}, {}
