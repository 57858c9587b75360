"""A SimCLR or MoCo trainer workdir as the evaluation command's model: the encoder's
representations, the projection head dropped.

A workdir whose ``model.name`` is ``"projected_encoder"`` (:class:`~contrastive_jax.training.
models.projected_encoder.ProjectedEncoder`: SimCLR's model, MoCo's query encoder) is evaluated
on ``h = f(x)``, the encoder's pooled features (``representations``: inference mode, BatchNorm's
running statistics), never on the head's ``z = g(h)``: [SimCLR] §4.2 keeps f and discards g
after pre-training (docs/derivations.md §9.1), and MoCo's linear protocol reads the query
encoder's pooled features ([MoCo]). These are the features the run's own evaluation probes
(:func:`~contrastive_jax.training.evaluation.run_evaluation.inference_functions`' ``features``),
computed the same way: the image as the run's evaluation crop of ``data.preprocess`` (with an
``image_size``: the shorter side resized to it and the central square, or the whole image
squashed, with its ``resize`` kernel; without one: the image as stored, which must then have
the model's input size), then on the device ``x / 255`` and the run's ``mean`` / ``std``
(none: ``[0, 1]`` pixels) (:func:`~contrastive_jax.training.augmentations.pixels.model_input`).
"""

from __future__ import annotations

import inspect
import json
from typing import Any

import numpy as np
from etils import epath

from contrastive_jax.errors import ConfigError

ENCODER_MODELS = ("projected_encoder",)


def workdir_pixels(location: str) -> dict[str, Any]:
    """``{"image_size", "resize", "resize_mode", "mean", "std"}`` of a trainer workdir's
    recorded ``data.preprocess`` (``config.json``), each field not recorded at the default of
    the run's preprocessing (:data:`~contrastive_jax.training.data.example_preprocessing.
    PREPROCESSORS`: ``image_text``'s ``image_size`` 224, ``"bicubic"``, ``"shortest"``):
    ``image_size`` ``None`` for a preprocessing without one (``standard``: images as stored),
    ``mean`` / ``std`` ``None`` without normalisation."""
    from contrastive_jax.training.data.example_preprocessing import PREPROCESSORS
    from contrastive_jax.training.models.converters.pretrained_source import WORKDIR_CONFIG

    record = epath.Path(location) / WORKDIR_CONFIG
    config = json.loads(record.read_text()) if record.exists() else {}
    pre = dict(dict(config.get("data") or {}).get("preprocess") or {})
    function = PREPROCESSORS.get(pre.get("name", "standard"))
    defaults = {name: p.default for name, p in inspect.signature(function).parameters.items()
                } if function else {}
    size = pre.get("image_size", defaults.get("image_size"))
    return {"image_size": int(size) if size else None,
            "resize": pre.get("resize", defaults.get("resize", "bicubic")),
            "resize_mode": pre.get("resize_mode", defaults.get("resize_mode", "shortest")),
            "mean": pre.get("mean"), "std": pre.get("std")}


def encoder_task_model(source, *, batch_size: int, dtype: str, description: str):
    """``(TaskModel, preprocess record)`` of a read workdir ``source``
    (:class:`~contrastive_jax.training.models.converters.pretrained_source.PretrainedSource`
    with weights) holding a projected encoder (module docstring). ``embed_images`` runs the
    jitted ``representations(model_input(x, pixels))`` on a batch of ``batch_size`` uint8
    crops, padding rows dropped; no text tower (zero-shot and retrieval tasks fail naming
    it). ``dtype``: the compute dtype, as for a dual encoder."""
    import jax
    from flax import nnx

    from contrastive_jax.pretrained import build_pretrained_model
    from contrastive_jax.training.augmentations.pixels import model_input, pixel_normalization
    from contrastive_jax.training.data.image_crops import (
        check_resize,
        check_resize_mode,
        evaluation_image,
        open_image,
    )
    from contrastive_jax.training.evaluation.task_runner import TaskModel

    if source.kind != "workdir" or source.model.get("name") not in ENCODER_MODELS:
        raise ConfigError(f"{source.description} holds a {source.model.get('name')!r} model; "
                          f"the encoder path takes trainer workdirs of {list(ENCODER_MODELS)}")
    pixels = workdir_pixels(source.location)
    normalization = pixel_normalization(pixels)
    size = pixels["image_size"]
    check_resize(pixels["resize"])
    check_resize_mode(pixels["resize_mode"])
    model = build_pretrained_model(source.model, source.params, dtype=dtype, rest=source.rest)
    graphdef, state = nnx.split(model)
    features = jax.jit(lambda s, x: nnx.merge(graphdef, s).representations(
        model_input(x, normalization)))

    def crop(image) -> np.ndarray:
        if size:
            return evaluation_image(image, size, resize=pixels["resize"],
                                    resize_mode=pixels["resize_mode"])
        return np.asarray(open_image(image)) if isinstance(image, bytes | np.bytes_) \
            else np.asarray(image)

    def embed_images(batch) -> dict[str, np.ndarray]:
        keep = np.asarray(batch["mask"], bool)
        out = {k: np.asarray(v)[keep] for k, v in batch.items() if k not in ("image", "mask")}
        return {"features": np.asarray(features(state, np.asarray(batch["image"])))[keep],
                **out}

    record = {**pixels, "interpolation": pixels["resize"],
              "features": "representations h = f(x) (the projection head dropped)"}
    del record["resize"]
    return TaskModel(description=description, crop=crop, embed_images=embed_images,
                     embed_texts=None, batch_size=batch_size), record
