"""Random augmentations of one 1-D signal, and the 1-D primitives the image ops reuse.

A signal is a ``(L, C)`` float array: ``L`` time steps, ``C`` channels (MNIST-1D: ``(40, 1)``,
standardised to mean 0 and std 1 over the dataset, so values are unbounded and one unit of
amplitude is one dataset standard deviation).

Every random op has the signature ``op(x, key, strength) -> y``: ``y`` has x's shape and dtype,
``key`` is one PRNG key (one example), and ``strength`` is a plain Python float, static under
``jit``. ``strength == 0`` returns ``x`` itself (the op is skipped, so the output is
bit-identical), and every op tends to the identity as ``strength -> 0``: the continuous ops
(resized crop, brightness, contrast, blur, noise) by a change of order ``strength``, the integer
ones (shift, cutout) are exactly the identity once ``strength * L < 0.5``, and the flip happens
with probability ``strength``. Each random op draws its parameters and hands them to a
deterministic op (:func:`shift_signal`, :func:`resized_crop_signal`,
:func:`adjust_signal_brightness`, :func:`adjust_signal_contrast`, :func:`blur_signal`,
:func:`mask_signal`) that the tests check against NumPy.

:data:`OPS` lists the ops in the order :func:`contrastive_jax.training.augmentations.augment`
applies them
(SimCLR's order: crop/shift, flip, amplitude ("colour"), blur, noise, cutout). Batches go
through ``augment``, which vmaps the per-example pipeline with one key per example.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable

import jax
import jax.numpy as jnp

from contrastive_jax.errors import ConfigError

Array = jax.Array

LIMITS: dict[str, tuple[float, bool]] = {
    "resized_crop": (1.0, False),
    "roll": (1.0, True),
    "shift": (1.0, True),
    "flip": (1.0, True),
    "cutout": (1.0, True),
}
"""Upper bounds ``(bound, inclusive)`` of the bounded strengths; the others are any ``>= 0``."""


# ---------------------------------------------------------------------------------------------
# Shared primitives (also used by the image ops).


def check_strength(
    op: str, strength: float, upper: float | None = None, inclusive: bool = True
) -> float:
    """A plain, finite, non-negative Python number, at most ``upper`` (below it if not inclusive).

    Strengths select code paths (``0`` skips an op) and set static kernel sizes, so they must be
    known when tracing: a JAX array is an error, not a silent retrace.
    """
    if isinstance(strength, bool) or not isinstance(strength, numbers.Real):
        raise ConfigError(
            f"the strength of {op!r} must be a plain Python number; got {strength!r} of type "
            f"{type(strength).__name__}. Strengths are static config values, not arrays."
        )
    value = float(strength)
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"the strength of {op!r} must be finite and >= 0; got {value}.")
    if upper is not None and (value > upper or (not inclusive and value == upper)):
        bound = f"<= {upper}" if inclusive else f"< {upper}"
        raise ConfigError(f"the strength of {op!r} must be {bound}; got {value}.")
    return value


def integer_extent(strength: float, size: int) -> int:
    """``strength * size`` rounded to the nearest integer (halves up): an op's reach in samples."""
    return math.floor(strength * size + 0.5)


def resample(x: Array, positions: Array) -> Array:
    """Linear interpolation of ``x`` along axis 0 at fractional ``positions``, edges replicated.

    ``y[i] = (1 - f) x[k] + f x[k + 1]`` with ``k = floor(p_i)``, ``f = p_i - k`` and ``p_i``
    clipped to ``[0, L - 1]``. Each output lies between its two neighbours (clipped there, so
    rounding never leaves ``[min x, max x]``), and integer positions return samples exactly.

    Args:
      x: (L, ...) array.
      positions: (M,) float positions in sample units.

    Returns:
      (M, ...) array of x's dtype.
    """
    n = x.shape[0]
    if n == 1:
        return jnp.broadcast_to(x, (positions.shape[0], *x.shape[1:]))
    p = jnp.clip(positions, 0, n - 1)
    k = jnp.clip(jnp.floor(p).astype(jnp.int32), 0, n - 2)
    f = (p - k).astype(x.dtype).reshape((-1,) + (1,) * (x.ndim - 1))
    a, b = x[k], x[k + 1]
    y = (1 - f) * a + f * b
    return jnp.clip(y, jnp.minimum(a, b), jnp.maximum(a, b))


