"""MLP projection heads (SimCLR's g, [SimCLR] §4.2, docs/derivations.md §9.1 step 2: used for the
loss, discarded for evaluation); MoCo v3's projector and predictor ([MoCoV3] §5;
docs/derivations.md §10.4) are the same module with ``out_batch_norm=True``."""

from __future__ import annotations

import itertools

import jax
from flax import nnx

from contrastive_jax.errors import ConfigError


class ProjectionHead(nnx.Module):
    """``layers - 1`` x (Linear -> BatchNorm -> ReLU), then Linear to ``out_features``
    (-> BatchNorm without scale and offset, with ``out_batch_norm``).

    ``layers=1`` is a linear projection (CLIP). Input ``(B, in_features)``, output
    ``(B, out_features)`` in the compute ``dtype`` (:mod:`.precision`; BatchNorm's statistics
    stay float32). A Linear followed by a BatchNorm has no bias (the BatchNorm's mean removes
    it). ``out_batch_norm=True`` normalises the output over the batch with no learned scale or
    offset: MoCo v3's projector and predictor ([MoCoV3] §5: BatchNorm in every layer of both MLPs;
    the official code's ``BatchNorm1d(dim, affine=False)`` after the last Linear, after
    [SimCLR]'s head).
    """

    def __init__(self, in_features: int, hidden: int, out_features: int, *, layers: int = 2,
                 batch_norm: bool = True, out_batch_norm: bool = False, dtype=None,
                 rngs: nnx.Rngs):
        if layers < 1:
            raise ConfigError(f"a projection head needs layers >= 1; got {layers}")
        if not isinstance(out_batch_norm, bool):
            raise ConfigError(f"a projection head's out_batch_norm must be True or False; got "
                              f"{out_batch_norm!r}")
        dims = [in_features] + [hidden] * (layers - 1)
        self.hidden = nnx.List([nnx.Linear(a, b, use_bias=not batch_norm, dtype=dtype,
                                           rngs=rngs)
                                for a, b in itertools.pairwise(dims)])
        self.norms = nnx.List([nnx.BatchNorm(b, momentum=0.9, dtype=dtype, rngs=rngs)
                               if batch_norm else None for b in dims[1:]])
        self.out = nnx.Linear(dims[-1], out_features, use_bias=not out_batch_norm, dtype=dtype,
                              rngs=rngs)
        self.out_norm = (nnx.BatchNorm(out_features, momentum=0.9, use_bias=False,
                                       use_scale=False, dtype=dtype, rngs=rngs)
                         if out_batch_norm else None)
        self.out_features = out_features

    def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
        for linear, norm in zip(self.hidden, self.norms, strict=True):
            x = linear(x)
            if norm is not None:
                x = norm(x, use_running_average=not train)
            x = nnx.relu(x)
        x = self.out(x)
        return x if self.out_norm is None else self.out_norm(x, use_running_average=not train)
