"""Augmentations: deterministic per key, value ranges kept, identity at strength 0, formulas."""

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from contrastive_jax.training.augmentations import (
    IMAGE_OPS,
    SIGNAL_OPS,
    augment,
    augment_each,
    default_augment_config,
    image,
    signal,
    two_views,
    two_views_each,
)

MODULES = {"signal": signal, "image": image}
ALL_OPS = [("signal", op) for op in SIGNAL_OPS] + [("image", op) for op in IMAGE_OPS]

# Moderate strengths, at which every op changes (almost) every example.
MID = dict(
    resized_crop=0.5,
    roll=0.25,
    shift=0.25,
    flip=0.5,
    rotation=0.5,
    brightness=0.5,
    contrast=0.5,
    saturation=0.5,
    hue=0.3,
    grayscale=0.5,
    blur=1.0,
    noise=0.3,
    trend=1.0,
    corr_noise=0.3,
    cutout=0.25,
)
# The largest allowed (or large) strengths.
LARGE = dict(
    resized_crop=0.95,
    roll=1.0,
    shift=1.0,
    flip=1.0,
    rotation=1.0,
    brightness=3.0,
    contrast=3.0,
    saturation=3.0,
    hue=0.5,
    grayscale=1.0,
    blur=3.0,
    noise=1.0,
    trend=3.0,
    corr_noise=1.0,
    cutout=1.0,
)


def _signals(b=16, length=40, c=1, seed=0):
    return np.random.default_rng(seed).normal(size=(b, length, c)).astype(np.float32)


def _images(b=16, h=8, w=8, c=3, seed=0):
    return np.random.default_rng(seed).uniform(size=(b, h, w, c)).astype(np.float32)


def _data(kind, **kwargs):
    return _signals(**kwargs) if kind == "signal" else _images(**kwargs)


def _apply(kind, op, batch, key, strength):
    """A per-example op over a batch, one key per example (as ``augment`` does), jitted (one
    program per op, strength and shape, instead of one per primitive of the op)."""
    keys = jax.random.split(key, batch.shape[0])
    return np.asarray(_vmapped(kind, op, float(strength))(jnp.asarray(batch), keys))


@functools.cache
def _vmapped(kind, op, strength):
    fn = MODULES[kind].OPS[op]
    return jax.jit(jax.vmap(lambda x, k: fn(x, k, strength)))


def _config(kind, **strengths):
    return ml_collections.ConfigDict({"kind": kind, **strengths})


# ---------------------------------------------------------------------------------------------
# Deterministic per key, one key per example.


@pytest.mark.parametrize("kind, op", ALL_OPS)
def test_each_op_is_deterministic_per_key_and_differs_per_example(kind, op):
    x = _data(kind)
    key, other = jax.random.key(1), jax.random.key(2)
    y = _apply(kind, op, x, key, MID[op])
    assert y.shape == x.shape and y.dtype == x.dtype
    np.testing.assert_array_equal(y, _apply(kind, op, x, key, MID[op]))
    assert not np.array_equal(y, _apply(kind, op, x, other, MID[op])), "key ignored"
    # The same example 16 times: one key per example, so the copies are augmented differently.
    copies = np.repeat(x[:1], 16, axis=0)
    z = _apply(kind, op, copies, key, MID[op])
    distinct = len({row.tobytes() for row in z})
    assert distinct >= (2 if op in ("flip", "grayscale") else 8), distinct


# ---------------------------------------------------------------------------------------------
# Value ranges.


@pytest.mark.parametrize("op", IMAGE_OPS)
def test_image_ops_keep_unit_range_at_large_strength(op):
    x = _images()
    y = _apply("image", op, x, jax.random.key(3), LARGE[op])
    assert y.min() >= 0.0 and y.max() <= 1.0, (y.min(), y.max())
    assert not np.array_equal(y, x)


def test_image_pipeline_keeps_unit_range_at_large_strength():
    x = _images()
    large = {op: LARGE[op] for op in IMAGE_OPS}
    y = np.asarray(augment(x, jax.random.key(4), _config("image", **large)))
    assert y.shape == x.shape and y.min() >= 0.0 and y.max() <= 1.0