def uniforms(key: Array, n: int, dtype=jnp.float32) -> Array:
    """``n`` independent ``U[0, 1)`` draws from one key.

    One PRNG call per op rather than a split and a call per parameter: each call adds a threefry
    block to the compiled program, and a few blocks compile much faster than many.
    """
    return jax.random.uniform(key, (n,), dtype)


def uniform_integer(u: Array, low: Array | int, high: Array | int) -> Array:
    """An integer uniform on ``{low, ..., high}`` (inclusive) from a ``U[0, 1)`` draw ``u``."""
    return jnp.clip(low + jnp.floor(u * (high - low + 1)).astype(jnp.int32), low, high)


def blur_signal(x: Array, sigma: Array | float, radius: int) -> Array:
    """Gaussian blur along axis 0 with a static ``2 radius + 1``-tap kernel, edges replicated.

    ``y[t] = sum_{k=-r..r} w_k x[clip(t + k, 0, L - 1)]`` with ``w_k ∝ exp(-k² / (2 sigma²))``
    normalised to sum 1: a constant signal is unchanged and an impulse further than ``r`` from
    the ends keeps its sum. ``sigma -> 0`` gives ``w = (0, .., 1, .., 0)``, the identity.

    Args:
      x: (L, ...) array.
      sigma: scalar standard deviation in samples (may be traced).
      radius: static half-width of the kernel in samples.

    Returns:
      (L, ...) array of x's dtype.
    """
    n = x.shape[0]
    taps = jnp.arange(-radius, radius + 1)
    sigma = jnp.maximum(jnp.asarray(sigma, x.dtype), 1e-6)
    w = jnp.exp(-0.5 * (taps.astype(x.dtype) / sigma) ** 2)
    w = w / jnp.sum(w)
    idx = jnp.clip(jnp.arange(n)[:, None] + taps[None, :], 0, n - 1)  # (L, 2r + 1)
    w = w.reshape((1, -1) + (1,) * (x.ndim - 1))
    return jnp.sum(x[idx] * w, axis=1).astype(x.dtype)


def blur_radius(strength: float) -> int:
    """The static kernel half-width for a largest sigma of ``strength``: ``max(1, ceil(3 s))``."""
    return max(1, math.ceil(3 * strength))


# ---------------------------------------------------------------------------------------------
# Deterministic ops: the sampled parameter in, the augmented signal out.


def shift_signal(x: Array, offset: Array | int) -> Array:
    """Shift by an integer ``offset`` along time, edges replicated (no wrap-around).

    ``y[t] = x[clip(t - offset, 0, L - 1)]``: a positive offset moves the content later and
    repeats the first sample in front; a negative one moves it earlier and repeats the last.
    """
    n = x.shape[0]
    return x[jnp.clip(jnp.arange(n) - offset, 0, n - 1)]


def roll(x: Array, offset: Array | int) -> Array:
    """Circular shift by an integer ``offset`` along time: ``y[t] = x[(t - offset) mod L]``."""
    n = x.shape[0]
    return x[(jnp.arange(n) - offset) % n]


def add_trend(x: Array, slope: Array | float) -> Array:
    """``y[t] = x[t] + slope (t / (L - 1) - 1/2)``: a linear ramp of total rise ``slope``."""
    n = x.shape[0]
    return (x + slope * jnp.linspace(-0.5, 0.5, n, dtype=x.dtype)[:, None]).astype(x.dtype)


def resized_crop_signal(x: Array, start: Array | float, length: Array | float) -> Array:
    """Crop the window ``[start, start + length)`` (in samples) and stretch it back to ``L``.

    Output sample ``i`` reads the window at ``p_i = start + (i + 0.5) length / L - 0.5`` (sample
    centres, as ``jax.image.resize``) by :func:`resample`; ``start = 0, length = L`` gives
    ``p_i = i``, the identity.
    """
    n = x.shape[0]
    i = jnp.arange(n, dtype=x.dtype)
    return resample(x, start + (i + 0.5) * (length / n) - 0.5)


def adjust_signal_brightness(x: Array, delta: Array | float) -> Array:
    """``y = x + delta``: an offset in the signal's units (std units for standardised data)."""
    return (x + delta).astype(x.dtype)


def adjust_signal_contrast(x: Array, factor: Array | float) -> Array:
    """``y = m + factor (x - m)``, ``m`` the per-channel mean over time of this example."""
    m = jnp.mean(x, axis=0, keepdims=True)
    return (m + factor * (x - m)).astype(x.dtype)


