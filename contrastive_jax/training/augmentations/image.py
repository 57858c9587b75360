"""Random augmentations of one image: SimCLR's family, written for small images too.

An image is a ``(H, W, C)`` float array with values in ``[0, 1]``, channels last, ``C = 1``
(grayscale, e.g. 8x8 digits) or ``C = 3`` (RGB). Every op returns an array of x's shape and
dtype with values clipped to ``[0, 1]``, so images keep their value range whatever the strength.

Every random op has the signature ``op(x, key, strength) -> y`` (one example, one key; the
strength a plain Python float, static under ``jit``). ``strength == 0`` returns ``x`` itself (the
op is skipped: bit-identical), and every op tends to the identity as ``strength -> 0``: the
continuous ops by a change of order ``strength``, the integer ones (shift, cutout) are exactly
the identity once ``strength x size`` rounds to 0, and the probabilistic ones (flip, grayscale)
fire with probability ``strength``. Each random op draws its parameters and hands them to a
deterministic op (:func:`shift_image`, :func:`resized_crop_image`, :func:`rotate`,
:func:`adjust_image_brightness`, ...) that the tests check against NumPy.

Grayscale fallback. Saturation, hue and random grayscale act on colour; on a 1-channel image
they are the identity (it is already its own grayscale), so one config serves both kinds of
image. Brightness and contrast act on either.

:data:`OPS` lists the ops in the order :func:`contrastive_jax.training.augmentations.augment`
applies them,
SimCLR's: crop/shift, flip, rotation, colour (brightness, contrast, saturation, hue, grayscale),
blur, noise, cutout. Geometric ops fill uncovered pixels with 0 (black: the background of digits,
torchvision's default fill).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.scipy.ndimage import map_coordinates

from contrastive_jax.training.augmentations.signal import (
    blur_radius,
    check_strength,
    integer_extent,
    resample,
    uniform_integer,
    uniforms,
)
from contrastive_jax.training.augmentations.signal import blur_signal as blur_axis0

Array = jax.Array

LIMITS: dict[str, tuple[float, bool]] = {
    "resized_crop": (1.0, False),
    "shift": (1.0, True),
    "flip": (1.0, True),
    "rotation": (1.0, True),
    "hue": (0.5, True),
    "grayscale": (1.0, True),
    "cutout": (1.0, True),
}
"""Upper bounds ``(bound, inclusive)`` of the bounded strengths; the others are any ``>= 0``."""

LUMA = (0.299, 0.587, 0.114)
"""ITU-R BT.601 luma weights of R, G, B (as torchvision's and TF's ``rgb_to_grayscale``)."""


def _clip(y: Array, like: Array) -> Array:
    return jnp.clip(y, 0, 1).astype(like.dtype)


# ---------------------------------------------------------------------------------------------
# Deterministic ops: the sampled parameters in, the augmented image out.


def shift_image(x: Array, dy: Array | int, dx: Array | int) -> Array:
    """Translate by whole pixels, zero fill: ``y[i, j] = x[i - dy, j - dx]``, 0 outside.

    Positive ``dy`` moves the content down, positive ``dx`` right (pad-and-crop).
    """
    h, w = x.shape[:2]
    i, j = jnp.arange(h) - dy, jnp.arange(w) - dx
    inside = ((i >= 0) & (i < h))[:, None, None] & ((j >= 0) & (j < w))[None, :, None]
    y = x[jnp.clip(i, 0, h - 1)][:, jnp.clip(j, 0, w - 1)]
    return _clip(jnp.where(inside, y, 0), x)


def resized_crop_image(
    x: Array, top: Array | float, left: Array | float, height: Array | float, width: Array | float
) -> Array:
    """Crop the box ``[top, top + height) x [left, left + width)`` and resize it back bilinearly.

    Output pixel ``(i, j)`` reads the box at ``(top + (i + 0.5) height / H - 0.5,
    left + (j + 0.5) width / W - 0.5)`` (pixel centres, as ``jax.image.resize``), separable
    linear interpolation with edge clamping; the full box is the identity. Bilinear weights are
    convex, so values stay within the input's ``[min, max]``.
    """
    h, w = x.shape[:2]
    rows = top + (jnp.arange(h, dtype=x.dtype) + 0.5) * (height / h) - 0.5
    cols = left + (jnp.arange(w, dtype=x.dtype) + 0.5) * (width / w) - 0.5
    y = resample(x, rows)
    y = jnp.swapaxes(resample(jnp.swapaxes(y, 0, 1), cols), 0, 1)
    return _clip(y, x)


def rotate(x: Array, angle: Array | float) -> Array:
    """Rotate by ``angle`` radians counter-clockwise about the centre, bilinear, zero fill.

    Counter-clockwise as displayed (row 0 at the top), so ``angle = pi / 2`` is ``np.rot90``. With
    ``c = ((H - 1) / 2, (W - 1) / 2)``, output pixel ``(i, j)`` reads the input at
    ``c + R (i - c_0, j - c_1)``, ``R = [[cos a, sin a], [-sin a, cos a]]``, by
    ``jax.scipy.ndimage.map_coordinates(order=1, mode="constant", cval=0)``; ``angle = 0`` reads
    every pixel at its own integer position, the identity.
    """
    h, w = x.shape[:2]
    ci, cj = (h - 1) / 2, (w - 1) / 2
    di = (jnp.arange(h, dtype=x.dtype) - ci)[:, None]
    dj = (jnp.arange(w, dtype=x.dtype) - cj)[None, :]
    cos, sin = jnp.cos(angle).astype(x.dtype), jnp.sin(angle).astype(x.dtype)
    coords = [ci + cos * di + sin * dj, cj - sin * di + cos * dj]

    def one_channel(channel):
        return map_coordinates(channel, coords, order=1, mode="constant", cval=0.0)

    return _clip(jax.vmap(one_channel, in_axes=2, out_axes=2)(x), x)


def luma(x: Array) -> Array:
    """``(H, W, 1)`` grayscale: ``0.299 R + 0.587 G + 0.114 B`` for RGB, the channel itself else."""
    if x.shape[-1] == 1:
        return x
    return LUMA[0] * x[..., 0:1] + LUMA[1] * x[..., 1:2] + LUMA[2] * x[..., 2:3]


def grayscale(x: Array) -> Array:
    """Every channel replaced by the :func:`luma` (RGB stays 3 channels); 1 channel: identity."""
    if x.shape[-1] == 1:
        return x
    return _clip(jnp.broadcast_to(luma(x), x.shape), x)


def adjust_image_brightness(x: Array, factor: Array | float) -> Array:
    """``y = clip(factor x)`` (torchvision's and SimCLR v2's multiplicative brightness)."""
    return _clip(factor * x, x)


def adjust_image_contrast(x: Array, factor: Array | float) -> Array:
    """``y = clip(m + factor (x - m))``, ``m`` the mean luma of the whole image (torchvision)."""
    m = jnp.mean(luma(x))
    return _clip(m + factor * (x - m), x)


def adjust_saturation(x: Array, factor: Array | float) -> Array:
    """``y = clip(g + factor (x - g))``, ``g`` the per-pixel :func:`luma`; 1 channel: identity.

    ``factor = 0`` is :func:`grayscale`, ``1`` the identity, ``> 1`` more saturated.
    """
    if x.shape[-1] == 1:
        return x
    g = luma(x)
    return _clip(g + factor * (x - g), x)


def adjust_hue(x: Array, delta: Array | float) -> Array:
    """Rotate colours about the grey axis by ``delta`` turns (``2 pi delta`` rad); 1 ch: identity.

    ``y = R x`` per pixel with ``R`` the rotation about ``(1, 1, 1) / sqrt(3)`` (Rodrigues):
    ``R = cos t I + sin t [k]_x + (1 - cos t) k k^T``. Like an HSV hue shift it fixes greys,
    keeps ``(R + G + B) / 3`` and cycles the primaries: ``delta = 1/3`` is exactly the channel
    permutation red -> green -> blue. Unlike HSV it is linear and smooth in ``delta`` (no
    branches), so ``delta -> 0`` tends to the identity; colours pushed out of the cube are
    clipped.
    """
    if x.shape[-1] == 1:
        return x
    t = 2 * jnp.pi * jnp.asarray(delta, x.dtype)
    cos, sin = jnp.cos(t), jnp.sin(t)
    a, b = (1 - cos) / 3, sin / math.sqrt(3)
    r, g, bl = x[..., 0:1], x[..., 1:2], x[..., 2:3]
    y = jnp.concatenate(
        [
            (cos + a) * r + (a - b) * g + (a + b) * bl,
            (a + b) * r + (cos + a) * g + (a - b) * bl,
            (a - b) * r + (a + b) * g + (cos + a) * bl,
        ],
        axis=-1,
    )
    return _clip(y, x)


def blur_image(x: Array, sigma: Array | float, radius: int) -> Array:
    """Separable Gaussian blur, the same sigma (pixels) along rows and columns, edges replicated.

    The 1-D kernel is :func:`contrastive_jax.training.augmentations.signal.blur_signal`'s
    (``2 radius + 1`` taps,
    normalised): a constant image is unchanged and an interior impulse keeps its sum.
    """
    y = blur_axis0(x, sigma, radius)
    y = jnp.swapaxes(blur_axis0(jnp.swapaxes(y, 0, 1), sigma, radius), 0, 1)
    return _clip(y, x)


def mask_image(x: Array, top: Array | int, left: Array | int, height: int, width: int) -> Array:
    """Zero the ``height x width`` box whose top-left pixel is ``(top, left)`` (all channels)."""
    i = jnp.arange(x.shape[0])[:, None, None]
    j = jnp.arange(x.shape[1])[None, :, None]
    inside = (i >= top) & (i < top + height) & (j >= left) & (j < left + width)
    return _clip(jnp.where(inside, 0, x), x)


# ---------------------------------------------------------------------------------------------
# Random ops: (x, key, strength) -> y.


def random_image_shift(x: Array, key: Array, strength: float) -> Array:
    """Translate by ``dy ~ U{-m_h..m_h}``, ``dx ~ U{-m_w..m_w}``, ``m = round(s H)``, zero fill.

    Strength ``s`` in ``[0, 1]``: the largest shift as a fraction of the height (rows) and width
    (columns); 8x8 digits: 0.125 is one pixel. 0 (and anything below ``0.5 / max(H, W)``) is the
    identity.
    """
    s = check_strength("shift", strength, *LIMITS["shift"])
    mh, mw = integer_extent(s, x.shape[0]), integer_extent(s, x.shape[1])
    if mh == 0 and mw == 0:
        return x
    u = uniforms(key, 2)
    return shift_image(x, uniform_integer(u[0], -mh, mh), uniform_integer(u[1], -mw, mw))


def random_image_resized_crop(x: Array, key: Array, strength: float) -> Array:
    """SimCLR's random resized crop: area fraction ``a ~ U[1 - s, 1]``, aspect jitter, bilinear.

    Strength ``s`` in ``[0, 1)``: the largest fraction of the area cropped away. The box's
    aspect ratio (relative to the image's) is ``r = (4/3)^u``, ``u ~ U[-s, s]`` (SimCLR's
    ``[3/4, 4/3]`` at ``s = 1``), its size ``(H sqrt(a r), W sqrt(a / r))`` capped at the image,
    its position uniform inside the image; the box is resized back by :func:`resized_crop_image`.
    0 is the identity; as ``s -> 0`` every read position moves by at most ~``s H`` pixels.
    """
    s = check_strength("resized_crop", strength, *LIMITS["resized_crop"])
    if s == 0:
        return x
    h, w = x.shape[:2]
    u = uniforms(key, 4, x.dtype)
    area = 1 - s * u[0]
    ratio = jnp.exp(s * (2 * u[1] - 1) * math.log(4 / 3))
    height = jnp.minimum(h * jnp.sqrt(area * ratio), h)
    width = jnp.minimum(w * jnp.sqrt(area / ratio), w)
    top = u[2] * (h - height)
    left = u[3] * (w - width)
    return resized_crop_image(x, top, left, height, width)


def random_image_flip(x: Array, key: Array, strength: float) -> Array:
    """Horizontal flip ``y = x[:, ::-1]`` with probability ``strength`` in ``[0, 1]``."""
    p = check_strength("flip", strength, *LIMITS["flip"])
    if p == 0:
        return x
    return jnp.where(jax.random.bernoulli(key, p), x[:, ::-1], x)


def random_rotation(x: Array, key: Array, strength: float) -> Array:
    """Rotate by ``angle ~ U[-s, s] x 180 degrees`` about the centre (:func:`rotate`).

    Strength ``s`` in ``[0, 1]``: the largest angle as a fraction of a half turn (0.1 = 18
    degrees; 1 = any angle). Corners are zero-filled. 0 is the identity.
    """
    s = check_strength("rotation", strength, *LIMITS["rotation"])
    if s == 0:
        return x
    return rotate(x, jax.random.uniform(key, (), x.dtype, -s, s) * jnp.pi)


def random_image_brightness(x: Array, key: Array, strength: float) -> Array:
    """Multiply by ``factor ~ U[max(0, 1 - s), 1 + s]`` and clip (:func:`adjust_image_brightness`).

    Strength ``s >= 0``: the largest relative change of intensity (SimCLR: ``0.8 x`` its colour
    strength). 0 is the identity.
    """
    s = check_strength("brightness", strength)
    if s == 0:
        return x
    return adjust_image_brightness(x, jax.random.uniform(key, (), x.dtype, max(0.0, 1 - s), 1 + s))


def random_image_contrast(x: Array, key: Array, strength: float) -> Array:
    """Scale about the mean luma by ``factor ~ U[max(0, 1 - s), 1 + s]``
    (:func:`adjust_image_contrast`).

    Strength ``s >= 0``: the largest relative change of contrast. 0 is the identity.
    """
    s = check_strength("contrast", strength)
    if s == 0:
        return x
    return adjust_image_contrast(x, jax.random.uniform(key, (), x.dtype, max(0.0, 1 - s), 1 + s))


def random_saturation(x: Array, key: Array, strength: float) -> Array:
    """Blend with the luma by ``factor ~ U[max(0, 1 - s), 1 + s]`` (:func:`adjust_saturation`).

    Strength ``s >= 0``: the largest relative change of saturation. 0 is the identity; so is any
    strength on a 1-channel image (the grayscale fallback).
    """
    s = check_strength("saturation", strength)
    if s == 0 or x.shape[-1] == 1:
        return x
    return adjust_saturation(x, jax.random.uniform(key, (), x.dtype, max(0.0, 1 - s), 1 + s))


def random_hue(x: Array, key: Array, strength: float) -> Array:
    """Rotate hue by ``delta ~ U[-s, s]`` turns (:func:`adjust_hue`).

    Strength ``s`` in ``[0, 0.5]`` (torchvision's hue range; SimCLR: ``0.2 x`` its colour
    strength). 0 is the identity; so is any strength on a 1-channel image.
    """
    s = check_strength("hue", strength, *LIMITS["hue"])
    if s == 0 or x.shape[-1] == 1:
        return x
    return adjust_hue(x, jax.random.uniform(key, (), x.dtype, -s, s))


def random_grayscale(x: Array, key: Array, strength: float) -> Array:
    """Replace the image by its :func:`grayscale` with probability ``strength`` in ``[0, 1]``.

    SimCLR's colour drop (0.2). The identity on a 1-channel image, and at 0.
    """
    p = check_strength("grayscale", strength, *LIMITS["grayscale"])
    if p == 0 or x.shape[-1] == 1:
        return x
    return jnp.where(jax.random.bernoulli(key, p), grayscale(x), x)


def random_image_blur(x: Array, key: Array, strength: float) -> Array:
    """Gaussian blur with ``sigma ~ U[0.1, 1] strength`` pixels (:func:`blur_image`).

    Strength ``s >= 0``: the largest sigma in pixels (SimCLR on 224-pixel images: 2). The kernel
    half-width is static, ``max(1, ceil(3 s))``, edges replicated. 0 is the identity.
    """
    s = check_strength("blur", strength)
    if s == 0:
        return x
    sigma = jax.random.uniform(key, (), x.dtype, 0.1, 1.0) * s
    return blur_image(x, sigma, blur_radius(s))


def image_gaussian_noise(x: Array, key: Array, strength: float) -> Array:
    """Add i.i.d. ``N(0, s²)`` noise to every pixel and channel, then clip to ``[0, 1]``.

    Strength ``s >= 0``: the noise's standard deviation in intensity units (the range is 1).
    0 is the identity.
    """
    s = check_strength("noise", strength)
    if s == 0:
        return x
    return _clip(x + s * jax.random.normal(key, x.shape, x.dtype), x)


def random_image_cutout(x: Array, key: Array, strength: float) -> Array:
    """Zero one ``round(s H) x round(s W)`` box at a uniform position inside the image.

    Strength ``s`` in ``[0, 1]``: the box's side as a fraction of the image's (a square on a
    square image; 8x8 digits: 0.25 is 2x2). 0 (and anything that rounds to an empty box) is the
    identity.
    """
    s = check_strength("cutout", strength, *LIMITS["cutout"])
    h, w = x.shape[:2]
    bh, bw = integer_extent(s, h), integer_extent(s, w)
    if bh == 0 or bw == 0:
        return x
    u = uniforms(key, 2)
    top = uniform_integer(u[0], 0, h - bh)
    left = uniform_integer(u[1], 0, w - bw)
    return mask_image(x, top, left, bh, bw)


OPS: dict[str, Callable[[Array, Array, float], Array]] = {
    "resized_crop": random_image_resized_crop,
    "shift": random_image_shift,
    "flip": random_image_flip,
    "rotation": random_rotation,
    "brightness": random_image_brightness,
    "contrast": random_image_contrast,
    "saturation": random_saturation,
    "hue": random_hue,
    "grayscale": random_grayscale,
    "blur": random_image_blur,
    "noise": image_gaussian_noise,
    "cutout": random_image_cutout,
}
"""The image ops by config name, in the order they are applied."""
