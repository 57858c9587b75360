"""Images on the host: decode (at reduced size where the crop allows), crop, resize, uint8 out.

Three ways to a ``size x size`` uint8 RGB array:

- :func:`center_crop` (evaluation; training with ``crop="center"``): the shorter side resized
  to ``size``, then the central ``size x size`` (CLIP's and open_clip's evaluation transform,
  ``Resize(size) + CenterCrop(size)``, open_clip's ``resize_mode="shortest"``);
- :func:`squash_resize` (open_clip's ``resize_mode="squash"``, its SigLIP evaluation
  transform ``Resize((size, size))``): the whole image resized to ``size x size``, the aspect
  ratio not kept;
- :func:`random_resized_crop` (training): a box of area fraction ``~ U(scale)`` and aspect ratio
  ``~ logU(ratio)`` at a uniform position, resized to ``size x size``; torchvision's
  ``RandomResizedCrop`` sampler (10 tries, then the centre crop of the clamped ratio), as
  open_clip trains (scale (0.9, 1.0)) and big_vision's inception crop (scale (0.05, 1.0));
  :func:`random_resized_crops` draws several such crops of one decode (SimCLR's two views).

``resize`` is ``"bicubic"`` (CLIP, open_clip) or ``"bilinear"``; PIL's filters, which widen
their support when shrinking (antialiased), as torchvision's on PIL images. As in open_clip,
an RGB, grayscale or RGBA image is resized in its own mode and converted to RGB after the
crop; a palette or CMYK image is converted first. The evaluation crop of an encoded image
equals open_clip's evaluation transform pixel for pixel (tests/test_image_input.py, on a
fixture open_clip wrote).

**Reduced-size decoding.** A JPEG's DCT lets the decoder produce the image at 1/2, 1/4 or 1/8
of its size for much less work (PIL's ``Image.draft``). With ``reduced_decode=True`` a JPEG is
decoded at the smallest of those sizes at which the region that is resized to ``size x size``
still has at least ``size`` pixels each way, so the output is never upsampled from fewer pixels
than a full decode would give; the pixels differ from a full decode's by the decoder's
downscaling (benchmarks/image_input_bench.py measures both). Other formats, and arrays, are
decoded in full.
"""

from __future__ import annotations

import io
import math

import numpy as np
from PIL import Image

from contrastive_jax.errors import ConfigError, DataError

RESIZE = {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR}
DRAFT_FORMATS = ("JPEG",)  # formats whose decoder can produce a reduced-size image
# modes resized as they are and converted to RGB after the crop, as open_clip's transforms do
# (grayscale; RGBA resized premultiplied by PIL, then its alpha dropped); others (palette,
# CMYK, ...) are converted to RGB first
RESIZED_AS_IS = ("RGB", "RGBA", "L", "LA")

Box = tuple[float, float, float, float]  # (left, top, width, height), pixels of the full image


def check_resize(resize: str) -> str:
    """``resize`` if it is a known method, else a ConfigError listing them."""
    if resize not in RESIZE:
        raise ConfigError(f"unknown data.preprocess.resize {resize!r}; valid: {sorted(RESIZE)}")
    return resize


def check_range(values, field: str, low: float) -> tuple[float, float]:
    """A ``(min, max)`` pair with ``low < min <= max`` (``crop_scale``: ``max <= 1``)."""
    try:
        lo, hi = (float(v) for v in values)
    except (TypeError, ValueError):
        raise ConfigError(f"data.preprocess.{field} must be a pair (min, max); got "
                          f"{values!r}") from None
    if not low < lo <= hi or (field == "crop_scale" and hi > 1):
        bound = "0 < min <= max <= 1" if field == "crop_scale" else "0 < min <= max"
        raise ConfigError(f"data.preprocess.{field} must satisfy {bound}; got {values!r}")
    return lo, hi