@pytest.mark.parametrize("op", ["shift", "roll", "resized_crop", "flip", "cutout"])
def test_signal_geometric_ops_stay_within_each_examples_range(op):
    # Edge fill (shift), linear interpolation (crop), mean fill (cutout): no new extremes.
    x = _signals()
    y = _apply("signal", op, x, jax.random.key(5), LARGE[op] if op != "flip" else 0.5)
    assert not np.array_equal(y, x)
    assert np.all(y.min(axis=1) >= x.min(axis=1)) and np.all(y.max(axis=1) <= x.max(axis=1))


# ---------------------------------------------------------------------------------------------
# Identity at strength 0, continuity near 0.


@pytest.mark.parametrize("kind, op", ALL_OPS)
def test_strength_zero_is_the_identity(kind, op):
    x = jnp.asarray(_data(kind, b=1)[0])
    y = MODULES[kind].OPS[op](x, jax.random.key(0), 0.0)
    assert y is x  # the op is skipped: bit-identical by construction
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x))


@pytest.mark.parametrize("kind", ["signal", "image"])
def test_pipeline_with_all_strengths_zero_is_the_identity(kind):
    x = _data(kind)
    zero = {op: 0.0 for op in (SIGNAL_OPS if kind == "signal" else IMAGE_OPS)}
    for config in (_config(kind, **zero), {"kind": kind}):
        np.testing.assert_array_equal(augment(x, jax.random.key(0), config), x)
        v1, v2 = two_views(x, jax.random.key(0), config)
        np.testing.assert_array_equal(v1, x)
        np.testing.assert_array_equal(v2, x)
    # One op on, the rest off: only that op acts (here: the flip, exactly).
    y = augment(x, jax.random.key(0), _config(kind, flip=1.0))
    np.testing.assert_array_equal(y, x[:, ::-1] if kind == "signal" else x[:, :, ::-1])


@pytest.mark.parametrize("kind, op", ALL_OPS)
def test_tiny_strength_is_near_identity(kind, op):
    # Continuity: the change is O(strength). Smooth data, so that sub-sample moves are small.
    t = np.linspace(0, 2 * np.pi, 40, dtype=np.float32)
    if kind == "signal":
        x = np.stack([np.sin(t + p) for p in np.linspace(0, 3, 16)])[..., None]
    else:
        x = 0.5 + 0.4 * np.sin(t[:8, None, None] + t[None, :8, None] + np.arange(3))
        x = np.repeat(x[None], 16, axis=0).astype(np.float32)
    for s, tol in ((1e-4, 5e-3), (1e-3, 5e-2)):
        diff = np.abs(_apply(kind, op, x, jax.random.key(6), s) - x).max()
        assert diff <= tol, (s, diff)


# ---------------------------------------------------------------------------------------------
# Geometric ops against NumPy.


def test_flip_at_strength_one_reverses_exactly():
    x = _signals()
    np.testing.assert_array_equal(_apply("signal", "flip", x, jax.random.key(0), 1.0), x[:, ::-1])
    x = _images()
    np.testing.assert_array_equal(_apply("image", "flip", x, jax.random.key(0), 1.0), x[:, :, ::-1])


def _np_shift(x, offset, pad=45):
    """Edge-padded shift by hand: pad both ends by repeating the end samples, take a window."""
    return np.pad(x, ((pad, pad), (0, 0)), mode="edge")[pad - offset : pad - offset + len(x)]


@pytest.mark.parametrize("offset", [-41, -7, -1, 0, 3, 39])
def test_signal_shift_matches_edge_padded_numpy(offset):
    x = _signals(b=1, c=2)[0]
    np.testing.assert_array_equal(signal.shift_signal(jnp.asarray(x), offset), _np_shift(x, offset))
    if offset == 3:  # and literally: three copies of x[0] in front, the last three gone
        np.testing.assert_array_equal(_np_shift(x, 3), np.concatenate([x[:1]] * 3 + [x[:-3]]))


