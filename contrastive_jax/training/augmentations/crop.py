"""The random resized crop on the device: torchvision's box sampler and a bilinear resize of
the box to a fixed output size (which may differ from the input's).

SimCLR's crop ([SimCLR] Appendix A; torchvision's ``RandomResizedCrop``, which MoCo v2 and v3
use): a box of area fraction ``~ U(scale)`` of the image and aspect ratio (width / height)
``~ logU(ratio)``, at a uniform position, resized to ``size x size``. On the host
:func:`contrastive_jax.training.data.image_crops.crop_box` draws the same box from a NumPy
generator; here :func:`torchvision_crop_box` draws it from ``U[0, 1)`` numbers, so that it runs
per example under ``vmap``: torchvision's ten tries are drawn at once and the first box that
fits is kept (else torchvision's fallback, the centred box of the clamped ratio), which gives
the same distribution as its loop.

The resize reads the box at output pixel centres, ``top + (i + 0.5) h / size - 0.5`` (as PIL's
``resize(box=...)`` and :func:`~contrastive_jax.training.augmentations.image.
resized_crop_image`), by linear interpolation with edge clamping, written as two matrix
products (``size x H`` and ``size x W`` interpolation weights) rather than gathers. Unlike PIL
it does not widen the filter when it shrinks: it is meant for boxes at most about the output's
size, e.g. crops of an image the host decoded to 256 x 256 (``224 / 256``). Images are
``(H, W, C)`` floats in ``[0, 1]``, as in :mod:`~contrastive_jax.training.augmentations.image`.

References:
  [SimCLR] Appendix A (random crop and resize: area 0.08-1, aspect 3/4-4/3).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from contrastive_jax.training.augmentations.signal import uniform_integer, uniforms

Array = jax.Array

TRIES = 10
"""torchvision's tries at a box that fits before its fallback."""
DRAWS = 2 * TRIES + 2
"""``U[0, 1)`` numbers one box takes: an area and a log ratio per try, then the position."""


def torchvision_crop_box(u: Array, height: int, width: int, scale: tuple[float, float],
                         ratio: tuple[float, float]) -> Array:
    """torchvision's ``RandomResizedCrop.get_params`` from ``u``, ``(DRAWS,)`` ``U[0, 1)``.

    Try ``t`` (0..9): area ``A_t = H W (scale_0 + (scale_1 - scale_0) u[t])``, aspect
    ``a_t = exp(log r_0 + (log r_1 - log r_0) u[10 + t])``, box ``w = round(sqrt(A_t a_t))``,
    ``h = round(sqrt(A_t / a_t))`` (half to even, as Python's ``round``); the first try with
    ``0 < w <= W`` and ``0 < h <= H`` is placed at ``top ~ U{0..H - h}`` (``u[20]``),
    ``left ~ U{0..W - w}`` (``u[21]``). No try fits: the whole image cut to the nearest
    allowed ratio, centred.

    Returns:
      ``(4,)`` int32 ``(top, left, h, w)`` in pixels.
    """
    area = height * width
    target = area * (scale[0] + (scale[1] - scale[0]) * u[:TRIES])
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = jnp.exp(log_lo + (log_hi - log_lo) * u[TRIES:2 * TRIES])
    w = jnp.round(jnp.sqrt(target * aspect)).astype(jnp.int32)
    h = jnp.round(jnp.sqrt(target / aspect)).astype(jnp.int32)
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = jnp.argmax(fits)
    in_ratio = width / height
    if in_ratio < ratio[0]:
        fw, fh = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        fw, fh = round(height * ratio[1]), height
    else:
        fw, fh = width, height
    found = jnp.any(fits)
    bw = jnp.where(found, w[first], fw)
    bh = jnp.where(found, h[first], fh)
    top = jnp.where(found, uniform_integer(u[2 * TRIES], 0, height - bh), (height - fh) // 2)
    left = jnp.where(found, uniform_integer(u[2 * TRIES + 1], 0, width - bw), (width - fw) // 2)
    return jnp.stack([top, left, bh, bw]).astype(jnp.int32)


def interpolation_weights(start: Array, extent: Array, size: int, n: int, dtype) -> Array:
    """``(size, n)`` linear-interpolation weights that read ``[start, start + extent)`` of a
    length-``n`` axis at ``size`` output pixel centres.

    Row ``i`` reads position ``p_i = start + (i + 0.5) extent / size - 0.5``, clipped to
    ``[0, n - 1]`` (edges replicated): weight ``max(0, 1 - |p_i - k|)`` on sample ``k``, so
    each row sums to 1 and an integer ``p_i`` reads one sample exactly.
    """
    p = start + (jnp.arange(size, dtype=dtype) + 0.5) * (extent / size) - 0.5
    p = jnp.clip(p, 0, n - 1)
    return jnp.maximum(0, 1 - jnp.abs(p[:, None] - jnp.arange(n, dtype=dtype)[None, :]))


def resize_box(x: Array, box: Array, size: int) -> Array:
    """The box ``(top, left, h, w)`` of ``x (H, W, C)`` resized to ``(size, size, C)``,
    bilinear at pixel centres (:func:`interpolation_weights` along each axis: ``R x C^T``).

    With ``size == H == W`` and a box of fractional size it is
    :func:`~contrastive_jax.training.augmentations.image.resized_crop_image`; the whole image
    at its own size is the identity. Weights are convex, so values stay in ``[min x, max x]``
    (clipped to ``[0, 1]`` against rounding). The products run at the backend's default
    matmul precision (on a TPU, one bfloat16 pass).
    """
    h, w = x.shape[:2]
    box = box.astype(x.dtype)
    rows = interpolation_weights(box[0], box[2], size, h, x.dtype)
    cols = interpolation_weights(box[1], box[3], size, w, x.dtype)
    y = jnp.einsum("ih,hwc->iwc", rows, x)
    y = jnp.einsum("jw,iwc->ijc", cols, y)
    return jnp.clip(y, 0, 1).astype(x.dtype)


def random_resized_crop_to(x: Array, key: Array, size: int, scale: tuple[float, float],
                           ratio: tuple[float, float]) -> Array:
    """``(size, size, C)``: the box of :func:`torchvision_crop_box` (drawn on ``x``'s height
    and width from ``key``) resized by :func:`resize_box`."""
    h, w = x.shape[:2]
    box = torchvision_crop_box(uniforms(key, DRAWS), h, w, scale, ratio)
    return resize_box(x, box, size)
