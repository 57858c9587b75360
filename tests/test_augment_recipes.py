"""SimCLR's augmentation family at ImageNet scale: the recipes' settings, each op against NumPy,
each sampler's distribution by statistics, one view against a NumPy pipeline with the same
draws; the two views the input workers crop; the host cores the plan counts for them."""

import colorsys
import importlib
import io
import itertools
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from PIL import Image, ImageOps

from contrastive_jax.accelerators import tpu_slice
from contrastive_jax.errors import ConfigError
from contrastive_jax.plan.step_plan import IMAGES_PER_CORE_SECOND, Plan
from contrastive_jax.training.augmentations import (
    augment,
    augment_each,
    crop,
    family,
    image,
    recipe_augment_config,
    two_views,
    two_views_each,
)
from contrastive_jax.training.data import image_crops
from contrastive_jax.training.data.example_preprocessing import (
    encoded_images,
    image_preprocess,
    make_preprocess,
)

LUMA = np.array([0.299, 0.587, 0.114])
RESULTS = Path(__file__).resolve().parents[1] / "experiments" / "results"
report = importlib.import_module("contrastive_jax.plan.report")  # the package's name is a function


def _images(shape, seed=0):
    return np.random.default_rng(seed).uniform(size=shape).astype(np.float32)


def _settings(recipe="simclr", size=224, **changes):
    return family.freeze_recipe({**recipe_augment_config(recipe, size).to_dict(), **changes})


# --- NumPy references (float64) ------------------------------------------------------------


def np_hue(x, delta):
    out = np.empty_like(x, dtype=np.float64)
    for idx in np.ndindex(x.shape[:-1]):
        h, s, v = colorsys.rgb_to_hsv(*x[idx])
        out[idx] = colorsys.hsv_to_rgb((h + delta) % 1.0, s, v)
    return out


def np_jitter(x, factors, order):
    x = x.astype(np.float64)
    for op in order:
        if op == 0:
            x = np.clip(factors[0] * x, 0, 1)
        elif op == 1:
            m = (x @ LUMA).mean()
            x = np.clip(m + factors[1] * (x - m), 0, 1)
        elif op == 2:
            g = (x @ LUMA)[..., None]
            x = np.clip(g + factors[2] * (x - g), 0, 1)
        else:
            x = np.clip(np_hue(x, factors[3]), 0, 1)
    return x


def np_blur(x, sigma, radius):
    taps = np.arange(-radius, radius + 1)
    w = np.exp(-0.5 * (taps / sigma) ** 2)
    w /= w.sum()
    for axis in (0, 1):
        pad = [(0, 0)] * x.ndim
        pad[axis] = (radius, radius)
        p = np.pad(x.astype(np.float64), pad, mode="edge")
        n = x.shape[axis]
        x = sum(w[k] * np.take(p, np.arange(k, k + n), axis=axis) for k in range(len(w)))
    return np.clip(x, 0, 1)


def np_resize_box(x, box, size):
    top, left, h, w = (float(v) for v in box)
    for axis, (start, extent) in enumerate(((top, h), (left, w))):
        n = x.shape[axis]
        p = np.clip(start + (np.arange(size) + 0.5) * extent / size - 0.5, 0, n - 1)
        x = np.apply_along_axis(lambda line, p=p, n=n: np.interp(p, np.arange(n), line), axis,
                                x.astype(np.float64))
    return x


def np_torchvision_box(u, height, width, scale, ratio):
    """torchvision's get_params loop, its random numbers replaced by ``u``."""
    area = height * width
    for t in range(10):
        target = area * (scale[0] + (scale[1] - scale[0]) * np.float32(u[t]))
        log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
        aspect = math.exp(log_lo + (log_hi - log_lo) * np.float32(u[10 + t]))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = min(int(u[20] * (height - h + 1)), height - h)
            left = min(int(u[21] * (width - w + 1)), width - w)
            return top, left, h, w
    if width / height < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif width / height > ratio[1]:
        w, h = round(height * ratio[1]), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