@pytest.mark.parametrize("dy, dx", [(0, 0), (2, -1), (-3, 5), (8, 0)])
def test_image_shift_matches_zero_padded_numpy(dy, dx):
    x = _images(b=1)[0]
    p = 9
    padded = np.pad(x, ((p, p), (p, p), (0, 0)))
    expected = padded[p - dy : p - dy + 8, p - dx : p - dx + 8]
    np.testing.assert_array_equal(image.shift_image(jnp.asarray(x), dy, dx), expected)


def test_random_shift_draws_offsets_within_the_strength():
    # strength 0.1 of L = 40: offsets in {-4..4}, each example one whole-sample shift.
    x = _signals(b=64)
    y = _apply("signal", "shift", x, jax.random.key(7), 0.1)
    seen = set()
    for xb, yb in zip(x, y, strict=True):
        found = [o for o in range(-40, 41) if np.array_equal(_np_shift(xb, o), yb)]
        assert found and all(abs(o) <= 4 for o in found), found
        seen.add(found[0])
    assert seen == set(range(-4, 5))


def test_signal_resized_crop_matches_np_interp():
    x = _signals(b=1, c=2)[0]
    for start, length in ((0.0, 40.0), (3.7, 25.2), (10.0, 30.0)):
        pos = start + (np.arange(40) + 0.5) * length / 40 - 0.5
        expected = np.stack([np.interp(pos, np.arange(40), x[:, c]) for c in range(2)], axis=1)
        y = signal.resized_crop_signal(jnp.asarray(x), start, length)
        np.testing.assert_allclose(y, expected, rtol=0, atol=2e-5)  # float32 positions
    # The full window is exactly the identity.
    np.testing.assert_array_equal(signal.resized_crop_signal(jnp.asarray(x), 0.0, 40.0), x)
    np.testing.assert_array_equal(
        image.resized_crop_image(jnp.asarray(_images()[0]), 0.0, 0.0, 8.0, 8.0), _images()[0]
    )


def test_image_resized_crop_of_a_half_is_a_2x_bilinear_zoom():
    # A linear ramp stays a linear ramp: cropping rows [2, 6) and stretching doubles its slope.
    ramp = np.broadcast_to(np.arange(8, dtype=np.float32)[:, None, None] / 10, (8, 8, 1))
    y = np.asarray(image.resized_crop_image(jnp.asarray(ramp), 2.0, 0.0, 4.0, 8.0))
    rows = 2 + (np.arange(8) + 0.5) * 0.5 - 0.5
    np.testing.assert_allclose(y[:, 0, 0], rows / 10, atol=1e-6)
    np.testing.assert_allclose(y, np.broadcast_to(y[:, :1], y.shape), atol=0)


@pytest.mark.parametrize("size", [8, 9])
def test_rotation_by_90_degrees_is_rot90(size):
    x = _images(b=1, h=size, w=size)[0]
    for k, angle in ((1, np.pi / 2), (-1, -np.pi / 2), (2, np.pi)):
        y = np.asarray(image.rotate(jnp.asarray(x), angle))
        expected = np.rot90(x, k, axes=(0, 1))
        np.testing.assert_allclose(y[1:-1, 1:-1], expected[1:-1, 1:-1], atol=1e-5)
        np.testing.assert_allclose(y, expected, atol=1e-4)
    # A 45-degree turn of a centred bright square leaves the centre and blackens the corners.
    y = np.asarray(image.rotate(jnp.ones((9, 9, 1)), np.pi / 4))
    assert y[4, 4, 0] == pytest.approx(1.0) and y[0, 0, 0] == 0.0


def test_random_rotation_angle_is_bounded_by_strength():
    # A single bright pixel at distance 3 from the centre of a 7x7 image: after a rotation by at
    # most 0.1 x 180 degrees its centre of mass stays within 18 degrees of where it was.
    x = np.zeros((64, 7, 7, 1), np.float32)
    x[:, 3, 6] = 1.0
    y = _apply("image", "rotation", x, jax.random.key(8), 0.1)
    i, j = np.mgrid[:7, :7]
    mass = y[..., 0].sum(axis=(1, 2))
    ci = (y[..., 0] * i).sum(axis=(1, 2)) / mass - 3
    cj = (y[..., 0] * j).sum(axis=(1, 2)) / mass - 3
    angles = np.degrees(np.arctan2(-ci, cj))  # counter-clockwise, rows grow downwards
    assert np.all(np.abs(angles) <= 18.5) and np.abs(angles).max() > 9, angles


