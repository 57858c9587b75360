"""A 1-D convolutional encoder for signals such as MNIST-1D."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models.remat import checkpointed


class SignalCNN(nnx.Module):
    """Conv1D -> BatchNorm -> ReLU blocks, then flatten (or average-pool) and a linear layer.

    Input ``(B, L, C)`` float, output ``(B, features)``. Block ``i`` has ``channels[i]``
    filters of width ``kernel_sizes[i]`` and stride ``strides[i]`` ('SAME' padding).
    ``pool="mean"`` averages over positions (translation invariant: right for MNIST-1D, whose
    generator translates each digit circularly, so absolute position is a nuisance);
    ``"flatten"`` keeps them. BatchNorm statistics are
    over the whole global batch when the step runs under ``jit`` on a mesh (SimCLR's global
    BN, [SimCLR] §2.2; docs/derivations.md §9.6). ``dtype``: the compute dtype
    (:mod:`.precision`; BatchNorm's statistics stay float32), output in that dtype;
    ``remat_policy``: each Conv -> BatchNorm -> ReLU block rematerialised (:mod:`.remat`;
    ``None``: off).
    """

    @staticmethod
    def input_shape(settings: Mapping[str, Any], image_size: int | None = None
                    ) -> tuple[int, ...]:
        """One example's input, ``(length, in_channels)``."""
        return (settings["length"], settings["in_channels"])

    def __init__(self, *, length: int, in_channels: int = 1,
                 channels: Sequence[int] = (64, 128, 128), kernel_sizes: Sequence[int] = (5, 3, 3),
                 strides: Sequence[int] = (2, 2, 1), features: int = 256, pool: str = "flatten",
                 dtype=None, remat_policy: str | None = None, rngs: nnx.Rngs):
        if not len(channels) == len(kernel_sizes) == len(strides):
            raise ConfigError("channels, kernel_sizes and strides need one entry per block; got "
                             f"{len(channels)}, {len(kernel_sizes)}, {len(strides)}")
        if pool not in ("flatten", "mean"):
            raise ConfigError(f"pool must be 'flatten' or 'mean'; got {pool!r}")
        convs, norms, size, width = [], [], length, in_channels
        for c, k, s in zip(channels, kernel_sizes, strides, strict=True):
            convs.append(nnx.Conv(width, c, (k,), strides=(s,), use_bias=False, dtype=dtype,
                                  rngs=rngs))
            norms.append(nnx.BatchNorm(c, momentum=0.9, dtype=dtype, rngs=rngs))
            size, width = -(-size // s), c
        self.convs, self.norms = nnx.List(convs), nnx.List(norms)
        self.pool, self.length, self.in_channels = pool, length, in_channels
        flat = size * width if pool == "flatten" else width
        self.out = nnx.Linear(flat, features, dtype=dtype, rngs=rngs)
        self.features, self.remat_policy = features, remat_policy

    def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
        if x.ndim != 3 or x.shape[1:] != (self.length, self.in_channels):
            raise ConfigError(f"SignalCNN expects (batch, {self.length}, {self.in_channels}) "
                             f"signals; got shape {x.shape}")
        def block_fn(conv, norm, x):
            return nnx.relu(norm(conv(x), use_running_average=not train))

        step = checkpointed(block_fn, self.remat_policy)
        for conv, norm in zip(self.convs, self.norms, strict=True):
            x = step(conv, norm, x)
        x = x.reshape(x.shape[0], -1) if self.pool == "flatten" else jnp.mean(x, axis=1)
        return self.out(x)