def open_image(image) -> Image.Image:
    """A PIL image, not yet decoded if ``image`` is encoded bytes (so that :func:`_decode` can
    still ask for a reduced size); an ``(H, W, 3)`` uint8 array is wrapped as it is."""
    if isinstance(image, bytes | np.bytes_):
        try:
            return Image.open(io.BytesIO(bytes(image)))
        except Exception as err:  # PIL raises several kinds for bytes that are not an image
            raise DataError(f"an example's image cannot be decoded ({err}); convert the "
                            "dataset again (python -m contrastive_jax.training.data."
                            "convert_shards skips such members)") from err
    array = np.asarray(image)
    if array.ndim != 3 or array.shape[-1] != 3 or array.dtype != np.uint8:
        raise ConfigError(f"images must be encoded bytes or (H, W, 3) uint8; got {array.shape} "
                          f"{array.dtype}")
    return Image.fromarray(array)


def _decode(pil: Image.Image, box: Box | list[Box], size: int,
            reduced: bool) -> tuple[Image.Image, Box | list[Box]]:
    """The decoded RGB image and ``box`` (or each of a list of boxes) in its pixels: at a
    reduced size (JPEG) where every box keeps ``>= size`` pixels each way, else in full."""
    boxes = box if isinstance(box, list) else [box]
    if reduced and pil.format in DRAFT_FORMATS:
        full_w, full_h = pil.size
        factor = size / min(min(b[2], b[3]) for b in boxes)  # the smallest box's scale
        if factor < 1:
            pil.draft("RGB", (math.ceil(full_w * factor), math.ceil(full_h * factor)))
            sx, sy = pil.size[0] / full_w, pil.size[1] / full_h
            boxes = [(b[0] * sx, b[1] * sy, b[2] * sx, b[3] * sy) for b in boxes]
    try:
        pil.load()
    except (OSError, SyntaxError, ValueError) as err:  # truncated or damaged data
        raise DataError(f"an example's image cannot be decoded ({err}); convert the dataset "
                        "again (python -m contrastive_jax.training.data.convert_shards skips "
                        "such members)") from err
    return (pil if pil.mode in RESIZED_AS_IS else pil.convert("RGB")), (
        boxes if isinstance(box, list) else boxes[0])


def center_crop(image, size: int, *, resize: str = "bicubic",
                reduced_decode: bool = False) -> np.ndarray:
    """``(size, size, 3)`` uint8: the shorter side resized to ``size`` (``resize``), then the
    central square, with torchvision's sizes: the longer side to ``int(size * long / short)``,
    the crop's offsets ``round((side - size) / 2)``.

    ``image``: encoded bytes or an ``(H, W, 3)`` uint8 array.
    """
    pil = open_image(image)
    w, h = pil.size
    side = min(w, h)
    pil, _ = _decode(pil, ((w - side) / 2, (h - side) / 2, side, side), size, reduced_decode)
    w, h = pil.size
    # torchvision's Resize(size): the shorter side to size, the longer int(size * long / short)
    out_w, out_h = (size, int(size * h / w)) if w <= h else (int(size * w / h), size)
    resized = pil.resize((out_w, out_h), RESIZE[check_resize(resize)])
    left, top = round((out_w - size) / 2), round((out_h - size) / 2)
    return np.asarray(resized.crop((left, top, left + size, top + size)).convert("RGB"))


RESIZE_MODES = ("shortest", "squash")
"""open_clip's evaluation resize modes this project computes: :func:`center_crop` and
:func:`squash_resize` (open_clip's ``"longest"``, resize and pad, is not one)."""


def check_resize_mode(mode: str) -> str:
    """``mode`` if it is one of :data:`RESIZE_MODES`, else a ConfigError listing them."""
    if mode not in RESIZE_MODES:
        raise ConfigError(f"unknown data.preprocess.resize_mode {mode!r}; valid: "
                          f"{list(RESIZE_MODES)} (open_clip's 'longest', resize and pad, is "
                          "not computed)")
    return mode