# ---------------------------------------------------------------------------------------------
# Colour, blur, noise, cutout against their formulas.


def test_grayscale_is_the_luma_weighted_mean():
    x = _images()
    luma = x @ np.array([0.299, 0.587, 0.114], np.float32)
    np.testing.assert_allclose(
        jax.vmap(image.grayscale)(x), np.repeat(luma[..., None], 3, -1), atol=1e-6
    )
    np.testing.assert_allclose(
        _apply("image", "grayscale", x, jax.random.key(0), 1.0),
        np.repeat(luma[..., None], 3, -1),
        atol=1e-6,
    )
    # p = 0.5: some examples gray, the others untouched.
    y = _apply("image", "grayscale", x, jax.random.key(0), 0.5)
    gray = np.array([np.allclose(yb[..., 0], yb[..., 2]) for yb in y])
    assert 0 < gray.sum() < len(y)
    np.testing.assert_array_equal(y[~gray], x[~gray])


@pytest.mark.parametrize("op", ["saturation", "hue", "grayscale"])
def test_colour_ops_are_the_identity_on_one_channel_images(op):
    x = _images(c=1)
    np.testing.assert_array_equal(_apply("image", op, x, jax.random.key(0), LARGE[op]), x)


def test_saturation_and_hue_formulas():
    x = jnp.asarray(_images(b=1)[0])
    np.testing.assert_allclose(image.adjust_saturation(x, 0.0), image.grayscale(x), atol=1e-6)
    np.testing.assert_allclose(image.adjust_saturation(x, 1.0), x, atol=1e-6)
    g = np.asarray(image.luma(x))
    expected = np.clip(g + 1.7 * (np.asarray(x) - g), 0, 1)
    np.testing.assert_allclose(image.adjust_saturation(x, 1.7), expected, atol=1e-6)
    # A third of a turn cycles the primaries (R -> G -> B): new R = old B, new G = old R.
    np.testing.assert_allclose(image.adjust_hue(x, 1 / 3), x[..., [2, 0, 1]], atol=1e-6)
    np.testing.assert_allclose(image.adjust_hue(x, -1 / 3), x[..., [1, 2, 0]], atol=1e-6)
    np.testing.assert_array_equal(image.adjust_hue(x, 0.0), x)
    # Near grey (no clipping), any hue turn keeps (R + G + B) / 3, and greys stay grey.
    near_grey = 0.5 + 0.2 * (x - 0.5)
    y = image.adjust_hue(near_grey, 0.17)
    np.testing.assert_allclose(y.mean(-1), near_grey.mean(-1), atol=1e-6)
    np.testing.assert_allclose(image.adjust_hue(jnp.full((2, 2, 3), 0.3), 0.17), 0.3, atol=1e-6)


