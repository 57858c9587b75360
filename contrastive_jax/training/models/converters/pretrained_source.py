"""A pretrained source: what a path or an open_clip name holds, classified once and read once.

Every reader of pretrained models goes through this module: :func:`contrastive_jax.pretrained.
load_pretrained`, a run's ``model.init_from`` and the pixels it takes from its source
(:mod:`contrastive_jax.training.run_spec`), the pod template's ``pretrained=SOURCE``, the
``evaluate`` command and the open_clip exporter. :func:`read_source` classifies the path once
(:func:`source_kind`) and reads what describes the model, without its parameters:

============  ===========================================  =====================================
kind          what the path is                             where the description comes from
============  ===========================================  =====================================
converted     ``DIR/model.json`` + ``DIR/params/`` (a      ``model.json``, ``preprocess.json``,
              converter's output, :mod:`.converted_        ``tokenizer.json``
              directory`)
workdir       a trainer workdir, ``DIR/checkpoints/<step>/  ``DIR/config.json`` (its ``model``
              state`` (the trainer's layout, read only)    block and ``data.preprocess``)
big_vision    a big_vision SigLIP ``.npz`` file            the arrays themselves (converted
                                                           whole, :mod:`.big_vision_import`)
open_clip     an open_clip hub directory, a Hugging Face   ``open_clip_config.json`` or the
              cache snapshot, ``hf-hub:ORG/NAME``, a       recorded config (:mod:`.model_
              recorded model name (with ``pretrained=``    sources`); a bare state dict has
              a release), a bare weight file               none and is converted whole
============  ===========================================  =====================================

and :func:`with_weights` reads its parameters: a converted directory's ``params/``, a
workdir's newest usable checkpoint (or ``step``; newer ones that cannot be read, do not match
the checksums saved with them, as the trainer checks on resume, or hold non-finite numbers are
skipped and listed in ``skipped``, the other run's files left as they are) with its BatchNorm
statistics, an open_clip model converted in memory
(:func:`.clip_import.convert_open_clip`). Both give a :class:`PretrainedSource`, the one record
of a pretrained model in the package (the converters return it too).

A path is made absolute once (orbax reads absolute paths only); ``gs://`` paths are read
through :class:`etils.epath.Path`. Nothing is downloaded: a name with no local file says where
to put it. :func:`read_source` keeps what it read for the process (keyed by the path, the
release, the step and the files' modification times), so a run that reads a source's
description in its config file (the pod template's ``pretrained=``) and again when it starts
reads the files once.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from etils import epath

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.checkpoint_integrity import checksums_mismatch, read_on_host
from contrastive_jax.training.models.converters.converted_directory import (
    MODEL_FILE,
    PREPROCESS_FILE,
    TOKENIZER_FILE,
    converted_extras,
)
from contrastive_jax.training.parameter_paths import leaves_by_path, nested

KINDS = ("converted", "workdir", "big_vision", "open_clip")
WORKDIR_CONFIG = "config.json"  # a trainer workdir's recorded config
CHECKPOINTS = "checkpoints"  # a trainer workdir's checkpoints/<step>/state (run/checkpoints.py)


@dataclasses.dataclass(frozen=True)
class PretrainedSource:
    """A pretrained model as a source holds it.

    ``kind``: one of :data:`KINDS`; ``location``: the absolute path (or the open_clip name or
    ``hf-hub:`` id as given); ``description``: for messages (a workdir's names the checkpoint
    step once its weights are read); ``model``: the ``model`` block that builds it, in
    today's keys (a workdir's recorded block without the run's ``frozen`` / ``init_from``);
    ``preprocess``: its pixel settings (``data.preprocess`` fields: ``image_size``, ``mean``,
    ``std``, ``resize``, ``resize_mode``) or ``None`` for a model without images;
    ``tokenizer``: a ``data.preprocess.tokenizer`` spec (``path`` absolute or ``""``), or
    ``None`` for a tokenizer this project does not compute (open_clip's
    ``hf_tokenizer_name``: ``tokenizer_name``); ``step``: a workdir's checkpoint (the one
    asked for, then the one read); ``pretrained``: an open_clip release tag.

    Once read (:func:`with_weights`): ``params``, the parameters as a nested pure dict
    (``nnx.to_pure_dict``'s layout: int keys for blocks, NumPy float32), in the layout of the
    Transformer blocks that ``model`` builds; ``rest``, a workdir's other model state
    (BatchNorm statistics) the same way (``{}`` for other kinds); ``skipped``, a workdir's newer
    checkpoints that could not be used, why. A converter's ``notes`` (options with no effect)
    and ``assumptions`` (what a conversion without config assumed).
    """

    kind: str
    location: str
    description: str
    model: dict[str, Any]
    preprocess: dict[str, Any] | None
    tokenizer: dict[str, Any] | None
    tokenizer_name: str | None = None
    step: int | None = None
    pretrained: str | None = None
    params: dict | None = None
    rest: dict | None = None
    skipped: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    assumptions: tuple[str, ...] = ()

    @property
    def has_weights(self) -> bool:
        return self.params is not None


def _absolute(path_or_name: str | os.PathLike) -> str:
    """A local path made absolute (a name or ``gs://`` / ``hf-hub:`` id as given)."""
    text = os.fspath(path_or_name)
    if "://" in text or text.startswith("hf-hub:") or not os.path.exists(text):
        return text
    return os.path.abspath(text)


def source_kind(path_or_name: str | os.PathLike) -> str:
    """Which of :data:`KINDS` ``path_or_name`` is, from the files it holds (nothing is read):
    a ``.npz`` file, a directory with ``model.json`` and ``params/``, a directory with
    ``checkpoints/``; anything else is left to open_clip's resolution (which names what it
    looked for when it finds nothing)."""
    text = os.fspath(path_or_name)
    if text.startswith("hf-hub:"):
        return "open_clip"
    root = epath.Path(text)
    if text.endswith(".npz") and root.is_file():
        return "big_vision"
    if (root / MODEL_FILE).exists() and (root / "params").exists():
        return "converted"
    if (root / CHECKPOINTS).is_dir():
        return "workdir"
    return "open_clip"


_READ: dict[tuple, PretrainedSource] = {}  # read_source's records of this process, by key


def read_source(path_or_name: str | os.PathLike, *, pretrained: str | None = None,
                step: int | None = None) -> PretrainedSource:
    """The :class:`PretrainedSource` of ``path_or_name`` without its parameters where its
    kind allows (a big_vision ``.npz`` and a bare state dict are converted whole, weights
    included); the module docstring says what each kind reads. ``pretrained``: the release
    of a recorded open_clip model name; ``step``: a workdir's checkpoint. A
    :class:`ConfigError` says what was looked for when the path is none of the kinds.
    Kept for the process (the module docstring): the same files are read once."""
    location = _absolute(path_or_name)
    kind = source_kind(location)
    if step is not None and kind != "workdir":
        raise ConfigError(f"step={step} names a checkpoint of a trainer workdir; "
                          f"{path_or_name} is not one (config.json + checkpoints/): drop the "
                          "step")
    if pretrained is not None and kind in ("converted", "workdir"):
        what = "converted directory" if kind == "converted" else "trainer workdir"
        raise ConfigError(f"pretrained={pretrained!r} names an open_clip release; "
                          f"{path_or_name} is a {what}, which holds one model: drop it")
    key = (location, kind, pretrained, step, _stamp(location, kind))
    if key in _READ:
        return _READ[key]
    source = _READERS[kind](location, pretrained=pretrained, step=step)
    if not source.has_weights:  # a description only: small, and read again for nothing
        _READ[key] = source
    return source


def with_weights(source: PretrainedSource) -> PretrainedSource:
    """``source`` with its parameters (and a workdir's BatchNorm statistics) read: the
    record as :func:`read_source` gave it, ``params`` / ``rest`` / ``skipped`` filled (module
    docstring); a record that holds them already comes back as it is."""
    if source.has_weights:
        return source
    if source.kind == "converted":
        params = _in_layout(_restore(epath.Path(source.location) / "params"), source.model)
        return dataclasses.replace(source, params=nested(params), rest={})
    if source.kind == "workdir":
        return _workdir_weights(source)
    if source.kind == "open_clip":
        from contrastive_jax.training.models.converters.clip_import import convert_open_clip

        converted = convert_open_clip(source.location, pretrained=source.pretrained)
        return dataclasses.replace(converted, location=source.location,
                                   pretrained=source.pretrained)
    raise AssertionError(f"a {source.kind} source is read with its weights")


def _stamp(location: str, kind: str) -> tuple:
    """What tells that a source's files changed: the modification times and sizes of the
    files a description is read from (nothing for names and remote paths)."""
    if "://" in location or not os.path.exists(location):
        return ()
    names = {"converted": (MODEL_FILE, PREPROCESS_FILE, TOKENIZER_FILE),
             "workdir": (WORKDIR_CONFIG,), "big_vision": ("",),
             "open_clip": ("", "open_clip_config.json")}[kind]
    stamps = []
    for name in names:
        path = os.path.join(location, name) if name else location
        try:
            stat = os.stat(path)
        except OSError:
            continue
        stamps.append((name, stat.st_mtime_ns, stat.st_size))
    return tuple(stamps)


def _json(path: epath.Path) -> Any:
    """A JSON file of a source; invalid JSON is a :class:`ConfigError` naming it."""
    try:
        return json.loads(path.read_text())
    except ValueError as err:
        raise ConfigError(f"{path} is not valid JSON ({err})") from None


def _converted(location: str, **_) -> PretrainedSource:
    model = _json(epath.Path(location) / MODEL_FILE)
    preprocess, tokenizer = converted_extras(location)
    return PretrainedSource("converted", location, f"the converted directory {location}",
                            model, preprocess, tokenizer)


def _workdir(location: str, *, step: int | None = None, **_) -> PretrainedSource:
    """A trainer workdir's description: its recorded model block (today's keys,
    :func:`~contrastive_jax.training.models.upgraded_model_block`) and its run's pixels and
    tokenizer (``data.preprocess``: an ``image_text`` run's image size, resize and mean / std;
    the caption words by default)."""
    from contrastive_jax.training.models import architecture_block, upgraded_model_block

    record = epath.Path(location) / WORKDIR_CONFIG
    config = _json(record) if record.exists() else {}
    model = architecture_block(upgraded_model_block(config.get("model") or {}))
    pre = dict(dict(config.get("data") or {}).get("preprocess") or {})
    preprocess = None
    if pre.get("name") == "image_text":
        preprocess = {"image_size": pre.get("image_size") or dict(
                          model.get("sample_encoder") or {}).get("image_size"),
                      "resize": pre.get("resize", "bicubic"),
                      "resize_mode": pre.get("resize_mode", "shortest"),
                      "mean": pre.get("mean"), "std": pre.get("std")}
    tokenizer = dict(pre.get("tokenizer") or {"kind": "words", "path": ""})
    if not config:
        tokenizer = None
    return PretrainedSource("workdir", location, f"the trainer workdir {location}", model,
                            preprocess, tokenizer, step=step)


def _big_vision(location: str, **_) -> PretrainedSource:
    from contrastive_jax.training.models.converters.big_vision_import import convert_npz

    try:
        return convert_npz(location)
    except ConfigError as err:
        if "_heads" not in str(err):
            raise
        raise ConfigError(f"{location}: {err}; convert it with its heads first: python -m "
                          "contrastive_jax.training.models.converters.big_vision_import "
                          f"--checkpoint={location} --vision_heads=N --text_heads=N "
                          "--output=DIR, then load DIR") from None


def _open_clip(location: str, *, pretrained: str | None = None, **_) -> PretrainedSource:
    """An open_clip model's description from its config alone (its ``init_temperature`` /
    ``init_bias`` are the config's initial values until the weights are read); a weight file
    without a config is converted whole."""
    from contrastive_jax.training.models.converters.clip_import import convert_open_clip
    from contrastive_jax.training.models.converters.open_clip import model_configs, model_sources

    try:
        found = model_sources.locate(location, pretrained=pretrained)
    except ConfigError as err:
        raise ConfigError(
            f"{location} is neither a converted checkpoint (model.json and params/), a trainer "
            "workdir with checkpoints (checkpoints/<step>/), a big_vision .npz, nor an "
            f"open_clip model ({err}); fix the path") from None
    if found.model_cfg is None:  # a bare state dict: its config comes from its tensors
        converted = convert_open_clip(location, pretrained=pretrained)
        return dataclasses.replace(converted, location=location, pretrained=pretrained)
    block = model_configs.model_block(found.model_cfg, timm_args=found.timm_args)
    return PretrainedSource(
        "open_clip", location, f"the open_clip model ({found.origin})", block.model,
        model_sources.source_preprocess(found, block.model["sample_encoder"]["image_size"]),
        model_sources.tokenizer_spec(block.tokenizer, found.directory,
                                         found.model_cfg.get("text_cfg")),
        block.tokenizer, pretrained=pretrained, notes=tuple(block.notes))


_READERS = {"converted": _converted, "workdir": _workdir, "big_vision": _big_vision,
            "open_clip": _open_clip}


def _restore(directory: epath.Path, keys: Sequence[str] | None = None):
    """An orbax PyTree checkpoint as NumPy arrays (only the top-level ``keys`` if given):
    :func:`~contrastive_jax.training.checkpoint_integrity.read_on_host`."""
    return read_on_host(directory, None if keys is None else tuple(keys))


def _in_layout(tree, model: Mapping[str, Any], *, drop_value: bool = False
               ) -> dict[str, np.ndarray]:
    """``{"a/0/b": host array}`` of a restored tree, its Transformer blocks in the layout the
    ``model`` block builds (scanned or unrolled,
    :func:`~contrastive_jax.training.models.scanned_layers.to_layout`); as stored when there is
    no block (a workdir without config.json)."""
    from contrastive_jax.training.models.converters.open_clip.tensor_layouts import model_leaves
    from contrastive_jax.training.models.scanned_layers import to_layout

    leaves = {k: np.asarray(v) for k, v in leaves_by_path(tree, drop_value=drop_value).items()}
    return to_layout(leaves, model_leaves(model)) if model else leaves


def checkpoint_steps(location: str | os.PathLike) -> list[int]:
    """The steps of a workdir's ``checkpoints/<step>/`` folders, ascending."""
    folder = epath.Path(location) / CHECKPOINTS
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) \
        if folder.exists() else []


def _workdir_weights(source: PretrainedSource) -> PretrainedSource:
    """The newest usable checkpoint of a workdir (or ``source.step``'s), as a resume falls
    back: one that cannot be read, does not match its saved checksums
    (:func:`~contrastive_jax.training.checkpoint_integrity.checksums_mismatch`, the trainer's
    check) or holds non-finite numbers is skipped (and listed)."""
    root = epath.Path(source.location)
    steps = checkpoint_steps(root)
    if source.step is not None and steps:
        if source.step not in steps:
            raise ConfigError(f"{root} has no checkpoint of step {source.step}; its steps: "
                              f"{steps}")
        steps = [source.step]
    if not steps:
        raise ConfigError(
            f"{root} is neither a converted checkpoint (model.json and params/) nor a trainer "
            "workdir with checkpoints (checkpoints/<step>/ is empty); run the pretraining "
            "first or fix the path")
    skipped = []
    for step in reversed(steps):  # the other run's files are only read: a damaged
        folder = root / CHECKPOINTS / str(step)  # checkpoint stays where it is
        try:
            tree = _restore(folder / "state", keys=("params", "rest"))
        except Exception as err:
            skipped.append(f"step {step} cannot be read ({type(err).__name__}: "
                           f"{str(err).splitlines()[0][:200] if str(err) else ''})")
            continue
        if "params" not in tree:
            skipped.append(f"step {step} holds no parameters")
            continue
        mismatch = checksums_mismatch(folder, tree, partial=True)
        if mismatch:  # the trainer's check on resume, on the parameters and statistics read
            skipped.append(f"step {step}: {mismatch}")
            continue
        params = _in_layout(tree["params"], source.model, drop_value=True)
        rest = {k: np.asarray(v) for k, v in leaves_by_path(
            tree.get("rest", {}), drop_value=True).items()}
        if not all(np.isfinite(v).all() for v in (*params.values(), *rest.values())
                   if np.issubdtype(v.dtype, np.inexact)):
            skipped.append(f"step {step} holds non-finite numbers")
            continue
        return dataclasses.replace(source, description=f"{source.description} (step {step})",
                                   step=step, params=nested(params), rest=nested(rest),
                                   skipped=tuple(skipped))
    raise ConfigError(f"{root}: none of its checkpoints (steps {steps}) can be used: "
                      f"{'; '.join(skipped)}. Point to another run or rerun the pretraining")


def load_converted(out_dir: str | os.PathLike) -> tuple[dict[str, Any], dict]:
    """``(model config, params)`` from a directory written by
    :func:`~.converted_directory.save_converted` (the reader's ``converted`` kind,
    :func:`with_weights`): the params (nested, float32 NumPy;
    ``nnx.List`` indices as ints) in the layout of the model the config builds, whichever
    layout of the Transformer blocks they were saved in (a directory converted before
    scanned layers holds unrolled blocks, :mod:`~contrastive_jax.training.models.
    scanned_layers`)."""
    source = read_source(out_dir)
    if source.kind != "converted":
        raise ConfigError(f"{out_dir}: no {MODEL_FILE} and params/, so not a converted "
                          "directory")
    source = with_weights(source)
    return source.model, source.params
