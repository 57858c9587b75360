"""The pixels a pretrained model expects, for a run that starts from it: ``data.preprocess.mean``
and ``std`` filled from ``model.init_from``'s source when the config sets neither
(:func:`pretrained_preprocess`; docs/pretrained.md "Preprocessing parity").

A converted directory's ``preprocess.json``
(:mod:`~contrastive_jax.training.models.converters.converted_directory`) or an open_clip model's
``preprocess_cfg`` (:mod:`~contrastive_jax.training.models.converters.open_clip_sources`; its
weights are not read) gives them; a resumed run takes them from its own ``config.json`` and
reads nothing from the source; a config that sets other values keeps them, with a warning.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from etils import epath

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models.converters.converted_directory import PREPROCESS_FILE
from contrastive_jax.training.run.init_from import init_specs, json_file

PIXEL_FIELDS = ("mean", "std")


def pretrained_preprocess(config, recorded: Mapping[str, Any] | None = None
                          ) -> tuple[Any, list[str]]:
    """``(config, messages)``: ``data.preprocess.mean`` / ``std`` filled from the first
    ``model.init_from`` path that is a converted checkpoint with a ``preprocess.json`` (CLIP's
    values for a converted CLIP), where the config is an ``image_text`` one and sets neither; a
    copy of ``config`` if it changes. ``recorded``: the workdir's ``config.json`` (a run that
    resumes): with the same ``init_from``, its values are taken and ``path`` is not read, as a
    resumed run reads nothing from it. A config that sets other values than the checkpoint's
    keeps them, with a warning."""
    preprocess = config.get("data", {}).get("preprocess", {})
    if preprocess.get("name", "standard") != "image_text":
        return config, []
    given = {k: preprocess.get(k) for k in PIXEL_FIELDS if preprocess.get(k) is not None}
    specs = init_specs(config.model.get("init_from", ""))
    before = dict(recorded or {})
    before_pre = dict(dict(before.get("data") or {}).get("preprocess") or {})
    if (specs and not given and all(before_pre.get(k) is not None for k in PIXEL_FIELDS)
            and init_specs(dict(before.get("model") or {}).get("init_from", "")) == specs):
        stored = {k: before_pre[k] for k in PIXEL_FIELDS}
        return _with_pixels(config, stored), [
            f"data.preprocess.mean / std as recorded in the run's config.json: mean "
            f"{stored['mean']}, std {stored['std']}"]
    for spec in specs:
        path = epath.Path(spec.path) / PREPROCESS_FILE
        if (epath.Path(spec.path) / "model.json").exists():
            if not path.exists():
                continue
            stored = {k: v for k, v in json_file(path).items() if k in PIXEL_FIELDS}
        else:
            stored = _open_clip_pixels(spec.path)
            if stored is None:
                continue
            path = f"{spec.path}'s open_clip preprocess_cfg"
        if given:
            same = all(np.allclose(given.get(k, np.nan), stored.get(k, np.nan))
                       for k in PIXEL_FIELDS)
            return config, [] if same else [
                f"warning: data.preprocess mean/std {given} differ from those the converted "
                f"checkpoint expects ({path}: {stored}); keeping the config's"]
        return _with_pixels(config, stored), [
            f"data.preprocess.mean / std from {path} (the pixels the converted model "
            f"expects): mean {stored.get('mean')}, std {stored.get('std')}"]
    return config, []


def _open_clip_pixels(path: str) -> dict[str, Any] | None:
    """``{"mean", "std"}`` of an open_clip model's ``preprocess_cfg`` (a hub directory, a cache
    snapshot, a recorded name; the weights are not read), None for a path of another kind."""
    from contrastive_jax.training.models.converters import open_clip_sources

    root = epath.Path(path)
    if (root / "checkpoints").exists() or str(path).startswith("gs://"):
        return None
    try:
        source = open_clip_sources.resolve(path)
    except ConfigError:
        return None
    if source.model_cfg is None:
        return None
    pixels = open_clip_sources.source_preprocess(source, 0)
    return {k: pixels[k] for k in PIXEL_FIELDS}


def _with_pixels(config, pixels: Mapping[str, Any]):
    config = config.copy_and_resolve_references()
    config.data.preprocess.update(dict(pixels))
    return config