def test_brightness_and_contrast_formulas():
    # Signals: brightness adds one offset in [-s, s]; contrast scales about the mean.
    x = _signals()
    y = _apply("signal", "brightness", x, jax.random.key(9), 0.5)
    delta = (y - x).reshape(16, -1)
    np.testing.assert_allclose(delta, delta[:, :1] * np.ones_like(delta), atol=1e-6)
    assert np.abs(delta).max() <= 0.5 and np.abs(delta[:, 0]).max() > 0.25
    m = x.mean(axis=1, keepdims=True)
    np.testing.assert_allclose(
        signal.adjust_signal_contrast(jnp.asarray(x[0]), 1.5), m[0] + 1.5 * (x[0] - m[0]), atol=1e-6
    )
    y = _apply("signal", "contrast", x, jax.random.key(9), 0.5)
    factor = (y - m) / (x - m)
    np.testing.assert_allclose(factor, factor[:, :1, :1] * np.ones_like(factor), rtol=1e-3)
    assert np.all((factor >= 0.5 - 1e-4) & (factor <= 1.5 + 1e-4))
    np.testing.assert_allclose(y.mean(axis=1), x.mean(axis=1), atol=1e-5)
    # Images: brightness multiplies and clips; contrast blends with the mean luma and clips.
    x = _images(b=1)[0]
    np.testing.assert_allclose(
        image.adjust_image_brightness(jnp.asarray(x), 1.3), np.clip(1.3 * x, 0, 1), atol=1e-6
    )
    mean_luma = (x @ np.array([0.299, 0.587, 0.114], np.float32)).mean()
    np.testing.assert_allclose(
        image.adjust_image_contrast(jnp.asarray(x), 0.6),
        np.clip(mean_luma + 0.6 * (x - mean_luma), 0, 1),
        atol=1e-6,
    )
    dark = _images() * 0.5  # no clipping below 1.5 x
    y = _apply("image", "brightness", dark, jax.random.key(9), 0.5)
    ratio = y / dark
    np.testing.assert_allclose(ratio, ratio[:, :1, :1, :1] * np.ones_like(ratio), rtol=1e-5)
    assert ratio.min() >= 0.5 - 1e-6 and ratio.max() <= 1.5 + 1e-6


def test_blur_keeps_constants_and_the_sum_of_an_impulse():
    const = jnp.full((40, 1), 2.5)
    np.testing.assert_allclose(signal.blur_signal(const, 1.3, 3), const, rtol=1e-6)
    impulse = np.zeros((40, 1), np.float32)
    impulse[20] = 1.0
    y = np.asarray(signal.blur_signal(jnp.asarray(impulse), 1.0, 3))[:, 0]
    k = np.arange(-3, 4)
    kernel = np.exp(-0.5 * k**2) / np.exp(-0.5 * k**2).sum()
    np.testing.assert_allclose(y[17:24], kernel, atol=1e-7)
    assert y.sum() == pytest.approx(1.0, abs=1e-6) and y[:17].max() == 0 == y[24:].max()
    # Random blur (sigma in [0.1, 1]): constants kept, an impulse keeps its sum, and spreads.
    rows = _apply("signal", "blur", np.repeat(impulse[None], 16, 0), jax.random.key(1), 1.0)
    np.testing.assert_allclose(rows.sum(axis=(1, 2)), 1.0, atol=1e-6)
    assert rows.max(axis=(1, 2)).min() < 0.6 and rows.max() <= 1.0
    flat = _apply("signal", "blur", np.full((16, 40, 1), 2.5, np.float32), jax.random.key(1), 1.0)
    np.testing.assert_allclose(flat, 2.5, rtol=1e-6)
    # Images: separable, the same kernel along both axes.
    img = np.zeros((8, 8, 3), np.float32)
    img[4, 4] = 1.0
    y = np.asarray(image.blur_image(jnp.asarray(img), 1.0, 3))
    np.testing.assert_allclose(
        y[1:8, 1:8], np.outer(kernel, kernel)[..., None] * [1, 1, 1], atol=1e-7
    )
    np.testing.assert_allclose(y.sum(axis=(0, 1)), 1.0, atol=1e-6)
    np.testing.assert_allclose(image.blur_image(jnp.full((8, 8, 3), 0.7), 1.5, 3), 0.7, rtol=1e-6)


@pytest.mark.parametrize("strength", [0.1, 0.5])
def test_noise_std_is_the_strength(strength):
    x = np.zeros((16, 40, 1), np.float32)
    noise = _apply("signal", "noise", x, jax.random.key(10), strength)
    assert noise.mean() == pytest.approx(0.0, abs=0.1 * strength)
    assert noise.std() == pytest.approx(strength, rel=0.08)  # 640 samples: 2.8% std error
    grey = np.full((16, 8, 8, 3), 0.5, np.float32)  # 0.05 noise never reaches the clip
    noise = _apply("image", "noise", grey, jax.random.key(10), 0.05 * strength) - 0.5
    assert noise.std() == pytest.approx(0.05 * strength, rel=0.05)


