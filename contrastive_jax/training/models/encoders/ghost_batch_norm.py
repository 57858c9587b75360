"""BatchNorm over groups of the batch ("ghost" BatchNorm): each group normalised by its own
statistics, as each GPU's share of the batch is in a per-GPU BatchNorm.

With ``groups = G`` a training batch of ``B`` examples is cut into ``G`` consecutive groups of
``B / G`` and group ``g`` is normalised by its own mean and (biased) variance over its examples
and every non-feature axis::

    y_i = (x_i - mu_g) / sqrt(var_g + eps) * scale + bias        (i in group g)

The running averages move by the groups' mean statistics, ``mean <- m mean + (1 - m) mean_g
mu_g`` and ``var <- m var + (1 - m) mean_g var_g`` (the mean over devices a per-GPU
BatchNorm's replicas would average, as MoCo's single-GPU ``SplitBatchNorm`` does); evaluation
uses them as a plain BatchNorm does. ``G = 1`` is ``nnx.BatchNorm`` itself (the same call).

This is how MoCo v1/v2 ran: 8 GPUs of 32 examples each, the keys' batch shuffled across GPUs
before the key encoder so that a query and its positive key never share a group's statistics
([MoCo] §3.3, "Shuffling BN"; :mod:`~contrastive_jax.training.methods.momentum_contrast`).
Statistics are taken in float32 at least (float64 inputs in float64), the output in the
module's ``dtype`` as ``nnx.BatchNorm``'s; tested against ``nnx.BatchNorm`` run on each group
(tests/test_ghost_batch_norm.py).

References:
  [MoCo] K. He, H. Fan, Y. Wu, S. Xie, R. Girshick 2020, §3.3; E. Hoffer, I. Hubara,
  D. Soudry 2017 ("ghost batch normalization"); docs/references.md.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from contrastive_jax.errors import ConfigError


def check_groups(groups: Any) -> int:
    """A positive int ``groups``, else a :class:`ConfigError` naming the setting."""
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ConfigError(f"bn_groups must be an int >= 1 (1: one BatchNorm over the whole "
                          f"batch); got {groups!r}")
    return groups


class GhostBatchNorm(nnx.BatchNorm):
    """``nnx.BatchNorm`` whose training statistics are taken over ``groups`` consecutive groups
    of the batch (module docstring). Input ``(B, ..., C)`` with ``B`` a multiple of ``groups``;
    the feature axis is the last."""

    def __init__(self, num_features: int, *, groups: int = 1, **kwargs):
        super().__init__(num_features, **kwargs)
        self.groups = check_groups(groups)

    def __call__(self, x: jax.Array, use_running_average: bool | None = None, *,
                 mask: jax.Array | None = None) -> jax.Array:
        if self.groups == 1 or use_running_average or (
                use_running_average is None and self.use_running_average):
            return super().__call__(x, use_running_average, mask=mask)
        if mask is not None:
            raise ValueError("GhostBatchNorm takes no mask")
        if self.axis not in (-1, x.ndim - 1):
            raise ValueError(f"GhostBatchNorm normalises the last axis; got axis {self.axis}")
        batch = x.shape[0]
        if batch % self.groups:
            raise ConfigError(f"a batch of {batch} examples does not split into bn_groups = "
                              f"{self.groups} groups of BatchNorm statistics; make the "
                              "(micro-)batch a multiple of bn_groups or change bn_groups")
        stats_dtype = jnp.promote_types(x.dtype, jnp.float32)
        grouped = x.astype(stats_dtype).reshape(self.groups, batch // self.groups, *x.shape[1:])
        axes = tuple(range(1, grouped.ndim - 1))
        mean = grouped.mean(axis=axes, keepdims=True)
        var = jnp.square(grouped - mean).mean(axis=axes, keepdims=True)
        y = (grouped - mean) * jax.lax.rsqrt(var + self.epsilon)
        if self.scale is not None:
            y = y * self.scale[...].astype(stats_dtype)
        if self.bias is not None:
            y = y + self.bias[...].astype(stats_dtype)
        group_mean = jax.lax.stop_gradient(mean.reshape(self.groups, -1).mean(axis=0))
        group_var = jax.lax.stop_gradient(var.reshape(self.groups, -1).mean(axis=0))
        self.mean[...] = self.momentum * self.mean[...] + (1 - self.momentum) * group_mean
        self.var[...] = self.momentum * self.var[...] + (1 - self.momentum) * group_var
        out_dtype = self.dtype or jnp.promote_types(x.dtype, self.param_dtype)
        return y.reshape(x.shape).astype(out_dtype)
