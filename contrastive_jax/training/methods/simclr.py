"""SimCLR: two augmented views through one encoder and head, NT-Xent over the 2N views.

[SimCLR] (docs/references.md); the loss is :func:`contrastive_jax.losses.nt_xent`
(docs/derivations.md, NT-Xent), or its sharded form for a ``loss.strategy``
(:meth:`~contrastive_jax.training.methods.base.LossSettings.nt_xent_on`).
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from contrastive_jax.training.augmentations import two_views_each
from contrastive_jax.training.augmentations.family import check_recipe_input
from contrastive_jax.training.augmentations.pixels import normalize, unit_range
from contrastive_jax.training.methods.base import (
    Method,
    MethodContext,
    example_keys,
    temperature_of,
)
from contrastive_jax.training.methods.step_metrics import contrastive_top1, first_anchors, mean_norm
from contrastive_jax.training.models.dropout import fold_each


class SimCLR(Method):
    """NT-Xent on ``[z1; z2]``; reports top-1, ``log(2N - 1) - L`` and the embedding norms."""

    name = "simclr"
    losses = ("nt_xent",)

    def check(self, config) -> None:
        """An augment recipe's views must be the ones the data block crops
        (:func:`~contrastive_jax.training.augmentations.family.check_recipe_input`)."""
        check_recipe_input(config.get("augment"), config.data.get("preprocess"))

    def embed(self, model, batch, keys, ctx: MethodContext):
        aug_keys, dropout_keys = example_keys(keys)
        v1, v2 = two_views_each(unit_range(batch[ctx.input_key]), aug_keys, ctx.augment)
        v1, v2 = normalize(v1, ctx.pixels), normalize(v2, ctx.pixels)
        n = v1.shape[0]
        z, h = model(jnp.concatenate([v1, v2]), train=True,
                     dropout_keys=jnp.concatenate([fold_each(dropout_keys, 0),
                                                   fold_each(dropout_keys, 1)]))
        return {"z1": z[:n], "z2": z[n:], "h1": h[:n], "h2": h[n:]}

    def objective(self, model, rows, targets, batch, extra, ctx: MethodContext):
        z1, z2 = rows["z1"], rows["z2"]
        n = z1.shape[0]
        tau, ids = temperature_of(model, ctx.loss), ctx.loss.ids(batch)
        loss = ctx.loss.nt_xent_on(ctx.mesh, z1, z2, tau, ids)
        z = jnp.concatenate([z1, z2])
        m = first_anchors(n)
        anchors = jnp.arange(m)
        by_id = {} if ids is None else {"anchor_ids": ids[:m],
                                        "candidate_ids": jnp.concatenate([ids, ids])}
        metrics = {
            "top1": contrastive_top1(z1[:m], z, anchors + n, exclude=anchors,
                                     normalize=ctx.loss.normalize, **by_id),
            "embedding_norm": mean_norm(z),
            "feature_norm": mean_norm(jnp.concatenate([rows["h1"], rows["h2"]])),
            "temperature": jnp.asarray(tau, jnp.float32),
        }
        if ids is None:  # log(2N-1) - L bounds MI only with one positive per anchor
            metrics["mi_bound"] = math.log(2 * n - 1) - loss
        return loss, metrics, {}