# --- the recipes ---------------------------------------------------------------------------


def test_the_recipes_are_the_papers():
    simclr, v2, v3 = (recipe_augment_config(r, 224) for r in ("simclr", "moco_v2", "moco_v3"))
    for c in (simclr, v2, v3):
        assert (c.kind, c.crop, c.size, c.flip, c.jitter_p, c.grayscale) == (
            "image_recipe", "host", 224, 0.5, 0.8, 0.2)
        assert c.blur_sigma == (0.1, 2.0) and c.blur_kernel == 23 and c.crop_ratio == (0.75, 4 / 3)
    assert simclr.jitter == (0.8, 0.8, 0.8, 0.2) and simclr.crop_scale == (0.08, 1.0)
    assert simclr.blur == (0.5, 0.5) and simclr.solarize == (0.0, 0.0)
    assert v2.jitter == (0.4, 0.4, 0.4, 0.1) and v2.crop_scale == (0.2, 1.0)
    assert v3.jitter == (0.4, 0.4, 0.2, 0.1) and v3.crop_scale == (0.08, 1.0)
    assert v3.blur == (1.0, 0.1) and v3.solarize == (0.0, 0.2)
    assert recipe_augment_config("simclr", 32).blur_kernel == 3  # 10% of the side, odd
    assert _settings("simclr").symmetric and not _settings("moco_v3").symmetric


@pytest.mark.parametrize("change, message", [
    ({"flip": 1.5}, r"augment\.flip must lie in \[0, 1\]"),
    ({"blur": (0.5, 0.5, 0.5)}, r"augment\.blur must be a probability or a pair"),
    ({"blur_kernel": 22}, r"augment\.blur_kernel must be odd"),
    ({"jitter": (0.8, 0.8, 0.8, 0.6)}, r"hue <= 0\.5"),
    ({"crop": "workers"}, r"augment\.crop must be 'host'"),
    ({"crop_scale": (0.08, 1.2)}, r"augment\.crop_scale must be \(min, max\)"),
    ({"colour": 0.8}, r"unknown field\(s\) \['colour'\]"),
])
def test_a_bad_recipe_config_is_one_line_naming_the_field(change, message):
    config = {**recipe_augment_config("simclr", 32).to_dict(), **change}
    with pytest.raises(ConfigError, match=message):
        augment(jnp.zeros((2, 32, 32, 3)), jax.random.key(0), config, view=0)
    with pytest.raises(ConfigError, match="unknown augmentation recipe 'byol'"):
        recipe_augment_config("byol")
    with pytest.raises(ConfigError, match=r"augment\.crop must be 'host'"):
        recipe_augment_config("simclr", crop="workers")


# --- the deterministic ops against NumPy ---------------------------------------------------


def test_hsv_hue_shift_is_colorsys_and_keeps_greys():
    x = _images((6, 7, 3), 1)
    x[0, 0] = [0.3, 0.3, 0.3]  # a grey
    x[0, 1] = [0.9, 0.9, 0.2]  # two channels at the max
    for delta in (0.0, 0.2, -0.2, 0.5, 1 / 3):
        np.testing.assert_allclose(family.adjust_hue_hsv(jnp.asarray(x), delta),
                                   np_hue(x, delta), atol=2e-6)
    np.testing.assert_allclose(family.adjust_hue_hsv(jnp.asarray(x), 0.37)[0, 0], 0.3, atol=1e-7)
    one = jnp.asarray(x[..., :1])
    assert family.adjust_hue_hsv(one, 0.2) is one


