"""Position embeddings moved to another image size or context length ([CLIPA], [FLIP]).

A ViT's ``positions (1, prefix + g^2, width)`` hold ``prefix`` leading rows (the class token's)
and a ``g x g`` grid of patch rows; a model of another ``image_size`` (same patch) has another
grid ``g'``. :func:`resample_grid_positions` keeps the prefix rows and resizes the grid
bicubically, as open_clip's ``resize_pos_embed`` (``F.interpolate(mode="bicubic",
antialias=True, align_corners=False)``: Keys' cubic with ``a = -0.5``, widened by the scale when
shrinking; here :func:`jax.image.resize`'s ``"bicubic"``, equal to it to float32 rounding on a
torch-made fixture, tests/test_position_resampling.py). A text tower's ``positions (1, T,
width)`` into a shorter context keep their first rows (:func:`truncated_text_positions`); a
longer one has rows no run learned, and is refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from contrastive_jax.errors import ConfigError


def grid_side(rows: int, prefix: int, what: str) -> int:
    """``g`` with ``rows == prefix + g^2``, else a :class:`ConfigError` (not a square grid)."""
    side = math.isqrt(max(rows - prefix, 0))
    if rows - prefix < 1 or side * side != rows - prefix:
        raise ConfigError(f"{what}: {rows} position rows minus {prefix} class-token row(s) is "
                          f"not a square grid of patches; only a square patch grid resamples")
    return side


def resample_grid_positions(positions: np.ndarray, rows: int, prefix: int,
                            what: str = "positions") -> np.ndarray:
    """``positions (1, prefix + g^2, width)`` -> ``(1, rows, width)``, ``rows = prefix + g'^2``:
    the prefix rows as they are, the ``g x g`` grid resized to ``g' x g'`` (bicubic,
    antialiased when shrinking; row-major, as the patches are). Same dtype as the input."""
    positions = np.asarray(positions)
    if positions.ndim != 3 or positions.shape[0] != 1:
        raise ConfigError(f"{what}: expected position embeddings of shape (1, rows, width); "
                          f"got {positions.shape}")
    old = grid_side(positions.shape[1], prefix, what)
    new = grid_side(rows, prefix, what)
    width = positions.shape[2]
    grid = jnp.asarray(positions[0, prefix:].reshape(old, old, width), jnp.float32)
    resized = jax.image.resize(grid, (new, new, width), method="bicubic", antialias=True)
    out = np.concatenate([positions[0, :prefix].astype(np.float32),
                          np.asarray(resized).reshape(new * new, width)])
    return out[None].astype(positions.dtype)


def truncated_text_positions(positions: np.ndarray, rows: int,
                             what: str = "positions") -> np.ndarray:
    """``positions (1, T, width)`` -> their first ``rows`` rows (``rows <= T``); a longer
    context is a :class:`ConfigError` (those positions were never trained)."""
    positions = np.asarray(positions)
    if rows > positions.shape[1]:
        raise ConfigError(f"{what}: the source has {positions.shape[1]} text positions and "
                          f"this model {rows}; a longer context has positions no run learned: "
                          f"set max_tokens <= {positions.shape[1]}")
    return positions[:, :rows]


# a tower's size settings whose only parameter is its position table: the table is moved to
# the new size (models/position_resampling.py) instead of the blocks being required equal
RESIZABLE = {"vit": "image_size", "text_transformer": "max_tokens"}


def resizable(key: str, block: Mapping[str, Any]) -> bool:
    """Whether the dotted ``key`` of a model block flattened by dotted names
    (``{"sample_encoder.image_size": 224, ...}``) is a tower's resizable size: the block
    comparison of ``model.init_from`` lets it differ."""
    prefix, _, name = key.rpartition(".")
    tower = block.get(f"{prefix}.name" if prefix else "name")
    return RESIZABLE.get(tower) == name


def position_movers(model_config: Mapping[str, Any]) -> dict[str, Any]:
    """``{parameter path: f(source table, target shape) -> table}`` for the position tables
    of the model's towers: a ViT's resampled to its patch grid (its class token's row kept), a
    text tower's truncated to its context."""
    towers = {k: v for k, v in model_config.items() if isinstance(v, Mapping) and "name" in v}
    if "name" in model_config and not towers:
        towers = {"": model_config}
    out = {}
    for key, tower in towers.items():
        path = f"{key}/positions" if key else "positions"
        if tower["name"] == "vit":
            prefix = int(bool(tower.get("class_token", False)))
            out[path] = lambda table, shape, prefix=prefix, path=path: resample_grid_positions(
                table, shape[1], prefix, f"model.init_from: {path}")
        elif tower["name"] == "text_transformer":
            out[path] = lambda table, shape, path=path: truncated_text_positions(
                table, shape[1], f"model.init_from: {path}")
    return out


def resized_model(model: Mapping[str, Any], params: Mapping[str, Any],
                  preprocess: Mapping[str, Any] | None = None, *,
                  image_size: int | None = None, max_tokens: int | None = None,
                  what: str = "resize") -> tuple[dict, dict, dict | None, list[str]]:
    """``(model block, params, preprocess, notes)`` of a dual encoder moved to another image
    size and/or a shorter text context ([CLIPA]; open_clip's ``force_image_size``): the
    ``sample_encoder`` ViT's ``image_size`` set and its position table resampled
    (:func:`resample_grid_positions`), the ``text_encoder``'s ``max_tokens`` set and its table
    truncated (:func:`truncated_text_positions`), the pixel settings' ``image_size`` with it;
    ``None`` (or the size it has) leaves a tower as it is. ``params``: the nested parameter
    dict of the block (``params["sample_encoder"]["positions"]``); nothing else changes. A
    size on a tower that has no such setting, or an image size that is not a multiple of the
    patch, is a :class:`ConfigError` naming ``what`` (the option's name)."""
    model, params = dict(model), dict(params)
    preprocess = None if preprocess is None else dict(preprocess)
    notes = []
    for size, tower, name, setting in ((image_size, "sample_encoder", "vit", "image_size"),
                                       (max_tokens, "text_encoder", "text_transformer",
                                        "max_tokens")):
        if size is None:
            continue
        block = dict(model.get(tower) or {})
        if block.get("name") != name:
            raise ConfigError(f"{what}: {setting} changes a {name!r} {tower}; this model's is "
                              f"{block.get('name')!r}: drop {setting}")
        if int(size) < 1:
            raise ConfigError(f"{what}: {setting} must be a positive integer; got {size}")
        size, old = int(size), int(block[setting])
        if size == old:
            continue
        table = np.asarray(params[tower]["positions"])
        if name == "vit":
            patch = int(block["patch"])
            if size % patch:
                raise ConfigError(f"{what}: image_size {size} is not a multiple of the "
                                  f"model's patch {patch}; choose a multiple of {patch}")
            prefix = int(bool(block.get("class_token", False)))
            moved = resample_grid_positions(table, prefix + (size // patch) ** 2, prefix,
                                            f"{what}: {tower}/positions")
            if preprocess is not None:
                preprocess["image_size"] = size
        else:
            moved = truncated_text_positions(table, size, f"{what}: {tower}/positions")
        block[setting] = size
        model[tower] = block
        params[tower] = {**params[tower], "positions": moved}
        notes.append(f"{what}: {tower} {setting} {old} -> {size}; {tower}/positions moved "
                     f"from {table.shape[1]} to {moved.shape[1]} positions")
    return model, params, preprocess, notes
