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