def test_colour_jitter_applies_the_four_ops_in_the_given_order():
    x = _images((5, 6, 3), 2)
    factors = np.array([1.6, 0.4, 1.7, 0.15], np.float32)
    jitter = jax.jit(family.color_jitter)
    results = {}
    for order in itertools.permutations(range(4)):
        y = np.asarray(jitter(jnp.asarray(x), jnp.asarray(factors), jnp.asarray(order)))
        np.testing.assert_allclose(y, np_jitter(x, factors, order), atol=3e-6)
        results[order] = y
    assert len({y.round(4).tobytes() for y in results.values()}) == 24  # the order matters


def test_blur_is_the_edge_padded_gaussian_and_equals_the_gather_form():
    x = _images((20, 17, 3), 3)
    for sigma in (0.1, 0.9, 2.0):
        y = family.gaussian_blur(jnp.asarray(x), sigma, 5)
        np.testing.assert_allclose(y, np_blur(x, sigma, 5), atol=2e-6)
        np.testing.assert_allclose(y, image.blur_image(jnp.asarray(x), sigma, 5), atol=2e-6)
    xj = jnp.asarray(x)
    assert family.gaussian_blur(xj, 1.0, 0) is xj  # a 1-tap kernel: the image itself


def test_solarize_inverts_from_one_half_as_pil_does_at_128():
    pixels = np.arange(256, dtype=np.uint8).reshape(16, 16, 1).repeat(3, -1)
    y = family.solarize(jnp.asarray(pixels / np.float32(255)))
    np.testing.assert_allclose(y, np.where(pixels < 128, pixels, 255 - pixels) / 255, atol=1e-7)
    pil = np.asarray(ImageOps.solarize(Image.fromarray(pixels), 128)) / np.float32(255)
    np.testing.assert_allclose(y, pil, atol=1e-7)


def test_the_device_crop_resizes_a_box_bilinearly():
    x = _images((24, 20, 3), 4)
    for box, size in (((3, 2, 13, 11), 16), ((0, 0, 24, 20), 9), ((5, 1, 7, 18), 30)):
        np.testing.assert_allclose(crop.resize_box(jnp.asarray(x), jnp.asarray(box), size),
                                   np_resize_box(x, box, size), atol=2e-6)
    square = _images((16, 16, 3), 5)
    np.testing.assert_allclose(crop.resize_box(jnp.asarray(square), jnp.asarray((0, 0, 16, 16)),
                                               16), square, atol=1e-7)  # the identity
    np.testing.assert_allclose(  # the image op's crop, at the input's size
        crop.resize_box(jnp.asarray(square), jnp.asarray((2, 3, 9, 11)), 16),
        image.resized_crop_image(jnp.asarray(square), 2.0, 3.0, 9.0, 11.0), atol=2e-6)


@pytest.mark.parametrize("height, width, scale, ratio", [
    (256, 256, (0.08, 1.0), (3 / 4, 4 / 3)), (30, 70, (0.2, 1.0), (3 / 4, 4 / 3)),
    (40, 40, (0.95, 1.0), (3.0, 4.0)),  # no try fits: the fallback
])
def test_the_device_crop_box_is_torchvisions_loop_on_the_same_numbers(height, width, scale,
                                                                      ratio):
    u = np.asarray(jax.random.uniform(jax.random.key(7), (300, crop.DRAWS)))
    boxes = np.asarray(jax.jit(jax.vmap(lambda v: crop.torchvision_crop_box(
        v, height, width, scale, ratio)))(jnp.asarray(u)))
    expected = np.array([np_torchvision_box(v, height, width, scale, ratio) for v in u])
    np.testing.assert_array_equal(boxes, expected)
    if ratio[0] == 3.0:
        assert (boxes == (13, 0, 13, 40)).all()


# --- the samplers' distributions -----------------------------------------------------------

N = 6000


def _ks_uniform(samples, lo, hi):
    s = np.sort((np.asarray(samples, np.float64) - lo) / (hi - lo))
    i = np.arange(1, len(s) + 1)
    return max(np.max(i / len(s) - s), np.max(s - (i - 1) / len(s)))