def test_cutout_fills_one_window_with_the_mean_or_zeros():
    x = _signals()
    np.testing.assert_allclose(
        signal.mask_signal(jnp.asarray(x[0]), 5, 3)[5:8], np.broadcast_to(x[0].mean(0), (3, 1)),
        atol=1e-6
    )
    y = _apply("signal", "cutout", x, jax.random.key(11), 0.2)  # windows of 1..8 samples
    lengths = []
    for xb, yb in zip(x, y, strict=True):
        changed = np.flatnonzero(np.any(xb != yb, axis=1))
        assert changed.size and np.all(np.diff(changed) == 1)  # one contiguous window
        np.testing.assert_allclose(
            yb[changed], np.broadcast_to(xb.mean(0), yb[changed].shape), atol=1e-6
        )
        lengths.append(changed.size)
    assert max(lengths) <= 8 and min(lengths) >= 1 and len(set(lengths)) > 3
    # Images: exactly one 2x2 hole (0.25 of 8) of zeros in all channels.
    x = _images(b=16) * 0.9 + 0.05  # strictly positive
    y = _apply("image", "cutout", x, jax.random.key(11), 0.25)
    zeros = np.all(y == 0, axis=-1)
    assert np.all(zeros.sum(axis=(1, 2)) == 4)
    for zb in zeros:
        r, c = np.nonzero(zb)
        assert np.ptp(r) == 1 and np.ptp(c) == 1
    np.testing.assert_array_equal(y[~zeros], x[~zeros])


# ---------------------------------------------------------------------------------------------
# The pipeline and SimCLR's pair.


@pytest.mark.parametrize("kind", ["signal", "image"])
def test_two_views_are_independent_augmentations(kind):
    x = _data(kind, c=1)  # MNIST-1D signals, 8x8-digit-like grayscale images
    config = default_augment_config(kind)
    v1, v2 = two_views(x, jax.random.key(0), config)
    assert v1.shape == v2.shape == x.shape and v1.dtype == v2.dtype == x.dtype
    if kind == "image":
        assert min(v1.min(), v2.min()) >= 0 and max(v1.max(), v2.max()) <= 1
    for v in (v1, v2):
        assert np.all(np.abs(np.asarray(v) - x).reshape(16, -1).max(axis=1) > 1e-3)
    assert np.all(np.abs(np.asarray(v1) - np.asarray(v2)).reshape(16, -1).max(axis=1) > 1e-3)
    # Same key, same pair; another key, another pair; the pair is augment with split keys.
    w1, w2 = two_views(x, jax.random.key(0), config)
    np.testing.assert_array_equal(v1, w1)
    np.testing.assert_array_equal(v2, w2)
    assert not np.array_equal(v1, two_views(x, jax.random.key(1), config)[0])
    # One key per example: 16 copies of one example get 16 different first views.
    c1, _ = two_views(np.repeat(x[:1], 16, 0), jax.random.key(0), config)
    assert len({row.tobytes() for row in np.asarray(c1)}) == 16


@pytest.mark.parametrize("kind", ["signal", "image"])
def test_two_views_under_jit(kind):
    x = _data(kind, c=1)
    config = default_augment_config(kind)
    eager = two_views(x, jax.random.key(3), config)
    # The recommended way: the config bound with functools.partial (a ConfigDict is unhashable).
    if kind == "image":  # (one compilation per kind: the two ways share the code path)
        jitted = jax.jit(functools.partial(two_views, config=config))(x, jax.random.key(3))
        for a, b in zip(eager, jitted, strict=True):
            np.testing.assert_allclose(a, b, atol=3e-5)  # XLA may fuse and reassociate
        return

    @jax.jit
    def step(batch, key):  # the config closed over, as in a train step
        v1, v2 = two_views(batch, key, config)
        return jnp.sum((v1 - v2) ** 2), v1

    loss, v1 = step(x, jax.random.key(3))
    np.testing.assert_allclose(v1, eager[0], atol=3e-5)  # XLA may fuse and reassociate
    assert float(loss) == pytest.approx(float(jnp.sum((eager[0] - eager[1]) ** 2)), rel=1e-5)


