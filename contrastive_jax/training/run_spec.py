"""One resolve step: a run's config, checked and completed once, as a frozen :class:`RunSpec`.

``resolve(config, workdir) -> RunSpec`` is what :func:`~contrastive_jax.training.train.
train_and_evaluate`, the plan (:mod:`contrastive_jax.plan`) and
:func:`contrastive_jax.pretrained.evaluate_pretrained` start from. It does, once and before
anything is compiled or written:

1. the method (:func:`~contrastive_jax.training.methods.method_for`: the loss and the method's
   own settings, checked);
2. each ``model.init_from`` source's description, read once
   (:func:`~contrastive_jax.training.models.converters.pretrained_source.read_source`; the
   weights are read only when a run starts fresh), and the pixels a pretrained model expects
   filled in (:func:`source_pixels`);
3. the evaluators of ``evaluation`` with their settings checked
   (:func:`~contrastive_jax.training.evaluation.evaluators.selected`);
4. the mesh (``config.mesh``), the global batch's split over the processes, the devices and
   the micro-batches (``accumulation_steps``), and the number of steps (``total_steps``, or
   ``num_epochs`` of the training split).

The spec's ``config`` is the config exactly as the run records it in ``workdir/config.json``,
frozen (:class:`ml_collections.FrozenConfigDict`): the rooms below the trainer read it and the
spec's other fields, and none of them can change it. A bad setting is a :class:`ConfigError`
here, naming what to change.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from etils import epath
from jax.sharding import Mesh

from contrastive_jax.errors import ConfigError
from contrastive_jax.mesh import DATA_AXIS, check_divisible, make_mesh
from contrastive_jax.training.data import open_split
from contrastive_jax.training.data.example_preprocessing import decodes_images
from contrastive_jax.training.evaluation.evaluators import Evaluator, selected
from contrastive_jax.training.methods import Method, method_for
from contrastive_jax.training.models import encoder_input_shape
from contrastive_jax.training.models.converters.pretrained_source import (
    PretrainedSource,
    checkpoint_steps,
    read_source,
)
from contrastive_jax.training.run.init_from import init_specs
from contrastive_jax.training.run.workdir.config_record import recorded_config
from contrastive_jax.training.run.workdir.workdir_path import workdir_path
from contrastive_jax.training.step.accumulation import accumulation_steps

PIXEL_FIELDS = ("mean", "std")


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """A run, resolved (the module docstring): ``config`` (frozen; what ``config.json``
    records), ``workdir`` (``None`` outside a training run), ``method``, ``sources`` (one
    :class:`PretrainedSource` description per ``model.init_from`` entry), ``evaluators``,
    ``mesh``, ``steps``, ``accumulation_steps`` (micro-batches per global batch) and
    ``messages`` (lines for the start of the run: where the pixels came from)."""

    config: ml_collections.FrozenConfigDict
    workdir: epath.Path | None
    method: Method
    sources: tuple[PretrainedSource, ...]
    evaluators: tuple[Evaluator, ...]
    mesh: Mesh
    steps: int
    accumulation_steps: int
    messages: tuple[str, ...] = ()

    @property
    def batch_size(self) -> int:
        return int(self.config.data.batch_size)


def resolve(config: ml_collections.ConfigDict, workdir: str | None = None, *,
            mesh: Mesh | None = None, steps: int | None = None,
            method: Method | None = None) -> RunSpec:
    """The :class:`RunSpec` of ``config`` (the module docstring). ``workdir``: the run's (a
    resumed run takes its pixels from its ``config.json``, :func:`source_pixels`); ``mesh``:
    the devices (default: ``config.mesh`` over every device); ``steps``: the step count when
    the data is not to be read (the plan: the schedule does not change memory), else
    ``total_steps`` or ``num_epochs`` of the training split; ``method``: a method object in
    place of :func:`method_for`'s (tests of a method's hooks)."""
    if steps is None and config.data.get("source", "tfds") == "shards":
        if not config.get("total_steps", 0):
            raise ConfigError("a stream of shards (data.source='shards') has no known size to "
                              "count epochs in: set total_steps")
        from contrastive_jax.training.data.stream import check_stream

        check_stream(config.data)  # patterns, readers: before anything is written
    method = method_for(config) if method is None else method
    specs = init_specs(config.model.get("init_from", ""))
    recorded = recorded_config(workdir) if workdir is not None else None
    # a run that resumes restores its own checkpoint and reads nothing from its sources
    resuming = workdir is not None and bool(checkpoint_steps(workdir_path(workdir)))
    sources = () if resuming else tuple(read_source(spec.path) for spec in specs)
    config, messages = source_pixels(config, recorded, None if resuming else sources)
    preprocess = config.data.get("preprocess") or {}
    if decodes_images(preprocess):  # images the encoder cannot take: said before any work
        model = config.model
        encoder_input_shape(model.get("sample_encoder") or model.get("encoder"),
                            preprocess.get("image_size"))
    evaluators = selected(config) if config.evaluation.enabled else ()
    mesh = make_mesh(dict(config.get("mesh", {"data": -1}))) if mesh is None else mesh
    accumulation = check_batch(config, mesh)
    if steps is None:
        steps = total_steps(config, None if config.get("total_steps", 0) else len(open_split(
            config.data.name, config.data.train_split, config.data.data_dir or None,
            config.data.options.to_dict() or None)))
    return RunSpec(ml_collections.FrozenConfigDict(config),
                   None if workdir is None else workdir_path(workdir), method, sources,
                   evaluators, mesh, int(steps), accumulation, tuple(messages))


def total_steps(config: ml_collections.ConfigDict, train_size: int | None) -> int:
    """``config.total_steps`` if set, else ``ceil(num_epochs * train_size / batch_size)``."""
    if config.get("total_steps", 0):
        return int(config.total_steps)
    steps = math.ceil(config.num_epochs * train_size / config.data.batch_size)
    if steps < 1:
        raise ConfigError("set total_steps or num_epochs > 0")
    return steps


def check_batch(config: ml_collections.ConfigDict, mesh: Mesh) -> int:
    """The global batch divides over the processes and the ``data`` devices, and so do its
    micro-batches; a :class:`ConfigError` saying what to change otherwise. Returns the number
    of micro-batches (:func:`~contrastive_jax.training.step.accumulation.accumulation_steps`)."""
    check_divisible(config.data.batch_size, jax.process_count(), "processes")
    check_divisible(config.data.batch_size, mesh.shape[DATA_AXIS])
    return accumulation_steps(config, mesh.shape[DATA_AXIS])


def source_pixels(config: ml_collections.ConfigDict, recorded: Mapping[str, Any] | None = None,
                  sources: Sequence[PretrainedSource] | None = None
                  ) -> tuple[ml_collections.ConfigDict, list[str]]:
    """``(config, messages)``: ``data.preprocess.mean`` / ``std`` filled from the first
    ``model.init_from`` source that records them (a converted directory's ``preprocess.json``,
    an open_clip model's ``preprocess_cfg``, a trainer workdir's own ``data.preprocess`` of an
    ``image_text`` run), where the config is an ``image_text`` one and sets neither; a copy of
    ``config`` when it changes (docs/pretrained.md "Preprocessing parity").

    ``recorded``: the workdir's ``config.json`` (a run that resumes): with the same
    ``init_from`` its values are taken, whatever they are; with ``sources`` not given a
    resumed run reads no source (it restores its own checkpoint and reads nothing from its
    sources), so a changed ``init_from`` leaves the config as it is. ``sources``: the
    ``init_from`` entries' descriptions (:func:`~contrastive_jax.training.models.converters.
    pretrained_source.read_source`), read here when needed if not given and the run does not
    resume. A config that sets other values than the source's keeps them, with a warning."""
    preprocess = config.get("data", {}).get("preprocess", {})
    specs = init_specs(config.model.get("init_from", ""))
    if preprocess.get("name", "standard") != "image_text" or not specs:
        return config, []
    given = {k: preprocess.get(k) for k in PIXEL_FIELDS if preprocess.get(k) is not None}
    before = dict(recorded or {})
    before_pre = dict(dict(before.get("data") or {}).get("preprocess") or {})
    if (not given and all(k in before_pre for k in PIXEL_FIELDS)
            and init_specs(dict(before.get("model") or {}).get("init_from", "")) == specs):
        stored = {k: before_pre[k] for k in PIXEL_FIELDS}
        if all(v is None for v in stored.values()):
            return config, []
        return _with_pixels(config, stored), [
            f"data.preprocess.mean / std as recorded in the run's config.json: mean "
            f"{stored['mean']}, std {stored['std']}"]
    if sources is None and recorded is not None:  # resuming: no source is read
        return config, []
    if sources is None:
        sources = [read_source(spec.path) for spec in specs]
    for source in sources:
        pixels = source.preprocess or {}
        if any(pixels.get(k) is None for k in PIXEL_FIELDS):
            continue
        stored = {k: [float(v) for v in pixels[k]] for k in PIXEL_FIELDS}
        if given:
            same = all(np.allclose(given.get(k, np.nan), stored.get(k, np.nan))
                       for k in PIXEL_FIELDS)
            return config, [] if same else [
                f"warning: data.preprocess mean/std {given} differ from those the pretrained "
                f"model expects ({_pixels_origin(source)}: {stored}); keeping the config's"]
        return _with_pixels(config, stored), [
            f"data.preprocess.mean / std from {_pixels_origin(source)} (the pixels the "
            f"pretrained model expects): mean {stored['mean']}, std {stored['std']}"]
    return config, []


def _pixels_origin(source: PretrainedSource) -> str:
    """Where a source's pixel settings were read, for messages."""
    return {"converted": f"{source.location}/preprocess.json",
            "workdir": f"{source.location}/config.json",
            "open_clip": f"{source.location}'s open_clip preprocess_cfg"}.get(
                source.kind, source.description)


def _with_pixels(config: ml_collections.ConfigDict, pixels: Mapping[str, Any]
                 ) -> ml_collections.ConfigDict:
    config = config.copy_and_resolve_references()
    config.data.preprocess.update(dict(pixels))
    return config


__all__ = ["RunSpec", "check_batch", "resolve", "source_pixels", "total_steps"]