KS_UNIFORM = math.sqrt(-0.5 * math.log(1e-6 / 2) / N)  # the 1e-6 critical value, one sample


@pytest.mark.parametrize("recipe", ["simclr", "moco_v2", "moco_v3"])
def test_each_view_fires_its_ops_at_the_recipes_rates(recipe):
    settings = _settings(recipe)
    keys = jax.random.split(jax.random.key(11), N)
    for view in (0, 1):
        d = jax.device_get(jax.jit(jax.vmap(
            lambda k, v=view: family.recipe_draws(k, settings, v)))(keys))
        for name, field in (("flip", "flip"), ("jitter", "jitter_p"),
                            ("grayscale", "grayscale"), ("blur", "blur"),
                            ("solarize", "solarize")):
            p = getattr(settings, field)[view]
            rate = d[name].mean()
            assert abs(rate - p) <= 5 * math.sqrt(p * (1 - p) / N) + 1e-12, (name, view, rate)
        b, c, s, h = settings.jitter
        for k, (lo, hi) in enumerate(((1 - b, 1 + b), (1 - c, 1 + c), (1 - s, 1 + s), (-h, h))):
            f = d["factors"][:, k]
            assert lo <= f.min() and f.max() <= hi and _ks_uniform(f, lo, hi) < KS_UNIFORM
            assert f.min() < lo + 0.01 * (hi - lo) and f.max() > hi - 0.01 * (hi - lo)
        assert _ks_uniform(d["sigma"], 0.1, 2.0) < KS_UNIFORM
        counts = np.unique([tuple(o) for o in d["order"]], axis=0, return_counts=True)[1]
        assert len(counts) == 24  # every order, equally often: chi-square, 23 dof, p = 1e-6
        assert ((counts - N / 24) ** 2 / (N / 24)).sum() < 61.1


def _ks_two(a, b):
    grid = np.sort(np.concatenate([a, b]))
    return np.abs(np.searchsorted(np.sort(a), grid, "right") / len(a)
                  - np.searchsorted(np.sort(b), grid, "right") / len(b)).max()


def test_the_device_crop_box_draws_the_host_samplers_distribution():
    """Area fraction and log aspect of the device's boxes against the host's
    (image_crops.crop_box, torchvision's sampler): two-sample KS below its 1e-6 critical value;
    the host sampler at MoCo v2's scale (0.2-1) is far above it."""
    u = jax.random.uniform(jax.random.key(3), (N, crop.DRAWS))
    device = np.asarray(jax.jit(jax.vmap(lambda v: crop.torchvision_crop_box(
        v, 256, 256, (0.08, 1.0), (3 / 4, 4 / 3))))(u))
    rng = np.random.default_rng(3)
    host, other = (np.array([image_crops.crop_box(256, 256, rng, scale, (3 / 4, 4 / 3))
                             for _ in range(N)]) for scale in ((0.08, 1.0), (0.2, 1.0)))
    critical = math.sqrt(-0.5 * math.log(1e-6 / 2)) * math.sqrt(2 / N)
    area = device[:, 2] * device[:, 3] / 256 ** 2
    assert _ks_two(area, host[:, 2] * host[:, 3] / 256 ** 2) < critical
    assert _ks_two(np.log(device[:, 3] / device[:, 2]), np.log(host[:, 2] / host[:, 3])) < critical
    assert _ks_two(area, other[:, 2] * other[:, 3] / 256 ** 2) > 2 * critical


# --- one view, the batch functions ---------------------------------------------------------


