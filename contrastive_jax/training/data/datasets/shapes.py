"""``shapes``: generated 32 x 32 RGB images of ten shapes in random colours, a CPU-sized image task
on which SimCLR's colour augmentations matter.

Each image holds one shape of :data:`SHAPE_NAMES` (the label), mirrored left-right or not and
turned by a uniform angle, of outer radius ``~ U(9, 14)`` pixels (large: most crops of the
image hold part of it) at a uniform position with the whole shape inside, on a plain background,
plus Gaussian noise of standard deviation 6 / 255 per pixel and channel. Of
the image's two colours one is light and one dark (HSV: hue uniform, saturation ``~ U(0,
0.7)``, value ``~ U(0.75, 0.95)`` or ``~ U(0.1, 0.3)``, so the shape shows in grey too); which
one fills the shape is a coin flip. The shape is drawn with 4 x 4 samples a pixel (its edges
antialiased); the image is stored as JPEG (quality 95, no chroma subsampling), decoded and
cropped on the host as ImageNet's are (the ``image`` preprocessing).

**Colour says nothing about the class.** The colours are drawn independently of the label (the
generator draws the same numbers whatever the label, which only picks the shape's mask), so
the per-class mean colour is the same for every class and a probe on colour histograms scores
chance (tests/test_datasets.py). Two crops of one image share its two colours, so without
colour distortion contrastive learning tells an image's views from the others' by colour alone
and learns no shape ([SimCLR] §3, Figure 5-6: with crops alone, colour histograms suffice to
match the views); position and scale are what the crops change, and mirroring what the flips
change. What is left to tell an image from the others is its shape and the shape's angle,
which an encoder can only see through the shape's outline. Measured in
experiments/ssl_recipes.py.

Splits (fixed): ``train`` 20,000 and ``test`` 2,000 images, classes balanced (label ``i mod
10`` for the ``i``-th image); image ``i`` of a split drawn by ``numpy.random.default_rng((seed,
i))`` (seeds :data:`SPLIT_SEEDS`), so :func:`shapes_example` regenerates any one.

Features: ``image`` (JPEG, 32 x 32 x 3), ``label`` (``ClassLabel`` of :data:`SHAPE_NAMES`),
``index`` (``i``).

References:
  [SimCLR] T. Chen, S. Kornblith, M. Norouzi, G. Hinton 2020, §3 and Appendix A
  (docs/references.md).
"""

from __future__ import annotations

import colorsys
import io
from collections.abc import Callable
from typing import ClassVar

import numpy as np
import tensorflow_datasets as tfds

SIZE = 32
SHAPE_NAMES = ("disc", "ring", "square", "frame", "triangle", "cross", "star", "crescent",
               "half_disc", "corner")
SPLITS = {"train": 20_000, "test": 2_000}
SPLIT_SEEDS = {"train": 0, "test": 1}
SUPERSAMPLE = 4
RADIUS = (9.0, 14.0)  # the shape's outer radius, pixels
EXTENT = 1.1  # every shape lies within EXTENT x its radius of its centre
SATURATION = 0.7  # the colours' largest HSV saturation
LIGHT, DARK = (0.75, 0.95), (0.1, 0.3)  # HSV value of the light and the dark colour
NOISE = 6.0 / 255
JPEG_QUALITY = 95
_FINE_Y, _FINE_X = np.meshgrid(*(np.arange(SIZE * SUPERSAMPLE) + 0.5,) * 2, indexing="ij")
_FINE_Y, _FINE_X = _FINE_Y / SUPERSAMPLE, _FINE_X / SUPERSAMPLE  # sample points, pixels


def _polygon(vertices: np.ndarray) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """Inside test of a polygon star-shaped about the origin (vertices counter-clockwise, by
    angle): the point is on the origin's side of the edge its angle falls on."""
    angles = np.arctan2(vertices[:, 1], vertices[:, 0]) % (2 * np.pi)
    order = np.argsort(angles)
    vertices, angles = vertices[order], angles[order]
    nxt = np.roll(vertices, -1, axis=0)

    def inside(u, v):
        phi = np.arctan2(v, u) % (2 * np.pi)
        k = (np.searchsorted(angles, phi, side="right") - 1) % len(vertices)
        (ax, ay), (bx, by) = np.moveaxis(vertices[k], -1, 0), np.moveaxis(nxt[k], -1, 0)
        return (bx - ax) * (v - ay) - (by - ay) * (u - ax) >= 0

    return inside


def _regular(n: int, radii: tuple[float, ...], phase: float = np.pi / 2) -> np.ndarray:
    """``n * len(radii)`` vertices at equal angles, radii cycling through ``radii``."""
    m = n * len(radii)
    t = phase + 2 * np.pi * np.arange(m) / m
    r = np.resize(np.asarray(radii), m)
    return np.stack([r * np.cos(t), r * np.sin(t)], axis=-1)


_TRIANGLE = _polygon(_regular(3, (0.95,)))
_STAR = _polygon(_regular(5, (0.98, 0.42)))


def _box(u, v, lo_u, hi_u, lo_v, hi_v):
    return (u >= lo_u) & (u <= hi_u) & (v >= lo_v) & (v <= hi_v)