def test_two_views_is_augment_with_split_keys_and_keeps_dtype():
    config = _config("signal", shift=0.2, noise=0.1)
    x = _signals().astype(jnp.bfloat16)
    v1, v2 = two_views(x, jax.random.key(0), config)
    assert v1.dtype == v2.dtype == jnp.bfloat16 and v1.shape == x.shape
    k1, k2 = jax.random.split(jax.random.key(0))
    np.testing.assert_array_equal(v1, augment(x, k1, config))
    np.testing.assert_array_equal(v2, augment(x, k2, config))
    assert not np.array_equal(v1, x) and not np.array_equal(v1, v2)
    old_style = augment(_signals(), jax.random.PRNGKey(0), _config("signal", flip=1.0))
    np.testing.assert_array_equal(old_style, _signals()[:, ::-1])


def test_default_configs_list_every_op():
    for kind, ops in (("signal", SIGNAL_OPS), ("image", IMAGE_OPS)):
        config = default_augment_config(kind)
        assert set(config.keys()) == {"kind", *ops}
        assert all(isinstance(config[op], float) and config[op] >= 0 for op in ops)
    assert default_augment_config("signal").flip == 0.0
    assert default_augment_config("image").flip == 0.0
    assert SIGNAL_OPS[:3] == ("resized_crop", "roll", "shift") and SIGNAL_OPS[-1] == "cutout"
    assert IMAGE_OPS.index("rotation") < IMAGE_OPS.index("brightness") < IMAGE_OPS.index("blur")


# ---------------------------------------------------------------------------------------------
# Errors.


def test_wrong_shapes_and_dtypes_are_value_errors():
    key = jax.random.key(0)
    sig, img = default_augment_config("signal"), default_augment_config("image")
    with pytest.raises(
        ValueError,
        match=r"\(batch, length, channels\); got shape \(16, 40\): "
        r"add a channel axis",
    ):
        augment(np.zeros((16, 40), np.float32), key, sig)
    with pytest.raises(ValueError, match="add batch and channel axes"):
        two_views(np.zeros(40, np.float32), key, sig)
    with pytest.raises(ValueError, match=r"\(batch, height, width, channels\).*add a channel"):
        augment(np.zeros((16, 8, 8), np.float32), key, img)
    with pytest.raises(ValueError, match="channels first"):
        augment(np.zeros((16, 3, 8, 8), np.float32), key, img)
    with pytest.raises(ValueError, match=r"floating point.*x / 255"):
        augment(np.zeros((16, 8, 8, 3), np.uint8), key, img)
    with pytest.raises(ValueError, match="one PRNG key"):
        augment(np.zeros((16, 40, 1), np.float32), jax.random.split(key, 16), sig)
    with pytest.raises(ValueError, match=r"jax\.random\.key"):
        augment(np.zeros((16, 40, 1), np.float32), 0, sig)


def test_bad_configs_are_value_errors():
    x, key = _signals(), jax.random.key(0)
    with pytest.raises(
        ValueError,
        match=r"\['nosie'\].*valid keys are 'kind' and "
        r"resized_crop, roll, shift, flip, .*noise, corr_noise, cutout",
    ):
        augment(x, key, _config("signal", nosie=0.1))
    with pytest.raises(ValueError, match=r"\['rotation'\]"):  # an image op on signals
        augment(x, key, _config("signal", rotation=0.1))
    with pytest.raises(ValueError, match=r"'noise' must be finite and >= 0; got -0.1"):
        augment(x, key, _config("signal", noise=-0.1))
    with pytest.raises(ValueError, match=r"'flip' must be <= 1.0; got 1.5"):
        two_views(x, key, _config("signal", flip=1.5))
    with pytest.raises(ValueError, match=r"'grayscale' must be <= 1.0"):
        augment(_images(), key, _config("image", grayscale=2.0))
    with pytest.raises(ValueError, match=r"'resized_crop' must be < 1.0"):
        augment(x, key, _config("signal", resized_crop=1.0))
    with pytest.raises(ValueError, match="plain Python number"):
        augment(x, key, {"kind": "signal", "noise": jnp.float32(0.1)})
    with pytest.raises(ValueError, match="kind"):
        augment(x, key, {"noise": 0.1})
    with pytest.raises(ValueError, match="kind must be one of"):
        default_augment_config("audio")
    with pytest.raises(ValueError, match="'shift' must be finite"):
        signal.random_signal_shift(jnp.asarray(x[0]), key, -0.2)


