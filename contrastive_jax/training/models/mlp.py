"""An MLP encoder for vectors (the separable critic of the mutual-information experiment)."""

from __future__ import annotations

import itertools

import jax
from flax import nnx

from contrastive_jax.errors import ConfigError


class MLPEncoder(nnx.Module):
    """``depth`` x (Linear -> ReLU) of width ``hidden``, then Linear to ``features``.

    Input ``(B, in_features)``, output ``(B, features)``. Poole et al. 2019's separable critic
    uses two of these (2 x 256 ReLU, 32-d embeddings).
    """

    def __init__(self, *, in_features: int, hidden: int = 256, depth: int = 2,
                 features: int = 32, rngs: nnx.Rngs):
        dims = [in_features] + [hidden] * depth
        self.layers = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in itertools.pairwise(dims)])
        self.out = nnx.Linear(dims[-1], features, rngs=rngs)
        self.in_features, self.features = in_features, features

    def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
        del train  # no dropout or normalisation
        if x.ndim != 2 or x.shape[1] != self.in_features:
            raise ConfigError(f"MLPEncoder expects (batch, {self.in_features}); got {x.shape}")
        for layer in self.layers:
            x = nnx.relu(layer(x))
        return self.out(x)
