"""A small ResNet (basic blocks, BatchNorm) for images such as the 8x8 digits or CIFAR."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models.remat import checkpointed


class BasicBlock(nnx.Module):
    """Two 3x3 convolutions with BatchNorm and a (projected) shortcut ([ResNet]).

    ``dtype``: the compute dtype (:mod:`.precision`); BatchNorm's statistics stay float32.
    """

    def __init__(self, in_channels: int, channels: int, stride: int, *, dtype=None,
                 rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(in_channels, channels, (3, 3), strides=stride, use_bias=False,
                              dtype=dtype, rngs=rngs)
        self.norm1 = nnx.BatchNorm(channels, momentum=0.9, dtype=dtype, rngs=rngs)
        self.conv2 = nnx.Conv(channels, channels, (3, 3), use_bias=False, dtype=dtype, rngs=rngs)
        self.norm2 = nnx.BatchNorm(channels, momentum=0.9, dtype=dtype, rngs=rngs)
        shortcut = stride != 1 or in_channels != channels
        self.project = nnx.Conv(in_channels, channels, (1, 1), strides=stride, use_bias=False,
                                dtype=dtype, rngs=rngs) if shortcut else None
        self.project_norm = nnx.BatchNorm(channels, momentum=0.9, dtype=dtype,
                                          rngs=rngs) if shortcut else None

    def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
        h = nnx.relu(self.norm1(self.conv1(x), use_running_average=not train))
        h = self.norm2(self.conv2(h), use_running_average=not train)
        if self.project is not None:
            x = self.project_norm(self.project(x), use_running_average=not train)
        return nnx.relu(h + x)


class ResNet(nnx.Module):
    """Stem 3x3 conv, stages of basic blocks (stride 2 between stages), global average pool.

    Input ``(B, H, W, C)`` float, output ``(B, features)`` in the compute dtype (a final linear
    layer; ``features`` equal to the last width keeps the pooled features). ``dtype``: the
    compute dtype (:mod:`.precision`); ``remat_policy``: each residual block rematerialised
    under that policy (:mod:`.remat`; ``None``: off), its BatchNorm statistics updated once.
    """

    @staticmethod
    def input_shape(settings: Mapping[str, Any], image_size: int | None = None
                    ) -> tuple[int, ...]:
        """One example's input, ``(image_size, image_size, in_channels)``: a ResNet takes any
        size, so it is the data's (``image_size``, from ``data.preprocess.image_size``)."""
        if not image_size:
            raise ConfigError("a ResNet takes images of any size: set data.preprocess.image_size "
                              "to the size the data gives it")
        return (image_size, image_size, settings["in_channels"])

    def __init__(self, *, in_channels: int = 3, widths: Sequence[int] = (32, 64, 128),
                 blocks_per_stage: int = 1, features: int = 128, dtype=None,
                 remat_policy: str | None = None, rngs: nnx.Rngs):
        self.stem = nnx.Conv(in_channels, widths[0], (3, 3), use_bias=False, dtype=dtype,
                             rngs=rngs)
        self.stem_norm = nnx.BatchNorm(widths[0], momentum=0.9, dtype=dtype, rngs=rngs)
        blocks, width = [], widths[0]
        for stage, w in enumerate(widths):
            for b in range(blocks_per_stage):
                stride = 2 if stage > 0 and b == 0 else 1
                blocks.append(BasicBlock(width, w, stride, dtype=dtype, rngs=rngs))
                width = w
        self.blocks = nnx.List(blocks)
        self.out = nnx.Linear(width, features, dtype=dtype, rngs=rngs)
        self.in_channels, self.features = in_channels, features
        self.remat_policy = remat_policy

    def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
        if x.ndim != 4 or x.shape[-1] != self.in_channels:
            raise ConfigError(f"ResNet expects (batch, height, width, {self.in_channels}) "
                             f"images; got shape {x.shape}")
        x = nnx.relu(self.stem_norm(self.stem(x), use_running_average=not train))
        def block_fn(block, x):
            return block(x, train=train)

        step = checkpointed(block_fn, self.remat_policy)
        for block in self.blocks:
            x = step(block, x)
        return self.out(jnp.mean(x, axis=(1, 2)))
