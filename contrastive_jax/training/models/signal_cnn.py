"""A 1-D convolutional encoder for signals such as MNIST-1D."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from contrastive_jax.errors import ConfigError


class SignalCNN(nnx.Module):
    """Conv1D -> BatchNorm -> ReLU blocks, then flatten (or average-pool) and a linear layer.

    Input ``(B, L, C)`` float, output ``(B, features)``. Block ``i`` has ``channels[i]``
    filters of width ``kernel_sizes[i]`` and stride ``strides[i]`` ('SAME' padding).
    ``pool="mean"`` averages over positions (translation invariant: right for MNIST-1D, whose
    generator translates each digit circularly, so absolute position is a nuisance);
    ``"flatten"`` keeps them. BatchNorm statistics are
    over the whole global batch when the step runs under ``jit`` on a mesh (SimCLR's global
    BN, [SimCLR] §2.2; docs/derivations.md §9.6).
    """

    def __init__(self, *, length: int, in_channels: int = 1,
                 channels: Sequence[int] = (64, 128, 128), kernel_sizes: Sequence[int] = (5, 3, 3),
                 strides: Sequence[int] = (2, 2, 1), features: int = 256, pool: str = "flatten",
                 rngs: nnx.Rngs):
        if not len(channels) == len(kernel_sizes) == len(strides):
            raise ConfigError("channels, kernel_sizes and strides need one entry per block; got "
                             f"{len(channels)}, {len(kernel_sizes)}, {len(strides)}")
        if pool not in ("flatten", "mean"):
            raise ConfigError(f"pool must be 'flatten' or 'mean'; got {pool!r}")
        convs, norms, size, width = [], [], length, in_channels
        for c, k, s in zip(channels, kernel_sizes, strides, strict=True):
            convs.append(nnx.Conv(width, c, (k,), strides=(s,), use_bias=False, rngs=rngs))
            norms.append(nnx.BatchNorm(c, momentum=0.9, rngs=rngs))
            size, width = -(-size // s), c
        self.convs, self.norms = nnx.List(convs), nnx.List(norms)
        self.pool, self.length, self.in_channels = pool, length, in_channels
        flat = size * width if pool == "flatten" else width
        self.out = nnx.Linear(flat, features, rngs=rngs)
        self.features = features

    def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
        if x.ndim != 3 or x.shape[1:] != (self.length, self.in_channels):
            raise ConfigError(f"SignalCNN expects (batch, {self.length}, {self.in_channels}) "
                             f"signals; got shape {x.shape}")
        for conv, norm in zip(self.convs, self.norms, strict=True):
            x = nnx.relu(norm(conv(x), use_running_average=not train))
        x = x.reshape(x.shape[0], -1) if self.pool == "flatten" else jnp.mean(x, axis=1)
        return self.out(x)