SHAPES: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    # each in the shape's own units: outer radius about 1 (pixels: u * radius)
    "disc": lambda u, v: u * u + v * v <= 0.8 ** 2,
    "ring": lambda u, v: (u * u + v * v <= 0.92 ** 2) & (u * u + v * v >= 0.52 ** 2),
    "square": lambda u, v: np.maximum(abs(u), abs(v)) <= 0.66,
    "frame": lambda u, v: (np.maximum(abs(u), abs(v)) <= 0.72)
    & (np.maximum(abs(u), abs(v)) >= 0.38),
    "triangle": _TRIANGLE,
    "cross": lambda u, v: _box(u, v, -0.28, 0.28, -0.9, 0.9) | _box(u, v, -0.9, 0.9, -0.28, 0.28),
    "star": _STAR,
    "crescent": lambda u, v: (u * u + v * v <= 0.9 ** 2) & ((u - 0.42) ** 2 + v * v >= 0.72 ** 2),
    "half_disc": lambda u, v: (u * u + (v + 0.35) ** 2 <= 0.95 ** 2) & (v >= -0.35),
    "corner": lambda u, v: _box(u, v, -0.75, -0.2, -0.75, 0.75) | _box(u, v, -0.75, 0.75, -0.75,
                                                                       -0.2),
}


def shape_colours(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``(shape, background)`` RGB colours in [0, 1]: a light and a dark one (HSV, module
    docstring), in an order drawn by a coin flip."""
    light, dark = (np.array(colorsys.hsv_to_rgb(rng.uniform(), rng.uniform(0, SATURATION),
                                                rng.uniform(*value))) for value in (LIGHT, DARK))
    return (light, dark) if rng.uniform() < 0.5 else (dark, light)


def shape_placement(rng: np.random.Generator) -> tuple[float, float, float, float, float]:
    """``(cx, cy, radius, mirror, angle)``: radius ``~ U(RADIUS)``, the centre uniform with the
    disc of that radius inside the image, ``mirror`` +-1 (a coin flip), the rotation ``angle ~
    U(0, 2 pi)`` (counter-clockwise, after the mirroring)."""
    radius = rng.uniform(*RADIUS)
    cx, cy = rng.uniform(radius, SIZE - radius, size=2)
    return cx, cy, radius, float(rng.choice((-1.0, 1.0))), rng.uniform(0.0, 2 * np.pi)


def shape_cover(label: int, placement: tuple[float, ...]) -> np.ndarray:
    """``(32, 32)`` float: the fraction of each pixel's 4 x 4 sample points (pixel ``i``'s at
    ``i + (j + 0.5) / 4``) inside shape ``SHAPE_NAMES[label]`` placed as ``placement``
    (:func:`shape_placement`; the shape's axes: u to the right, mirrored if ``mirror < 0``, v
    up, then turned by ``angle``)."""
    cx, cy, radius, mirror, angle = placement
    x, y = (_FINE_X - cx) / radius, (cy - _FINE_Y) / radius  # image axes, y up
    u = np.cos(angle) * x + np.sin(angle) * y  # the point in the shape's own axes
    v = -np.sin(angle) * x + np.cos(angle) * y
    inside = SHAPES[SHAPE_NAMES[label]](mirror * u, v)
    return inside.reshape(SIZE, SUPERSAMPLE, SIZE, SUPERSAMPLE).mean(axis=(1, 3))


def shapes_image(label: int, rng: np.random.Generator) -> np.ndarray:
    """One ``(32, 32, 3)`` uint8 image of shape ``SHAPE_NAMES[label]`` (module docstring), drawn
    from ``rng``; the numbers drawn are the same whatever ``label`` is."""
    placement = shape_placement(rng)
    fill, background = shape_colours(rng)
    cover = shape_cover(label, placement)[..., None]
    image = (1 - cover) * background + cover * fill + rng.normal(0, NOISE, size=(SIZE, SIZE, 3))
    return np.round(np.clip(image, 0, 1) * 255).astype(np.uint8)


def encode_jpeg(image: np.ndarray) -> bytes:
    """``image`` (H, W, 3) uint8 as JPEG bytes (quality :data:`JPEG_QUALITY`, 4:4:4)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=JPEG_QUALITY, subsampling=0)
    return buffer.getvalue()


def shapes_example(split: str, index: int) -> dict:
    """Example ``index`` of ``split``: ``{"image": (32, 32, 3) uint8 (before JPEG), "label",
    "index"}``, label ``index mod 10``, drawn by ``default_rng((SPLIT_SEEDS[split], index))``."""
    label = index % len(SHAPE_NAMES)
    rng = np.random.default_rng((SPLIT_SEEDS[split], index))
    return {"image": shapes_image(label, rng), "label": label, "index": index}


class Shapes(tfds.core.GeneratorBasedBuilder):
    """Ten shapes in random colours, 32 x 32 RGB: 20,000 train / 2,000 test images."""

    name = "shapes"
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES: ClassVar[dict[str, str]] = {
        "1.0.0": "10 shapes, light/dark colours, random position/scale/mirror/angle, 20000/2000, "
                 "JPEG."}

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=__doc__,
            features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(SIZE, SIZE, 3), encoding_format="jpeg"),
                "label": tfds.features.ClassLabel(names=SHAPE_NAMES),
                "index": tfds.features.Scalar(dtype=np.int32),
            }),
            supervised_keys=("image", "label"),
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # generated here
        return {split: self._generate_examples(split, n) for split, n in SPLITS.items()}

    def _generate_examples(self, split, n):
        for i in range(n):
            example = shapes_example(split, i)
            yield i, {**example, "image": encode_jpeg(example["image"])}
