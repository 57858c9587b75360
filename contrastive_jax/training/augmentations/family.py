"""SimCLR's augmentation family as the papers run it at 224 px: the SimCLR, MoCo v2 and MoCo v3
recipes as augment configs (``kind = "image_recipe"``), with torchvision's semantics.

:func:`recipe_augment_config` returns one of :data:`RECIPES`; ``two_views_each`` and
``augment_each`` (:mod:`~contrastive_jax.training.augmentations.views`) run it. One view of one
``(H, W, C)`` image in ``[0, 1]`` is, in this order (:func:`recipe_view`):

1. ``crop = "device"``: torchvision's random resized crop to ``size``
   (:mod:`~contrastive_jax.training.augmentations.crop`); ``crop = "host"``: none, the input
   workers cropped the view (:func:`contrastive_jax.training.data.image_crops.
   random_resized_crops`);
2. horizontal flip with probability ``flip``;
3. with probability ``jitter_p``, torchvision's ``ColorJitter(*jitter)`` as a whole: brightness,
   contrast and saturation factors ``~ U[max(0, 1 - s), 1 + s]``, a hue shift ``~ U[-h, h]``
   turns (HSV, :func:`adjust_hue_hsv`), the four applied in a uniformly random order
   (:func:`color_jitter`);
4. grayscale (BT.601 luma) with probability ``grayscale``;
5. with probability ``blur``, a Gaussian blur of ``blur_kernel`` taps and
   ``sigma ~ U(blur_sigma)`` pixels (:func:`gaussian_blur`);
6. with probability ``solarize``, :func:`solarize` (pixels ``>= 0.5`` inverted).

``flip``, ``jitter_p``, ``grayscale``, ``blur`` and ``solarize`` are a probability for both views
or a pair ``(view 1, view 2)``: MoCo v3 takes BYOL's asymmetric pair. MoCo's flip comes last in
its code; every later step commutes with a horizontal flip (pixel-wise or whole-image maps, a
symmetric kernel with symmetric edges), so the order gives the same distribution.

The ``image`` kind's strength ops (:mod:`~contrastive_jax.training.augmentations.image`) are
not these: its hue is a rotation about the grey axis, its colour ops each run always and in a
fixed order, its blur always, with ``sigma ~ U[0.1, 1] s``, and its crop keeps the input's size.

References:
  [SimCLR] Appendix A (crop 0.08-1 and flip; colour jitter of strength 1, p = 0.8; grayscale
  p = 0.2; blur p = 0.5, kernel 10% of the side, sigma in [0.1, 2]).
  [MoCoV2] (crop 0.2-1, jitter (0.4, 0.4, 0.4, 0.1) p = 0.8, grayscale 0.2, blur p = 0.5).
  [MoCoV3] (BYOL's pair: crop 0.08-1, jitter (0.4, 0.4, 0.2, 0.1) p = 0.8, grayscale 0.2;
  blur p = 1.0 / 0.1, solarize p = 0 / 0.2).
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.augmentations.crop import random_resized_crop_to
from contrastive_jax.training.augmentations.image import (
    adjust_image_brightness,
    adjust_image_contrast,
    adjust_saturation,
    grayscale,
)

Array = jax.Array

KIND = "image_recipe"
PER_VIEW = ("flip", "jitter_p", "grayscale", "blur", "solarize")
"""Fields that take a probability, or a pair of them (view 1, view 2)."""
RECIPES: dict[str, dict[str, Any]] = {
    "simclr": dict(crop_scale=(0.08, 1.0), jitter=(0.8, 0.8, 0.8, 0.2), blur=(0.5, 0.5),
                   solarize=(0.0, 0.0)),
    "moco_v2": dict(crop_scale=(0.2, 1.0), jitter=(0.4, 0.4, 0.4, 0.1), blur=(0.5, 0.5),
                    solarize=(0.0, 0.0)),
    "moco_v3": dict(crop_scale=(0.08, 1.0), jitter=(0.4, 0.4, 0.2, 0.1), blur=(1.0, 0.1),
                    solarize=(0.0, 0.2)),
}
"""What differs between the recipes; all: ratio 3/4-4/3, flip 0.5, jitter p 0.8, grayscale 0.2,
blur sigma 0.1-2 with a kernel of 10% of the side."""
FIELDS = ("kind", "recipe", "crop", "size", "crop_scale", "crop_ratio", "flip", "jitter",
          "jitter_p", "grayscale", "blur", "blur_sigma", "blur_kernel", "solarize")


class RecipeSettings(NamedTuple):
    """A recipe config, validated and hashable (static under ``jit``); pairs are per view."""

    crop: str
    size: int
    crop_scale: tuple[float, float]
    crop_ratio: tuple[float, float]
    flip: tuple[float, float]
    jitter: tuple[float, float, float, float]
    jitter_p: tuple[float, float]
    grayscale: tuple[float, float]
    blur: tuple[float, float]
    blur_sigma: tuple[float, float]
    blur_radius: int
    solarize: tuple[float, float]

    @property
    def symmetric(self) -> bool:
        """Whether both views are drawn alike."""
        return all(getattr(self, f)[0] == getattr(self, f)[1] for f in PER_VIEW)


def blur_kernel_for(image_size: int) -> int:
    """SimCLR's kernel, 10% of the side: ``2 (image_size // 10 // 2) + 1`` taps (23 at 224)."""
    return 2 * (image_size // 10 // 2) + 1


def recipe_augment_config(recipe: str, image_size: int = 224, *,
                          crop: str = "host") -> ml_collections.ConfigDict:
    """The augment config of ``recipe`` (``"simclr"``, ``"moco_v2"``, ``"moco_v3"``) at
    ``image_size`` (the views' side; the blur kernel is 10% of it).

    ``crop = "host"``: the batch holds two views per example, ``(B, 2, S, S, C)``, cropped by
    the input workers (``data.preprocess``: ``name = "image"``, ``views = 2``,
    ``crop = "random"`` with this recipe's ``crop_scale``); ``"device"``: the batch holds one
    image per example, cropped here to ``image_size``. Returns a new, mutable ``ConfigDict``
    with every field of :data:`FIELDS`.
    """
    if recipe not in RECIPES:
        raise ConfigError(f"unknown augmentation recipe {recipe!r}; valid: {sorted(RECIPES)}")
    config = ml_collections.ConfigDict({
        "kind": KIND, "recipe": recipe, "crop": crop, "size": image_size,
        "crop_ratio": (3 / 4, 4 / 3), "flip": 0.5, "jitter_p": 0.8, "grayscale": 0.2,
        "blur_sigma": (0.1, 2.0), "blur_kernel": blur_kernel_for(image_size),
        **RECIPES[recipe]})
    freeze_recipe(dict(config.items()))  # a bad crop or size fails here, not at the first step
    return config


# ---------------------------------------------------------------------------------------------
# Deterministic ops.


def adjust_hue_hsv(x: Array, delta: Array | float) -> Array:
    """torchvision's ``adjust_hue``: HSV hue shifted by ``delta`` turns, ``h <- (h + delta)
    mod 1``; saturation and value kept; 1 channel: identity.

    RGB to HSV by the hexcone (as ``colorsys``): ``v = max``, ``c = max - min``,
    ``s = c / v``, ``6 h = (G - B) / c mod 6`` where R is the max, ``2 + (B - R) / c`` where G
    (and not R), ``4 + (R - G) / c`` where B (``h = 0`` for greys). Back:
    ``f(n) = v - v s clip(min(k, 4 - k), 0, 1)``, ``k = (n + 6 h) mod 6``, with ``n = 5, 3, 1``
    for R, G, B.
    """
    if x.shape[-1] == 1:
        return x
    r, g, b = x[..., 0], x[..., 1], x[..., 2]
    # which channel is the max by comparisons, not by equality with a separately computed max
    # (which fusion may round differently); at ties the sectors' formulas agree
    r_max = (r >= g) & (r >= b)
    g_max = ~r_max & (g >= b)
    v = jnp.where(r_max, r, jnp.where(g_max, g, b))
    c = v - jnp.minimum(jnp.minimum(r, g), b)
    s = jnp.where(v > 0, c / jnp.where(v > 0, v, 1), 0)
    safe = jnp.where(c > 0, c, 1)
    h6 = jnp.where(r_max, jnp.mod((g - b) / safe, 6),
                   jnp.where(g_max, 2 + (b - r) / safe, 4 + (r - g) / safe))
    h = jnp.mod(jnp.where(c > 0, h6 / 6, 0) + delta, 1.0)

    def channel(n):
        k = jnp.mod(n + 6 * h, 6)
        return v - v * s * jnp.clip(jnp.minimum(k, 4 - k), 0, 1)

    y = jnp.stack([channel(5), channel(3), channel(1)], axis=-1)
    return jnp.clip(y, 0, 1).astype(x.dtype)


def color_jitter(x: Array, factors: Array, order: Array) -> Array:
    """torchvision's ``ColorJitter`` with drawn parameters: the four ops in ``order``.

    ``factors (4,)``: brightness, contrast, saturation factors and the hue shift (turns);
    ``order (4,)``: a permutation of ``0..3`` (0 brightness :func:`~contrastive_jax.training.
    augmentations.image.adjust_image_brightness`, 1 contrast, 2 saturation, 3 hue
    :func:`adjust_hue_hsv`), applied left to right, each clipping to ``[0, 1]``. The hue (the
    costly op) runs once: the other three that precede it in ``order``, then it, then the rest.
    """
    hue_at = jnp.argmax(order == 3)
    others = order[jnp.argsort(order == 3, stable=True)[:3]]  # the non-hue ops, in order

    def one(y, op):
        return jnp.where(op == 0, adjust_image_brightness(y, factors[0]),
                         jnp.where(op == 1, adjust_image_contrast(y, factors[1]),
                                   adjust_saturation(y, factors[2])))

    y = x
    for j in range(3):
        y = jnp.where(j < hue_at, one(y, others[j]), y)
    y = adjust_hue_hsv(y, factors[3])
    for j in range(3):
        y = jnp.where(j >= hue_at, one(y, others[j]), y)
    return y


def gaussian_blur(x: Array, sigma: Array | float, radius: int) -> Array:
    """Separable Gaussian blur of ``2 radius + 1`` taps, edges replicated: the blur of
    :func:`~contrastive_jax.training.augmentations.image.blur_image` written as a weighted sum
    of ``2 radius + 1`` shifted slices of the edge-padded image (no gathers).

    ``w_k ∝ exp(-k² / (2 sigma²))``, ``k = -radius..radius``, normalised to sum 1.
    """
    if radius == 0:
        return x
    taps = jnp.arange(-radius, radius + 1, dtype=x.dtype)
    w = jnp.exp(-0.5 * (taps / jnp.maximum(jnp.asarray(sigma, x.dtype), 1e-6)) ** 2)
    w = w / jnp.sum(w)
    h, wd = x.shape[:2]
    p = jnp.pad(x, ((radius, radius), (0, 0), (0, 0)), mode="edge")
    y = sum(w[k] * p[k:k + h] for k in range(2 * radius + 1))
    p = jnp.pad(y, ((0, 0), (radius, radius), (0, 0)), mode="edge")
    y = sum(w[k] * p[:, k:k + wd] for k in range(2 * radius + 1))
    return jnp.clip(y, 0, 1).astype(x.dtype)


def solarize(x: Array, threshold: float = 0.5) -> Array:
    """``x`` below ``threshold``, ``1 - x`` at or above it (BYOL's solarisation; on pixels
    ``k / 255`` it is PIL's ``ImageOps.solarize`` at 128)."""
    return jnp.where(x < threshold, x, 1 - x).astype(x.dtype)


# ---------------------------------------------------------------------------------------------
# One view: the draws, then the ops.


def recipe_draws(key: Array, settings: RecipeSettings, view: int) -> dict[str, Array]:
    """The random parameters of one view: ``flip``, ``jitter``, ``grayscale``, ``blur``,
    ``solarize`` (booleans: whether each fires), ``factors (4,)`` and ``order (4,)`` of the
    jitter, ``sigma``, and ``crop_key`` (the device crop's key)."""
    keys = jax.random.split(key, 9)
    b, c, s, h = settings.jitter
    lo = jnp.asarray([max(0.0, 1 - b), max(0.0, 1 - c), max(0.0, 1 - s), -h])
    hi = jnp.asarray([1 + b, 1 + c, 1 + s, h])
    fire = {name: jax.random.bernoulli(k, getattr(settings, p)[view])
            for name, p, k in (("flip", "flip", keys[0]), ("jitter", "jitter_p", keys[1]),
                               ("grayscale", "grayscale", keys[2]), ("blur", "blur", keys[3]),
                               ("solarize", "solarize", keys[4]))}
    return {**fire, "factors": lo + (hi - lo) * jax.random.uniform(keys[5], (4,)),
            "order": jax.random.permutation(keys[6], 4),
            "sigma": jax.random.uniform(keys[7], (), minval=settings.blur_sigma[0],
                                        maxval=settings.blur_sigma[1]),
            "crop_key": keys[8]}


def apply_recipe(x: Array, draws: dict[str, Array], settings: RecipeSettings,
                 view: int) -> Array:
    """One view of ``x (H, W, C)`` (float in ``[0, 1]``) with the given draws (steps 1-6 of
    the module docstring); ops whose probability is 0 for ``view`` are skipped."""
    if settings.crop == "device":
        x = random_resized_crop_to(x, draws["crop_key"], settings.size, settings.crop_scale,
                                   settings.crop_ratio)
    steps = (("flip", "flip", lambda y: y[:, ::-1]),
             ("jitter_p", "jitter", lambda y: color_jitter(y, draws["factors"], draws["order"])),
             ("grayscale", "grayscale", grayscale),
             ("blur", "blur", lambda y: gaussian_blur(y, draws["sigma"], settings.blur_radius)),
             ("solarize", "solarize", solarize))
    for field, name, op in steps:
        p = getattr(settings, field)[view]
        if p == 1:
            x = op(x)
        elif p > 0:
            x = jnp.where(draws[name], op(x), x)
    return x


def recipe_view(x: Array, key: Array, settings: RecipeSettings, view: int) -> Array:
    """View ``view`` (0 or 1) of one image ``x (H, W, C)`` in ``[0, 1]``, drawn from ``key``:
    ``(size, size, C)`` with ``crop = "device"``, else ``x``'s shape. Computed in float32
    (float64 for float64 input) and cast back to ``x``'s dtype."""
    y = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    return apply_recipe(y, recipe_draws(key, settings, view), settings, view).astype(x.dtype)


@functools.partial(jax.jit, static_argnums=(2, 3))
def recipe_batch(images: Array, keys: Array, settings: RecipeSettings, view: int) -> Array:
    """View ``view`` of every image: ``images (B, H, W, C)``, ``keys (B,)`` one per example
    (:func:`recipe_view` under ``vmap``); ``(B, size, size, C)`` with ``crop = "device"``."""
    return jax.vmap(lambda x, k: recipe_view(x, k, settings, view))(images, keys)


# ---------------------------------------------------------------------------------------------
# Validation.


def check_recipe_input(augment: Any, preprocess: Any) -> None:
    """A ConfigError unless the training input fits the recipe: with ``crop = "host"`` the
    ``data.preprocess`` block must be ``name = "image"``, ``views = 2``, ``crop = "random"``
    at the recipe's ``size``, ``crop_scale`` and ``crop_ratio`` (else the views would be
    cropped otherwise than the recipe says, or not at all); with ``crop = "device"`` one image
    per example (``views`` 1). Anything else than an ``image_recipe`` augment passes."""
    items = dict(augment.items()) if hasattr(augment, "items") else {}
    if items.get("kind") != KIND:
        return
    settings = freeze_recipe(items)
    pre = dict(preprocess.items()) if hasattr(preprocess, "items") else {}
    views = pre.get("views", 1)
    if settings.crop == "device":
        if views != 1:
            raise ConfigError(f"augment.crop = 'device' crops one image per example: set "
                              f"data.preprocess.views = 1 (got {views})")
        return
    want = {"name": "image", "views": 2, "crop": "random", "image_size": settings.size}
    got = {k: pre.get(k, {"views": 1, "crop": "center", "name": "standard"}.get(k))
           for k in want}
    for field, range_ in (("crop_scale", settings.crop_scale), ("crop_ratio", settings.crop_ratio)):
        want[field] = range_
        got[field] = tuple(float(v) for v in pre[field]) if field in pre else None
    wrong = [f"{k}={want[k]!r}" for k in want if got[k] != want[k]]
    if wrong:
        raise ConfigError(f"augment.crop = 'host' reads two views the input workers crop: set "
                          f"data.preprocess {', '.join(wrong)} (the recipe's)")


def freeze_recipe(items: dict[str, Any]) -> RecipeSettings:
    """:class:`RecipeSettings` of a recipe config's fields (every one of :data:`FIELDS`); a
    ConfigError with one line naming the field for anything else."""
    unknown = sorted(set(items) - set(FIELDS))
    missing = [f for f in FIELDS if f not in items]
    if unknown or missing:
        what = f"unknown field(s) {unknown}" if unknown else f"missing field(s) {missing}"
        raise ConfigError(f"augment (kind {KIND!r}): {what}; start from augmentations."
                          f"recipe_augment_config({'|'.join(map(repr, RECIPES))}, image_size)")
    if not isinstance(items["recipe"], str):
        raise ConfigError(f"augment.recipe must be a name; got {items['recipe']!r}")
    if items["crop"] not in ("host", "device"):
        raise ConfigError(f"augment.crop must be 'host' (views cropped by the input workers) "
                          f"or 'device'; got {items['crop']!r}")
    size = _integer(items["size"], "size", 1)
    kernel = _integer(items["blur_kernel"], "blur_kernel", 1)
    if kernel % 2 == 0:
        raise ConfigError(f"augment.blur_kernel must be odd (2 radius + 1 taps); got {kernel}")
    jitter = _numbers(items["jitter"], "jitter", 4)
    if any(v < 0 for v in jitter) or jitter[3] > 0.5:
        raise ConfigError(f"augment.jitter (brightness, contrast, saturation, hue) must be "
                          f">= 0 with hue <= 0.5; got {items['jitter']!r}")
    scale = _interval(items["crop_scale"], "crop_scale", upper=1.0)
    return RecipeSettings(
        crop=items["crop"], size=size, crop_scale=scale,
        crop_ratio=_interval(items["crop_ratio"], "crop_ratio"),
        flip=_per_view(items["flip"], "flip"), jitter=jitter,
        jitter_p=_per_view(items["jitter_p"], "jitter_p"),
        grayscale=_per_view(items["grayscale"], "grayscale"),
        blur=_per_view(items["blur"], "blur"),
        blur_sigma=_interval(items["blur_sigma"], "blur_sigma"), blur_radius=kernel // 2,
        solarize=_per_view(items["solarize"], "solarize"))


def _integer(value, field: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ConfigError(f"augment.{field} must be an integer >= {low}; got {value!r}")
    return int(value)


def _numbers(value, field: str, n: int) -> tuple[float, ...]:
    sized = not isinstance(value, str | bytes) and hasattr(value, "__len__")
    if not sized or len(value) != n or not all(
            isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
            for v in value):
        raise ConfigError(f"augment.{field} must be {n} finite numbers; got {value!r}")
    return tuple(float(v) for v in value)


def _interval(value, field: str, upper: float | None = None) -> tuple[float, float]:
    lo, hi = _numbers(value, field, 2)
    if not 0 < lo <= hi or (upper is not None and hi > upper):
        bound = f"0 < min <= max{f' <= {upper:g}' if upper is not None else ''}"
        raise ConfigError(f"augment.{field} must be (min, max) with {bound}; got {value!r}")
    return lo, hi


def _per_view(value, field: str) -> tuple[float, float]:
    pair = (value, value) if isinstance(value, numbers.Real) else value
    try:
        p = _numbers(pair, field, 2)
    except ConfigError:
        raise ConfigError(f"augment.{field} must be a probability or a pair of them (view 1, "
                          f"view 2); got {value!r}") from None
    if not all(0 <= q <= 1 for q in p):
        raise ConfigError(f"augment.{field} must lie in [0, 1]; got {value!r}")
    return p