def _np_view(x, draws, settings, view):
    if settings.crop == "device":
        u = np.asarray(jax.random.uniform(draws["crop_key"], (crop.DRAWS,)))
        box = np_torchvision_box(u, *x.shape[:2], settings.crop_scale, settings.crop_ratio)
        x = np.clip(np_resize_box(x, box, settings.size), 0, 1)
    steps = [("flip", "flip", lambda y: y[:, ::-1]),
             ("jitter", "jitter_p", lambda y: np_jitter(y, np.asarray(draws["factors"]),
                                                        np.asarray(draws["order"]))),
             ("grayscale", "grayscale", lambda y: np.repeat((y @ LUMA)[..., None], 3, -1)),
             ("blur", "blur", lambda y: np_blur(y, float(draws["sigma"]), settings.blur_radius)),
             ("solarize", "solarize", lambda y: np.where(y < 0.5, y, 1 - y))]
    for name, field, op in steps:
        if getattr(settings, field)[view] > 0 and bool(draws[name]):
            x = op(x)
    return x


@pytest.mark.parametrize("recipe, crop_at", [("moco_v3", "host"), ("simclr", "device")])
def test_a_view_is_the_numpy_pipeline_on_the_same_draws(recipe, crop_at):
    settings = _settings(recipe, 12, crop=crop_at, blur_kernel=5, grayscale=0.5, solarize=0.5)
    x = _images((16, 14, 3) if crop_at == "device" else (12, 12, 3), 6)
    view_of = jax.jit(family.recipe_view, static_argnums=(2, 3))
    fired = set()
    for i in range(12):
        key = jax.random.key(100 + i)
        for view in (0, 1):
            draws = family.recipe_draws(key, settings, view)
            fired |= {n for n in ("flip", "jitter", "grayscale", "blur", "solarize")
                      if bool(draws[n])}
            np.testing.assert_allclose(view_of(jnp.asarray(x), key, settings, view),
                                       _np_view(x, draws, settings, view), atol=2e-5)
    assert fired == {"flip", "jitter", "grayscale", "blur", "solarize"}


def test_two_views_of_host_crops_take_each_view_from_its_own_crop():
    config = recipe_augment_config("moco_v3", 8)
    batch = jnp.asarray(_images((3, 2, 8, 8, 3), 7))
    keys = jax.random.split(jax.random.key(4), 3)
    settings = family.freeze_recipe(dict(config.items()))
    v1, v2 = two_views_each(batch, keys, config)
    for b in range(3):
        k1, k2 = jax.random.split(keys[b])
        np.testing.assert_allclose(v1[b], family.recipe_view(batch[b, 0], k1, settings, 0),
                                   atol=2e-6)  # eager against the jitted batch: rounding
        np.testing.assert_allclose(v2[b], family.recipe_view(batch[b, 1], k2, settings, 1),
                                   atol=2e-6)
    # MoCo's form: one view at a time with the view's keys; a micro-batch draws the same rows
    view_keys = jax.vmap(jax.random.split)(keys)[:, 1]
    np.testing.assert_array_equal(augment_each(batch, view_keys, config, view=1), v2)
    np.testing.assert_array_equal(augment_each(batch[1:], view_keys[1:], config, view=1), v2[1:])
    w1, _ = two_views(batch, jax.random.key(9), config)
    np.testing.assert_array_equal(
        w1, augment(batch, jax.random.split(jax.random.key(9))[0], config, view=0))
    with pytest.raises(ConfigError, match="pass view=0 or view=1"):
        augment_each(batch, keys, config)
    with pytest.raises(ConfigError, match="draws its two views differently"):
        augment_each(batch[:, 0], keys, config)
    with pytest.raises(ConfigError, match="view must be 0 or 1"):
        augment_each(batch, keys, config, view=2)
    device = recipe_augment_config("simclr", 6, crop="device")
    with pytest.raises(ConfigError, match="needs an augment recipe with crop='host'"):
        two_views_each(batch, keys, device)
    d1, d2 = two_views_each(batch[:, 0], keys, device)  # (3, 8, 8, 3) -> (3, 6, 6, 3)
    assert d1.shape == d2.shape == (3, 6, 6, 3) and d1.dtype == jnp.float32
    assert 0 <= float(d1.min()) and float(d1.max()) <= 1


