"""ResNets: torchvision's ResNet-18 to -152 with SimCLR's width multiplier, and a small ResNet.

Two layouts, chosen by ``depth``:

- ``depth`` in :data:`DEPTHS` (18, 34, 50, 101, 152): the ImageNet ResNet of [ResNet] in
  torchvision's layout ("v1.5": a bottleneck's stride on its 3x3 convolution, as SimCLR and
  MoCo train it). A 7x7 stride-2 stem convolution, BatchNorm, ReLU, a 3x3 stride-2 max pool,
  four stages of basic (18, 34) or bottleneck (50+) blocks of widths ``64 w, 128 w, 256 w,
  512 w`` (the first block of stages 2-4 strides by 2; a bottleneck's output is 4x its width),
  global average pooling. ``width_multiplier = w`` scales every convolution's channels, the
  stem's included, as SimCLR's ResNet-50 (2x) and (4x) ([SimCLR] §B.9: 94M and 375M
  parameters). Total stride 32: an image needs at least 32 pixels each way. Padding is
  symmetric (torch's ``padding=k // 2``, not XLA's ``"SAME"``, which pads a stride-2 layer on
  one side only), so given torchvision's weights the pooled features equal torchvision's
  ``resnet{depth}`` with ``fc = Identity`` (tests/test_resnet_torchvision.py: float64 and
  float32).
  ``stem="cifar"``: SimCLR's CIFAR-10 variant ([SimCLR] Appendix B.9): a 3x3 stride-1 stem
  convolution and no max pool, total stride 8, for 32 x 32 images.
- ``depth=None``: a small ResNet for 8x8 digits or CIFAR-sized images: a 3x3 stride-1 stem
  without pooling, ``len(widths)`` stages of ``blocks_per_stage`` basic blocks.

``features``: a final linear layer to that many outputs; ``0`` (the ImageNet layout's default)
keeps the pooled features (``512 w`` basic, ``2048 w`` bottleneck), SimCLR's representation h.
``zero_init_residual``: the last BatchNorm scale of every block starts at 0, so each block
starts as the identity (Goyal et al. 2017, torchvision's ``zero_init_residual``; SimCLR and
MoCo's code do not use it, so the templates leave it off). Compute in ``dtype``
(:mod:`..precision`; BatchNorm's statistics are float32); ``remat_policy``: every residual
block rematerialised (:mod:`..remat`), BatchNorm statistics updated once. ``bn_groups = G``:
every BatchNorm normalises each of ``G`` consecutive groups of a training batch by its own
statistics (:mod:`.ghost_batch_norm`: MoCo v1/v2's per-GPU BatchNorm on any number of
devices); 1 (the default): over the whole global batch.

References:
  [ResNet] K. He, X. Zhang, S. Ren, J. Sun, 2016; [SimCLR] Appendix B.9 (wider ResNets);
  docs/references.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models.encoders.ghost_batch_norm import (
    GhostBatchNorm,
    check_groups,
)
from contrastive_jax.training.models.remat import checkpointed

DEPTHS: dict[int, tuple[str, tuple[int, int, int, int]]] = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
    152: ("bottleneck", (3, 8, 36, 3)),
}
"""Block kind and blocks per stage of each ImageNet depth ([ResNet] Table 1)."""
STAGE_WIDTHS = (64, 128, 256, 512)
BOTTLENECK_EXPANSION = 4
TOTAL_STRIDE = 32  # stem 2, max pool 2, stages 2-4 2 each
STEMS = {"imagenet": TOTAL_STRIDE, "cifar": TOTAL_STRIDE // 4}  # stem -> total stride


def _norm(channels: int, dtype, rngs: nnx.Rngs, zero: bool = False,
          groups: int = 1) -> GhostBatchNorm:
    """BatchNorm as torchvision's (eps 1e-5, running averages moved by 0.1 per step), over
    ``groups`` groups of the batch (:mod:`.ghost_batch_norm`; 1: the whole batch)."""
    return GhostBatchNorm(channels, groups=groups, momentum=0.9, epsilon=1e-5, dtype=dtype,
                          rngs=rngs, scale_init=nnx.initializers.zeros if zero else
                          nnx.initializers.ones)


def _conv(cin: int, cout: int, size: int, stride: int, padding, dtype,
          rngs: nnx.Rngs) -> nnx.Conv:
    """A bias-free ``size x size`` convolution; ``padding="torch"`` pads ``size // 2`` on every
    side (torchvision), else XLA's ``"SAME"``."""
    if padding == "torch":
        padding = ((size // 2, size // 2),) * 2
    return nnx.Conv(cin, cout, (size, size), strides=stride, padding=padding, use_bias=False,
                    dtype=dtype, rngs=rngs)


class BasicBlock(nnx.Module):
    """Two 3x3 convolutions with BatchNorm and a (projected) shortcut ([ResNet] Fig. 2 left).

    ``(B, H, W, in_channels)`` -> ``(B, H / stride, W / stride, channels)``; ``padding``:
    ``"torch"`` (symmetric) or ``"SAME"`` (the small ResNet's).
    """

    expansion = 1

    def __init__(self, in_channels: int, channels: int, stride: int, *, padding="SAME",
                 zero_init_residual: bool = False, bn_groups: int = 1, dtype=None,
                 rngs: nnx.Rngs):
        self.conv1 = _conv(in_channels, channels, 3, stride, padding, dtype, rngs)
        self.norm1 = _norm(channels, dtype, rngs, groups=bn_groups)
        self.conv2 = _conv(channels, channels, 3, 1, padding, dtype, rngs)
        self.norm2 = _norm(channels, dtype, rngs, zero=zero_init_residual,
                           groups=bn_groups)
        shortcut = stride != 1 or in_channels != channels
        self.project = _conv(in_channels, channels, 1, stride, "VALID", dtype,
                             rngs) if shortcut else None
        self.project_norm = _norm(channels, dtype, rngs, groups=bn_groups) if shortcut else None

    def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
        h = nnx.relu(self.norm1(self.conv1(x), use_running_average=not train))
        h = self.norm2(self.conv2(h), use_running_average=not train)
        if self.project is not None:
            x = self.project_norm(self.project(x), use_running_average=not train)
        return nnx.relu(h + x)


class Bottleneck(nnx.Module):
    """1x1 (width) -> 3x3 (width, stride) -> 1x1 (4 width) with BatchNorm, and a (projected)
    shortcut ([ResNet] Fig. 5 right; the stride on the 3x3 as torchvision's v1.5).

    ``(B, H, W, in_channels)`` -> ``(B, H / stride, W / stride, 4 width)``.
    """

    expansion = BOTTLENECK_EXPANSION

    def __init__(self, in_channels: int, width: int, stride: int, *,
                 zero_init_residual: bool = False, bn_groups: int = 1, dtype=None,
                 rngs: nnx.Rngs):
        out = width * self.expansion
        self.conv1 = _conv(in_channels, width, 1, 1, "VALID", dtype, rngs)
        self.norm1 = _norm(width, dtype, rngs, groups=bn_groups)
        self.conv2 = _conv(width, width, 3, stride, "torch", dtype, rngs)
        self.norm2 = _norm(width, dtype, rngs, groups=bn_groups)
        self.conv3 = _conv(width, out, 1, 1, "VALID", dtype, rngs)
        self.norm3 = _norm(out, dtype, rngs, zero=zero_init_residual, groups=bn_groups)
        shortcut = stride != 1 or in_channels != out
        self.project = _conv(in_channels, out, 1, stride, "VALID", dtype,
                             rngs) if shortcut else None
        self.project_norm = _norm(out, dtype, rngs, groups=bn_groups) if shortcut else None

    def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
        h = nnx.relu(self.norm1(self.conv1(x), use_running_average=not train))
        h = nnx.relu(self.norm2(self.conv2(h), use_running_average=not train))
        h = self.norm3(self.conv3(h), use_running_average=not train)
        if self.project is not None:
            x = self.project_norm(self.project(x), use_running_average=not train)
        return nnx.relu(h + x)


def check_depth(depth: Any) -> int:
    """``depth`` if it is one of :data:`DEPTHS`, else a :class:`ConfigError` listing them."""
    if isinstance(depth, bool) or depth not in DEPTHS:
        raise ConfigError(f"ResNet depth {depth!r} does not exist; use one of "
                          f"{sorted(DEPTHS)} (or leave depth unset for the small ResNet)")
    return depth


def check_width_multiplier(width: Any) -> int:
    """A positive int ``width_multiplier``, else a :class:`ConfigError` saying what to set."""
    if isinstance(width, bool) or not isinstance(width, int) or width <= 0:
        raise ConfigError(f"ResNet width_multiplier must be an int >= 1 (SimCLR's 1x, 2x, "
                          f"4x); got {width!r}")
    return width


class ResNet(nnx.Module):
    """The ImageNet ResNet of a ``depth`` (torchvision's layout) or the small ResNet
    (``depth=None``); see the module docstring.

    Input ``(B, H, W, in_channels)`` float, output ``(B, features)`` in the compute dtype
    (``features=0``: the pooled last stage, :attr:`features` says its width).
    """

    @staticmethod
    def input_shape(settings: Mapping[str, Any], image_size: int | None = None
                    ) -> tuple[int, ...]:
        """One example's input, ``(image_size, image_size, in_channels)``: a ResNet takes any
        size, so it is the data's (``image_size``, from ``data.preprocess.image_size``); the
        ImageNet layout needs at least :data:`TOTAL_STRIDE` pixels."""
        if not image_size:
            raise ConfigError("a ResNet takes images of any size: set data.preprocess.image_size "
                              "to the size the data gives it")
        stride = STEMS.get(settings.get("stem", "imagenet"), TOTAL_STRIDE)
        if settings.get("depth") is not None and image_size < stride:
            raise ConfigError(f"a ResNet-{settings['depth']} strides its input by "
                              f"{stride}: data.preprocess.image_size = {image_size} is "
                              f"too small; use images of at least {stride} pixels")
        return (image_size, image_size, settings.get("in_channels", 3))

    def __init__(self, *, depth: int | None = None, width_multiplier: int = 1,
                 stem: str = "imagenet", in_channels: int = 3,
                 widths: Sequence[int] = (32, 64, 128),
                 blocks_per_stage: int = 1, features: int | None = None,
                 zero_init_residual: bool = False, bn_groups: int = 1, dtype=None,
                 remat_policy: str | None = None, rngs: nnx.Rngs):
        if stem not in STEMS:
            raise ConfigError(f"ResNet stem must be one of {list(STEMS)}; got {stem!r}")
        self.in_channels, self.depth, self.stem_kind = in_channels, depth, stem
        self.bn_groups = check_groups(bn_groups)
        self.remat_policy = remat_policy
        if depth is None:
            if width_multiplier != 1 or stem != "imagenet":
                raise ConfigError("width_multiplier and stem apply to the ImageNet ResNet: set "
                                  f"depth (one of {sorted(DEPTHS)}) or scale widths instead")
            self._small(widths, blocks_per_stage, zero_init_residual, dtype, rngs)
        else:
            self._imagenet(check_depth(depth), check_width_multiplier(width_multiplier),
                           zero_init_residual, dtype, rngs)
        width = self.pooled_features
        if features is None:
            features = 0 if depth is not None else 128
        self.out = nnx.Linear(width, features, dtype=dtype, rngs=rngs) if features else None
        self.features = features or width

    def _small(self, widths, blocks_per_stage, zero_init_residual, dtype, rngs):
        self.stem = nnx.Conv(self.in_channels, widths[0], (3, 3), use_bias=False, dtype=dtype,
                             rngs=rngs)
        self.stem_norm = _norm(widths[0], dtype, rngs, groups=self.bn_groups)
        blocks, width = [], widths[0]
        for stage, w in enumerate(widths):
            for b in range(blocks_per_stage):
                stride = 2 if stage > 0 and b == 0 else 1
                blocks.append(BasicBlock(width, w, stride, zero_init_residual=zero_init_residual,
                                         bn_groups=self.bn_groups, dtype=dtype, rngs=rngs))
                width = w
        self.blocks = nnx.List(blocks)
        self.pooled_features = width

    def _imagenet(self, depth, multiplier, zero_init_residual, dtype, rngs):
        kind, counts = DEPTHS[depth]
        width = 64 * multiplier
        self.stem = (_conv(self.in_channels, width, 7, 2, "torch", dtype, rngs)
                     if self.stem_kind == "imagenet" else
                     _conv(self.in_channels, width, 3, 1, "torch", dtype, rngs))
        self.stem_norm = _norm(width, dtype, rngs, groups=self.bn_groups)
        blocks = []
        for stage, (base, count) in enumerate(zip(STAGE_WIDTHS, counts, strict=True)):
            w = base * multiplier
            for b in range(count):
                stride = 2 if stage > 0 and b == 0 else 1
                if kind == "basic":
                    block = BasicBlock(width, w, stride, padding="torch", dtype=dtype,
                                       zero_init_residual=zero_init_residual,
                                       bn_groups=self.bn_groups, rngs=rngs)
                else:
                    block = Bottleneck(width, w, stride, dtype=dtype,
                                       zero_init_residual=zero_init_residual,
                                       bn_groups=self.bn_groups, rngs=rngs)
                blocks.append(block)
                width = w * block.expansion
        self.blocks = nnx.List(blocks)
        self.pooled_features = width

    def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
        if x.ndim != 4 or x.shape[-1] != self.in_channels:
            raise ConfigError(f"ResNet expects (batch, height, width, {self.in_channels}) "
                              f"images; got shape {x.shape}")
        stride = STEMS[self.stem_kind]
        if self.depth is not None and min(x.shape[1:3]) < stride:
            raise ConfigError(f"a ResNet-{self.depth} strides its input by {stride}: "
                              f"images of {x.shape[1]}x{x.shape[2]} are too small; use at "
                              f"least {stride} pixels each way")
        x = nnx.relu(self.stem_norm(self.stem(x), use_running_average=not train))
        if self.depth is not None and self.stem_kind == "imagenet":
            x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))

        def block_fn(block, x):
            return block(x, train=train)

        step = checkpointed(block_fn, self.remat_policy)
        for block in self.blocks:
            x = step(block, x)
        x = jnp.mean(x, axis=(1, 2))
        return x if self.out is None else self.out(x)
