"""An MLP encoder for vectors (the separable critic of the mutual-information experiment)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import jax
from flax import nnx

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models.remat import checkpointed


class MLPEncoder(nnx.Module):
    """``depth`` x (Linear -> ReLU) of width ``hidden``, then Linear to ``features``.

    Input ``(B, in_features)``, output ``(B, features)`` in the compute dtype. Poole et al.
    2019's separable critic uses two of these (2 x 256 ReLU, 32-d embeddings). ``dtype``: the
    compute dtype (:mod:`.precision`); ``remat_policy``: each Linear -> ReLU layer
    rematerialised (:mod:`.remat`; ``None``: off).
    """

    @staticmethod
    def input_shape(settings: Mapping[str, Any], image_size: int | None = None
                    ) -> tuple[int, ...]:
        """One example's input, ``(in_features,)`` (``settings``: the encoder block with its
        defaults, :func:`~contrastive_jax.training.models.with_defaults`)."""
        return (settings["in_features"],)

    def __init__(self, *, in_features: int, hidden: int = 256, depth: int = 2,
                 features: int = 32, dtype=None, remat_policy: str | None = None,
                 rngs: nnx.Rngs):
        dims = [in_features] + [hidden] * depth
        self.layers = nnx.List([nnx.Linear(a, b, dtype=dtype, rngs=rngs)
                                for a, b in itertools.pairwise(dims)])
        self.out = nnx.Linear(dims[-1], features, dtype=dtype, rngs=rngs)
        self.in_features, self.features = in_features, features
        self.remat_policy = remat_policy

    def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
        del train  # no dropout or normalisation
        if x.ndim != 2 or x.shape[1] != self.in_features:
            raise ConfigError(f"MLPEncoder expects (batch, {self.in_features}); got {x.shape}")
        def layer_fn(layer, x):
            return nnx.relu(layer(x))

        step = checkpointed(layer_fn, self.remat_policy)
        for layer in self.layers:
            x = step(layer, x)
        return self.out(x)