def mask_signal(x: Array, start: Array | int, length: Array | int) -> Array:
    """Replace samples ``start <= t < start + length`` by the example's per-channel mean."""
    t = jnp.arange(x.shape[0])[:, None]
    fill = jnp.mean(x, axis=0, keepdims=True)
    return jnp.where((t >= start) & (t < start + length), fill, x).astype(x.dtype)


# ---------------------------------------------------------------------------------------------
# Random ops: (x, key, strength) -> y.


def random_signal_shift(x: Array, key: Array, strength: float) -> Array:
    """Shift by an integer offset uniform in ``[-m, m]``, ``m = round(strength L)``, edge fill.

    Strength: the largest shift as a fraction of the length, in ``[0, 1]`` (MNIST-1D: 0.2 is
    up to 8 of 40 samples). 0 (and anything below ``0.5 / L``) is the identity. The samples
    shifted in repeat the edge sample (see :func:`shift_signal`), so values stay within the input's
    ``[min, max]``.
    """
    m = integer_extent(check_strength("shift", strength, *LIMITS["shift"]), x.shape[0])
    if m == 0:
        return x
    return shift_signal(x, uniform_integer(jax.random.uniform(key, ()), -m, m))


def random_roll(x: Array, key: Array, strength: float) -> Array:
    """Circular shift by an integer offset uniform in ``[-m, m]``, ``m = round(strength L)``.

    Strength: the largest shift as a fraction of the length, in ``[0, 1]``; from ``m >= L/2``
    on every rotation is equally likely (a uniform offset in ``0..L-1``). Unlike
    :func:`random_signal_shift` nothing is filled in: samples leaving one end re-enter at the other
    (:func:`roll`), as MNIST-1D's generator translates its padded templates, so the values are
    a permutation of the input's. 0 (and anything below ``0.5 / L``) is the identity.
    """
    n = x.shape[0]
    m = integer_extent(check_strength("roll", strength, *LIMITS["roll"]), n)
    if m == 0:
        return x
    u = jax.random.uniform(key, ())
    if 2 * m + 1 > n:  # offsets -m..m would repeat rotations: every rotation once instead
        return roll(x, uniform_integer(u, 0, n - 1))
    return roll(x, uniform_integer(u, -m, m))


def random_trend(x: Array, key: Array, strength: float) -> Array:
    """Add a linear ramp of total rise ``a ~ U[-s, s]`` over the signal (:func:`add_trend`).

    Strength ``s >= 0``, in the signal's units: MNIST-1D's generator shears its templates
    (a linear trend of random slope); this makes the views disagree on it. 0 is the identity;
    the change is at most ``s / 2``.
    """
    s = check_strength("trend", strength)
    if s == 0:
        return x
    return add_trend(x, jax.random.uniform(key, (), x.dtype, -s, s))


CORRELATED_NOISE_SIGMA = 1.1  # samples: MNIST-1D's correlated noise (sigma 2 of 72 samples)


def correlated_noise(x: Array, key: Array, strength: float) -> Array:
    """Add smooth Gaussian noise: white noise blurred (sigma 1.1 samples), rescaled to std ``s``.

    Strength ``s >= 0``: the noise's standard deviation in the signal's units. MNIST-1D adds
    such correlated noise to every signal; fresh draws of it are a nuisance the views should
    not agree on. 0 is the identity.
    """
    s = check_strength("corr_noise", strength)
    if s == 0:
        return x
    radius = blur_radius(CORRELATED_NOISE_SIGMA)
    taps = jnp.exp(-0.5 * (jnp.arange(-radius, radius + 1) / CORRELATED_NOISE_SIGMA) ** 2)
    gain = jnp.sqrt(jnp.sum((taps / taps.sum()) ** 2))  # std of blurred unit white noise
    e = blur_signal(jax.random.normal(key, x.shape, jnp.float32), CORRELATED_NOISE_SIGMA, radius)
    return (x + (s / gain) * e).astype(x.dtype)


def random_signal_resized_crop(x: Array, key: Array, strength: float) -> Array:
    """Time-stretch: a random window of ``length ~ U[(1 - s) L, L]`` resampled back to ``L``.

    Strength ``s`` in ``[0, 1)``: the largest fraction of the signal cropped away, so the stretch
    factor ``L / length`` is at most ``1 / (1 - s)``. The window's start is uniform over the
    positions that keep it inside the signal; resampling is linear (:func:`resized_crop_signal`), so
    values stay within the input's ``[min, max]``. 0 is the identity; as ``s -> 0`` every read
    position moves by at most ``s L`` samples.
    """
    s = check_strength("resized_crop", strength, *LIMITS["resized_crop"])
    if s == 0:
        return x
    n = x.shape[0]
    u = uniforms(key, 2, x.dtype)
    length = n - s * n * u[0]
    start = u[1] * (n - length)
    return resized_crop_signal(x, start, length)


