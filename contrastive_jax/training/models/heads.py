"""MLP projection heads (SimCLR's g, [SimCLR] §4.2, docs/derivations.md §9.1 step 2: used for the
loss, discarded for evaluation)."""

from __future__ import annotations

import itertools

import jax
from flax import nnx

from contrastive_jax.errors import ConfigError


class ProjectionHead(nnx.Module):
    """``layers - 1`` x (Linear -> BatchNorm -> ReLU), then Linear to ``out_features``.

    ``layers=1`` is a linear projection (CLIP). Input ``(B, in_features)``, output
    ``(B, out_features)`` in the compute ``dtype`` (:mod:`.precision`; BatchNorm's statistics
    stay float32).
    """

    def __init__(self, in_features: int, hidden: int, out_features: int, *, layers: int = 2,
                 batch_norm: bool = True, dtype=None, rngs: nnx.Rngs):
        if layers < 1:
            raise ConfigError(f"a projection head needs layers >= 1; got {layers}")
        dims = [in_features] + [hidden] * (layers - 1)
        self.hidden = nnx.List([nnx.Linear(a, b, use_bias=not batch_norm, dtype=dtype,
                                           rngs=rngs)
                                for a, b in itertools.pairwise(dims)])
        self.norms = nnx.List([nnx.BatchNorm(b, momentum=0.9, dtype=dtype, rngs=rngs)
                               if batch_norm else None for b in dims[1:]])
        self.out = nnx.Linear(dims[-1], out_features, dtype=dtype, rngs=rngs)
        self.out_features = out_features

    def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
        for linear, norm in zip(self.hidden, self.norms, strict=True):
            x = linear(x)
            if norm is not None:
                x = norm(x, use_running_average=not train)
            x = nnx.relu(x)
        return self.out(x)
