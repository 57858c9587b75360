"""The converted directory: the converters' output and the one format every pretrained source
converts to (written by :func:`save_converted`, read as a source by
:func:`~.pretrained_source.read_source`).

It holds ``DIR/model.json`` (the ``model`` block that builds it), ``DIR/params`` (its
parameters, an orbax ``StandardCheckpointer`` tree) and, where the model expects a pixel
normalisation, ``DIR/preprocess.json`` (``data.preprocess`` fields: ``mean``, ``std``,
``resize``, ``image_size``, and ``resize_mode``: ``"shortest"``, the default, or ``"squash"``;
a run that starts from the directory takes ``mean`` and ``std`` from it,
:func:`contrastive_jax.training.run_spec.source_pixels`) and, where the converter was given the
model's tokenizer, ``DIR/tokenizer.json`` (a ``data.preprocess.tokenizer`` spec whose ``path``
is relative to ``DIR``) with the tokenizer's file copied beside it (``DIR/tokenizer/``), so that
the directory alone gives a ready model (:func:`contrastive_jax.pretrained.load_pretrained`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from contrastive_jax.errors import ConfigError

MODEL_FILE = "model.json"  # a converted directory's model block
PREPROCESS_FILE = "preprocess.json"
TOKENIZER_FILE = "tokenizer.json"


def define_size_flags(flag_values) -> tuple[Any, Any]:
    """An importer's ``--image_size`` and ``--max_tokens`` (flag holders in ``flag_values``):
    the converted model at another input size (:func:`save_converted`)."""
    from absl import flags

    return (flags.DEFINE_integer(
                "image_size", None, "write the model at this image size instead of the "
                "checkpoint's (a multiple of its patch): the position table resampled "
                "bicubically to the new patch grid (CLIPA; open_clip's --force-image-size)",
                flag_values=flag_values),
            flags.DEFINE_integer(
                "max_tokens", None, "write the model with this shorter text context: the text "
                "position table truncated (a longer one is refused)", flag_values=flag_values))


def save_converted(out_dir: str | os.PathLike, model_config: Mapping[str, Any],
                   params: Mapping[str, Any],
                   preprocess: Mapping[str, Any] | None = None,
                   tokenizer: Mapping[str, Any] | None = None, *,
                   image_size: int | None = None, max_tokens: int | None = None) -> list[str]:
    """Write ``out_dir/model.json`` (``model_config``), ``out_dir/params`` (orbax
    ``StandardCheckpointer``) and, if given, ``out_dir/preprocess.json`` and the tokenizer
    (``tokenizer``: a ``data.preprocess.tokenizer`` spec whose ``path`` names an existing file;
    the file is copied to ``out_dir/tokenizer/`` and ``out_dir/tokenizer.json`` records the spec
    with that relative path). ``out_dir`` must not exist or be empty (nothing is
    overwritten). ``image_size`` / ``max_tokens``: write the model at another input size, its
    position tables moved (:func:`~contrastive_jax.training.models.position_resampling.
    resized_model`); returns its lines saying what moved (none without them)."""
    import shutil

    import orbax.checkpoint as ocp

    from contrastive_jax.training.models.position_resampling import resized_model

    out_dir = os.path.abspath(os.fspath(out_dir))
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        raise ConfigError(f"output {out_dir!r} exists and is not an empty directory; choose a "
                          "new one")
    notes = []
    if image_size is not None or max_tokens is not None:
        model_config, params, preprocess, notes = resized_model(
            model_config, params, preprocess, image_size=image_size, max_tokens=max_tokens,
            what="--image_size/--max_tokens")
    os.makedirs(out_dir, exist_ok=True)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(os.path.join(out_dir, "params"), dict(params))
    checkpointer.wait_until_finished()
    if preprocess is not None:
        with open(os.path.join(out_dir, PREPROCESS_FILE), "w") as f:
            json.dump(dict(preprocess), f, indent=2)
            f.write("\n")
    if tokenizer is not None:
        spec = dict(tokenizer)
        source = os.fspath(spec.get("path", ""))
        if not os.path.isfile(source):
            raise ConfigError(f"tokenizer file {source!r} does not exist")
        os.makedirs(os.path.join(out_dir, "tokenizer"))
        spec["path"] = os.path.join("tokenizer", os.path.basename(source))
        shutil.copyfile(source, os.path.join(out_dir, spec["path"]))
        with open(os.path.join(out_dir, TOKENIZER_FILE), "w") as f:
            json.dump(spec, f, indent=2)
            f.write("\n")
    with open(os.path.join(out_dir, MODEL_FILE), "w") as f:  # last: the directory is complete
        json.dump(dict(model_config), f, indent=2)
        f.write("\n")
    return notes


def converted_extras(out_dir: str | os.PathLike) -> tuple[dict | None, dict | None]:
    """``(preprocess, tokenizer spec)`` recorded in a converted directory, each ``None`` when
    absent; the tokenizer's ``path`` made absolute (it is stored relative to the directory)."""
    out_dir = os.path.abspath(os.fspath(out_dir))
    found = []
    for name in (PREPROCESS_FILE, TOKENIZER_FILE):
        path = os.path.join(out_dir, name)
        if not os.path.exists(path):
            found.append(None)
            continue
        with open(path) as f:
            try:
                found.append(json.load(f))
            except ValueError as err:
                raise ConfigError(f"{path} is not valid JSON ({err})") from None
    preprocess, tokenizer = found
    if tokenizer is not None:
        tokenizer["path"] = os.path.join(out_dir, tokenizer.get("path", ""))
    return preprocess, tokenizer