def random_signal_flip(x: Array, key: Array, strength: float) -> Array:
    """Time reversal ``y = x[::-1]`` with probability ``strength`` in ``[0, 1]`` (0: never)."""
    p = check_strength("flip", strength, *LIMITS["flip"])
    if p == 0:
        return x
    return jnp.where(jax.random.bernoulli(key, p), x[::-1], x)


def random_signal_brightness(x: Array, key: Array, strength: float) -> Array:
    """Add one offset ``delta ~ U[-s, s]`` to the whole example (:func:`adjust_signal_brightness`).

    Strength ``s >= 0``: the largest offset, in the signal's units (dataset stds for
    standardised data). 0 is the identity; the change is at most ``s``.
    """
    s = check_strength("brightness", strength)
    if s == 0:
        return x
    return adjust_signal_brightness(x, jax.random.uniform(key, (), x.dtype, -s, s))


def random_signal_contrast(x: Array, key: Array, strength: float) -> Array:
    """Scale about the per-channel mean by ``factor ~ U[max(0, 1 - s), 1 + s]``.

    Strength ``s >= 0``: the largest relative change of amplitude
    (:func:`adjust_signal_contrast`); the factor never goes below 0, so the signal is never
    inverted. 0 is the identity; the change is at most ``s max|x - mean|``.
    """
    s = check_strength("contrast", strength)
    if s == 0:
        return x
    return adjust_signal_contrast(x, jax.random.uniform(key, (), x.dtype, max(0.0, 1 - s), 1 + s))


def random_signal_blur(x: Array, key: Array, strength: float) -> Array:
    """Gaussian blur along time with ``sigma ~ U[0.1, 1] strength`` samples (:func:`blur_signal`).

    Strength ``s >= 0``: the largest sigma, in samples (``s = 1``: sigma in [0.1, 1] samples).
    The kernel half-width is static, ``max(1, ceil(3 s))``; the ends are edge-replicated, so a
    constant signal is unchanged. 0 is the identity; as ``s -> 0`` the kernel tends to a delta.
    """
    s = check_strength("blur", strength)
    if s == 0:
        return x
    sigma = jax.random.uniform(key, (), x.dtype, 0.1, 1.0) * s
    return blur_signal(x, sigma, blur_radius(s))


def signal_gaussian_noise(x: Array, key: Array, strength: float) -> Array:
    """Add i.i.d. ``N(0, s²)`` noise to every sample and channel.

    Strength ``s >= 0``: the noise's standard deviation in the signal's units (dataset stds for
    standardised data). 0 is the identity.
    """
    s = check_strength("noise", strength)
    if s == 0:
        return x
    return (x + s * jax.random.normal(key, x.shape, x.dtype)).astype(x.dtype)


def random_signal_cutout(x: Array, key: Array, strength: float) -> Array:
    """Mean-fill one random window of ``length ~ U{1, .., m}`` samples, ``m = round(s L)``.

    Strength ``s`` in ``[0, 1]``: the longest window as a fraction of the length. The window lies
    inside the signal, its start uniform; it is filled with the example's per-channel mean
    (:func:`mask_signal`; for standardised data close to the dataset mean 0, and always within the
    input's ``[min, max]``). 0 (and anything below ``0.5 / L``) is the identity.
    """
    n = x.shape[0]
    m = integer_extent(check_strength("cutout", strength, *LIMITS["cutout"]), n)
    if m == 0:
        return x
    u = uniforms(key, 2)
    length = uniform_integer(u[0], 1, m)
    start = uniform_integer(u[1], 0, n - length)
    return mask_signal(x, start, length)


OPS: dict[str, Callable[[Array, Array, float], Array]] = {
    "resized_crop": random_signal_resized_crop,
    "roll": random_roll,
    "shift": random_signal_shift,
    "flip": random_signal_flip,
    "brightness": random_signal_brightness,
    "contrast": random_signal_contrast,
    "trend": random_trend,
    "blur": random_signal_blur,
    "noise": signal_gaussian_noise,
    "corr_noise": correlated_noise,
    "cutout": random_signal_cutout,
}
"""The signal ops by config name, in the order they are applied."""