def test_roll_trend_and_correlated_noise_against_numpy():
    x = _signals(b=1)[0]
    for offset in (-7, 0, 3, 40):
        np.testing.assert_array_equal(signal.roll(jnp.asarray(x), offset), np.roll(x, offset,
                                                                                    axis=0))
    ramp = np.linspace(-0.5, 0.5, 40, dtype=np.float32)[:, None]
    np.testing.assert_allclose(signal.add_trend(jnp.asarray(x), 0.8), x + 0.8 * ramp,
                               rtol=1e-6, atol=1e-6)
    # a roll never changes the values, only their order
    y = _apply("signal", "roll", _signals(), jax.random.key(3), 0.5)
    np.testing.assert_array_equal(np.sort(y, axis=1), np.sort(_signals(), axis=1))
    # correlated noise: std = strength, and neighbouring samples are correlated (white: ~0)
    zeros = np.zeros((256, 40, 1), np.float32)
    noise = _apply("signal", "corr_noise", zeros, jax.random.key(4), 0.5)[:, 8:-8, 0]
    assert abs(noise.std() - 0.5) < 0.03
    lag1 = np.corrcoef(noise[:, :-1].ravel(), noise[:, 1:].ravel())[0, 1]
    assert 0.5 < lag1 < 0.9  # sigma 1.1 samples: exp(-1 / (4 * 1.1^2)) = 0.81


def test_roll_at_half_the_length_draws_every_rotation_equally():
    # m = 20 of L = 40: offsets -20..20 would count the rotation by 20 twice
    x = jnp.arange(40, dtype=jnp.float32)[None, :, None].repeat(4000, axis=0)
    y = _apply("signal", "roll", np.asarray(x), jax.random.key(9), 0.5)
    offsets = np.argmin(y[:, :, 0], axis=1)
    counts = np.bincount(offsets, minlength=40)
    assert counts.min() > 60 and counts.max() < 140  # 100 expected each


@pytest.mark.parametrize("kind", ["signal", "image"])
def test_per_example_keys_make_views_independent_of_the_batch(kind):
    """augment_each / two_views_each: example b's views depend only on keys[b] (a batch equals
    its halves, in any order), the two views differ, and two_views_each's view v is
    augment_each with split(keys[b])[v]; bad keys say what to pass."""
    from contrastive_jax.errors import ConfigError

    shape = (16, 40, 1) if kind == "signal" else (16, 8, 8, 3)
    x = jax.random.uniform(jax.random.key(1), shape)
    config = default_augment_config(kind)
    keys = jax.random.split(jax.random.key(2), 16)
    v1, v2 = two_views_each(x, keys, config)
    order = np.r_[8:16, 0:8]
    w1, w2 = two_views_each(x[order], keys[order], config)
    np.testing.assert_array_equal(w1, v1[order])
    np.testing.assert_array_equal(w2, v2[order])
    assert not np.allclose(v1, v2)
    split = jax.vmap(jax.random.split)(keys)
    # augment_each over [x; x] with keys [split[:, 0]; split[:, 1]]: each example with its own
    # key (as above), and the op-by-op programs of the same 2B-row shapes as two_views_each's.
    both = augment_each(jnp.concatenate([x, x]), jnp.concatenate([split[:, 0], split[:, 1]]),
                        config)
    np.testing.assert_array_equal(both[16:], v2)
    np.testing.assert_array_equal(both[:16], v1)
    with pytest.raises(ConfigError, match=r"keys must be \(16,\) typed PRNG keys"):
        augment_each(x, jax.random.key(0), config)