# --- the host: two crops of one decode, the preprocessing ----------------------------------


def _jpeg(width, height, seed=0):
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(coarse).resize((width, height), Image.BICUBIC).save(buffer, format="JPEG")
    return buffer.getvalue()


def test_host_views_are_crop_box_draws_of_one_decode():
    data = _jpeg(90, 70)
    full = Image.open(io.BytesIO(data)).convert("RGB")
    views = image_crops.random_resized_crops(data, 24, np.random.default_rng(5), 2)
    rng = np.random.default_rng(5)
    for view in views:
        left, top, w, h = image_crops.crop_box(90, 70, rng, (0.08, 1.0), (3 / 4, 4 / 3))
        expected = full.resize((24, 24), Image.BILINEAR, box=(left, top, left + w, top + h))
        np.testing.assert_array_equal(view, np.asarray(expected))
    assert views.shape == (2, 24, 24, 3) and views.dtype == np.uint8
    one = image_crops.random_resized_crops(data, 24, np.random.default_rng(6), 1, resize="bicubic")
    np.testing.assert_array_equal(one[0], image_crops.random_resized_crop(
        data, 24, np.random.default_rng(6), scale=(0.08, 1.0)))
    # reduced decode: the draft that keeps the smaller box at >= size pixels each way
    pil = Image.open(io.BytesIO(_jpeg(1280, 960)))
    decoded, boxes = image_crops._decode(pil, [(0, 0, 900, 900), (10, 20, 500, 480)], 224, True)
    assert decoded.size == (640, 480) and boxes[1] == (5.0, 10.0, 250.0, 240.0)


def test_the_image_preprocessing_gives_two_views_per_position_and_one_evaluation_crop():
    data = {"image": _jpeg(80, 60, 1), "label": np.int64(3)}
    train = image_preprocess(image_size=16, views=2, crop="random", extra_features=("label",),
                             training=True, seed=4)
    a, b = train(data, 0, 7), train(data, 5, 7)
    assert a["image"].shape == (2, 16, 16, 3) and a["image"].dtype == np.uint8
    np.testing.assert_array_equal(a["image"], b["image"])  # the position draws, not the epoch
    assert not np.array_equal(a["image"], train(data, 0, 8)["image"])
    assert not np.array_equal(a["image"][0], a["image"][1]) and a["label"] == 3
    evaluation = image_preprocess(image_size=16, views=2, crop="random", training=False)(data)
    np.testing.assert_array_equal(evaluation["image"], image_crops.center_crop(
        data["image"], 16, resize="bilinear"))
    assert image_preprocess(image_size=16, crop="random", training=True)(data)["image"].shape == (
        16, 16, 3)
    block = ml_collections.ConfigDict({"preprocess": {"name": "image", "image_size": 16,
                                                      "views": 2, "crop": "random"}, "seed": 4})
    np.testing.assert_array_equal(make_preprocess(block, training=True)(data, 0, 7)["image"],
                                  a["image"])
    assert encoded_images(block) == ("image",)
    for bad, message in (({"views": 2}, "needs crop='random'"), ({"views": 0}, "views must be")):
        with pytest.raises(ConfigError, match=message):
            image_preprocess(**bad)


def test_a_host_cropped_recipe_needs_the_preprocessing_that_crops_its_views():
    augment = recipe_augment_config("moco_v2", 224)
    good = {"name": "image", "image_size": 224, "views": 2, "crop": "random",
            "crop_scale": augment.crop_scale, "crop_ratio": augment.crop_ratio}
    family.check_recipe_input(augment, ml_collections.ConfigDict(good))
    for change, message in (({"views": 1}, "views=2"), ({"crop_scale": (0.08, 1.0)},
                                                        r"crop_scale=\(0\.2, 1\.0\)"),
                            ({"name": "image_text"}, "name='image'"),
                            ({"image_size": 256}, "image_size=224")):
        with pytest.raises(ConfigError, match=message):
            family.check_recipe_input(augment, {**good, **change})
    device = recipe_augment_config("simclr", 224, crop="device")
    family.check_recipe_input(device, {"name": "image", "image_size": 256})
    with pytest.raises(ConfigError, match="views = 1"):
        family.check_recipe_input(device, good)
    family.check_recipe_input(ml_collections.ConfigDict({"kind": "image"}), {})  # not a recipe