def evaluation_image(image, size: int, *, resize: str = "bicubic", resize_mode: str = "shortest",
                     reduced_decode: bool = False) -> np.ndarray:
    """``(size, size, 3)`` uint8 of open_clip's evaluation transform with ``resize_mode``:
    :func:`center_crop` (``"shortest"``) or :func:`squash_resize` (``"squash"``)."""
    if check_resize_mode(resize_mode) == "squash":
        return squash_resize(image, size, resize=resize)
    return center_crop(image, size, resize=resize, reduced_decode=reduced_decode)


def squash_resize(image, size: int, *, resize: str = "bicubic") -> np.ndarray:
    """``(size, size, 3)`` uint8: the whole image resized to ``size x size`` (``resize``), as
    torchvision's ``Resize((size, size))`` on a PIL image (open_clip's SigLIP evaluation
    transform, ``resize_mode="squash"``); converted to RGB after the resize.

    ``image``: encoded bytes or an ``(H, W, 3)`` uint8 array.
    """
    pil = open_image(image)
    w, h = pil.size
    pil, _ = _decode(pil, (0, 0, w, h), size, False)
    return np.asarray(pil.resize((size, size), RESIZE[check_resize(resize)]).convert("RGB"))


def crop_box(width: int, height: int, rng: np.random.Generator,
             scale: tuple[float, float], ratio: tuple[float, float]) -> Box:
    """torchvision's ``RandomResizedCrop.get_params``: up to 10 draws of area fraction
    ``U(scale)`` and log-uniform aspect ratio ``ratio`` (width / height) whose integer box fits;
    else the whole image cropped to the nearest allowed ratio, centred. ``(left, top, w, h)``."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return left, top, w, h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        w, h = round(height * ratio[1]), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def random_resized_crop(image, size: int, rng: np.random.Generator, *,
                        scale: tuple[float, float] = (0.9, 1.0),
                        ratio: tuple[float, float] = (3 / 4, 4 / 3),
                        resize: str = "bicubic", reduced_decode: bool = False) -> np.ndarray:
    """``(size, size, 3)`` uint8: the box of :func:`crop_box` (drawn on the full image's size)
    resized to ``size x size`` in one resampling (PIL's ``resize(box=...)``).

    ``image``: encoded bytes or an ``(H, W, 3)`` uint8 array; ``rng`` draws the box.
    """
    pil = open_image(image)
    box = crop_box(*pil.size, rng, scale, ratio)
    pil, (left, top, w, h) = _decode(pil, box, size, reduced_decode)
    resized = pil.resize((size, size), RESIZE[check_resize(resize)],
                         box=(left, top, left + w, top + h))
    return np.asarray(resized.convert("RGB"))


def random_resized_crops(image, size: int, rng: np.random.Generator, views: int = 2, *,
                         scale: tuple[float, float] = (0.08, 1.0),
                         ratio: tuple[float, float] = (3 / 4, 4 / 3),
                         resize: str = "bilinear", reduced_decode: bool = False) -> np.ndarray:
    """``(views, size, size, 3)`` uint8: ``views`` independent random resized crops of one
    image, decoded once (SimCLR's two views, [SimCLR] Appendix A; torchvision's
    ``RandomResizedCrop`` run ``views`` times on the decoded image).

    The boxes are :func:`crop_box` draws from ``rng``, one after another, each resized as
    :func:`random_resized_crop` does, so ``views = 1`` is :func:`random_resized_crop` with the
    same ``rng``. ``reduced_decode``: the JPEG decoded at the size the smallest box allows.
    ``resize`` defaults to ``"bilinear"``, torchvision's ``RandomResizedCrop`` default.
    """
    if isinstance(views, bool) or not isinstance(views, int) or views < 1:
        raise ConfigError(f"data.preprocess.views must be an integer >= 1; got {views!r}")
    pil = open_image(image)
    boxes = [crop_box(*pil.size, rng, scale, ratio) for _ in range(views)]
    pil, boxes = _decode(pil, boxes, size, reduced_decode)
    method = RESIZE[check_resize(resize)]
    return np.stack([np.asarray(pil.resize((size, size), method,
                                           box=(left, top, left + w, top + h)).convert("RGB"))
                     for left, top, w, h in boxes])