# --- the plan's host cores -----------------------------------------------------------------


def _config(preprocess):
    return ml_collections.ConfigDict({"data": {"preprocess": preprocess}})


def test_the_plan_counts_a_decode_and_two_crops_per_example():
    """At 10,000 examples/s per host, the SimCLR family's input (decode + two 224 crops)
    takes ceil(10,000 / TWO_VIEW_EXAMPLES_PER_CORE_SECOND) cores per host (19 at 534.6); a
    third crop costs what the second one did."""
    two = {"name": "image", "views": 2, "crop": "random", "image_size": 224}
    host = report.host_input(_config(two))
    assert host.examples_per_core_s == pytest.approx(report.TWO_VIEW_EXAMPLES_PER_CORE_SECOND)
    assert "2 random resized crops at 224" in host.work
    one = report.host_input(_config({**two, "views": 1}))
    assert one.examples_per_core_s == pytest.approx(report.ONE_VIEW_EXAMPLES_PER_CORE_SECOND)
    three = report.host_input(_config({**two, "views": 3})).examples_per_core_s
    crop_s = 1 / report.TWO_VIEW_EXAMPLES_PER_CORE_SECOND - 1 / one.examples_per_core_s
    assert 1 / three == pytest.approx(1 / report.TWO_VIEW_EXAMPLES_PER_CORE_SECOND + crop_s)
    assert report.host_input(_config({"name": "image", "image_size": 256})).examples_per_core_s \
        == report.CENTRE_256_EXAMPLES_PER_CORE_SECOND
    clip = report.host_input(_config({"name": "image_text"}))
    assert clip.examples_per_core_s == IMAGES_PER_CORE_SECOND
    assert report.host_input(_config({"name": "standard"}), images=False) is None
    target = tpu_slice("v4-256")  # 32 hosts, 275 TFLOP/s a chip
    p = Plan(128, 32768, 1, 0, 0, 0, 0, 0, 0, 0, 1.0, flops=0.1024 * 0.5 * 275e12)
    speed = report.Speed.of(p, p.flops, target, 0.5, host)
    assert speed.examples_per_s_per_host == pytest.approx(10_000)
    rate = report.TWO_VIEW_EXAMPLES_PER_CORE_SECOND
    assert speed.host_cores == pytest.approx(10_000 / rate)
    text = report.target_report(p, "simclr", target, None, speed)
    assert (f"host CPU cores for input   {math.ceil(10_000 / rate)} per host (at {rate:.1f} "
            "examples per core-second, decode + 2 random resized crops at 224: "
            "experiments/results/image_input_views.md)") in text
    assert report.Speed.of(p, p.flops, target, 0.5, clip).host_cores == pytest.approx(
        10_000 / IMAGES_PER_CORE_SECOND)


def test_the_host_rates_are_the_committed_tables():
    rows = {}
    for line in (RESULTS / "image_input_views.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| (") and len(cells) == 4 and not cells[2].endswith("%"):
            rows[cells[0]] = float(cells[2])
    assert rows["(a) decode + 2 random resized crops to 224, bilinear"] == \
        report.TWO_VIEW_EXAMPLES_PER_CORE_SECOND
    assert rows["(a) decode + 1 random resized crop to 224, bilinear"] == \
        report.ONE_VIEW_EXAMPLES_PER_CORE_SECOND
    assert rows["(b) decode + shorter side to 256 + centre 256, bilinear"] == \
        report.CENTRE_256_EXAMPLES_PER_CORE_SECOND
