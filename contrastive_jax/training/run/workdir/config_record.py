"""``workdir/config.json``: the resolved config of a run, and the check that a resume keeps it.

Every run writes its whole config (after variants and command-line overrides) to
``workdir/config.json`` at start. A run that resumes from the workdir's checkpoints compares its
config with the recorded one: a difference outside :data:`MAY_CHANGE` (the run's length,
logging, checkpointing, evaluation, profiling, launch settings, where the data lives, the
mesh and the state's sharding, which a checkpoint restores onto whatever they are, and how the
Transformer blocks run: the attention kernel and the scanned or unrolled layout, which a
checkpoint restores into either way) would silently
continue another experiment, so it stops with the list of differences, unless the change is
accepted (``--accept_config_change``); the replaced record is then kept as
``config-before-step-<N>.json``. Both files are read and written through
:class:`etils.epath.Path`, so a ``gs://`` workdir works the same
(:mod:`~contrastive_jax.training.run.workdir.workdir_path`).

Records written by earlier releases are read in today's keys (:func:`upgrade`, applied to both
sides before comparing), so a workdir keeps resuming across a rename of its config's keys:

- ``model.name`` ``"simclr"`` / ``"moco"`` -> ``"projected_encoder"`` (one model for both,
  :data:`~contrastive_jax.training.models.DEPRECATED_MODEL_NAMES`);
- ``model.momentum`` -> ``moco.momentum``, ``model.queue_size`` -> ``moco.queue_size`` (MoCo's
  settings are the method's block, :class:`~contrastive_jax.training.methods.MoCoSettings`);
- fields added since, at the value that reproduces the old run (:data:`ADDED_FIELDS`:
  ``data.worker_count`` = 0; the ``profile`` block, off; ``transfer_guard`` = "allow";
  ``log_model_flops`` = True; ``checkpoint_timeout_s`` = 1200).

``data.worker_count`` never changes on a resume, even when accepted: the saved data stream
holds each worker's position, so another count cannot continue it.
"""

from __future__ import annotations

import copy
import json
import math
import os
from collections.abc import Mapping
from typing import Any

import jax
import ml_collections
from etils import epath

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models import MOVED_TO_METHODS, upgraded_model_block
from contrastive_jax.training.run import profiling
from contrastive_jax.training.run.workdir import json_output

RECORD = "config.json"
# fields records written before them lack (a path of keys): the value that reproduces them
ADDED_FIELDS = {("data", "worker_count"): 0, ("data", "source"): "tfds", ("data", "shards"): "",
                ("data", "heldout_shards"): "", ("data", "shuffle_buffer"): 5000,
                ("data", "image_column"): "jpg", ("data", "caption_column"): "caption",
                ("profile",): profiling.DEFAULTS,
                ("transfer_guard",): "allow", ("log_model_flops",): True,
                ("checkpoint_timeout_s",): 1200, ("evaluation", "tasks"): (),
                ("evaluation", "tasks_data_dir"): "", ("evaluation", "tasks_batch_size"): 0,
                ("evaluation", "tasks_class_names"): "", ("evaluation", "evaluators"): (),
                ("evaluation", "task_overrides"): {
                    "test_split": "", "train_split": "", "image_key": "", "label_key": "",
                    "caption_key": ""}}
FIXED_ON_RESUME = ("data.worker_count",)
MAY_CHANGE = ("total_steps", "num_epochs", "log_every", "checkpoint_every", "keep_checkpoints",
              "checkpoint_timeout_s",
              "max_skipped_in_a_row", "evaluation", "launch", "data.data_dir", "mesh",
              "sharding", "profile", "transfer_guard", "log_model_flops", "model.attention",
              "model.encoder.scan", "model.sample_encoder.scan", "model.text_encoder.scan")


def plain(config: ml_collections.ConfigDict | Mapping) -> dict[str, Any]:
    """``config`` as JSON values: tuples as lists, non-finite floats as ``"inf"``, ``"-inf"``,
    ``"nan"`` (so the record keeps them, where strict JSON has no such numbers)."""
    def convert(value):
        if isinstance(value, Mapping):
            return {str(k): convert(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [convert(v) for v in value]
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        return value

    data = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else config
    return convert(data)


def upgrade(record: Mapping) -> dict[str, Any]:
    """A config as plain values (:func:`plain`) in today's keys: a deprecated ``model.name``
    replaced by the model it names, and the model settings that moved to a method's block
    (``model.momentum`` -> ``moco.momentum``, ...) moved there (see the module docstring).
    Today's records come back unchanged."""
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in record.items()}
    for path, value in ADDED_FIELDS.items():  # paths of one or two keys
        block = out if len(path) == 1 else out.get(path[0])
        if isinstance(block, dict):
            block.setdefault(path[-1], copy.deepcopy(value))
    model = out.get("model")
    if not isinstance(model, dict):
        return out
    for key, new in MOVED_TO_METHODS.items():
        if key in model:
            block, _, name = new.partition(".")
            out.setdefault(block, {})[name] = model[key]
    out["model"] = upgraded_model_block(model)
    return out


def flatten(tree: Mapping, prefix: str = "") -> dict[str, Any]:
    """``{"a.b.c": leaf}`` for a nested mapping (an empty mapping is a leaf ``{}``)."""
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def changes(old: Mapping, new: Mapping) -> list[tuple[str, Any, Any]]:
    """``(key, old value, new value)`` for every flattened key whose value differs (a missing
    key reads ``"<absent>"``), except the keys under :data:`MAY_CHANGE`."""
    a, b = flatten(old), flatten(new)
    absent = "<absent>"
    return [(k, a.get(k, absent), b.get(k, absent)) for k in sorted(a.keys() | b.keys())
            if a.get(k, absent) != b.get(k, absent)
            and not any(k == m or k.startswith(m + ".") for m in MAY_CHANGE)]


def recorded_config(workdir: str | os.PathLike) -> dict[str, Any] | None:
    """``workdir/config.json`` as written (an earlier run's config), or None if there is none
    (a record that is not JSON is an error naming it)."""
    path = epath.Path(workdir) / RECORD
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as err:
        raise ConfigError(f"{path} is not valid JSON ({err}); restore it, or use a new "
                          "--workdir") from None


def check_config(config: ml_collections.ConfigDict, workdir: str | os.PathLike, *,
                 resuming_from: int | None, accept_change: bool = False
                 ) -> list[tuple[str, Any, Any]]:
    """The :func:`changes` from ``workdir/config.json`` to ``config`` when the run resumes
    from the checkpoint of step ``resuming_from`` (none for a fresh run or no record).

    Raises :class:`~contrastive_jax.errors.ConfigError` listing them unless ``accept_change``.
    """
    record = recorded_config(workdir) if resuming_from is not None else None
    if record is None:
        return []
    diff = changes(upgrade(record), upgrade(plain(config)))
    for key, a, _ in diff:
        if key in FIXED_ON_RESUME:
            raise ConfigError(
                f"{key} was {a!r} when the checkpoints in {workdir} were written; a resume must "
                f"keep it (the saved data stream holds each worker's position): set {key}={a!r}"
                ", or use a new --workdir")
    if diff and not accept_change:
        lines = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in diff[:12])
        more = f" (and {len(diff) - 12} more)" if len(diff) > 12 else ""
        raise ConfigError(
            f"the checkpoints in {workdir} (step {resuming_from}) were written with another "
            f"config; resuming would continue a different run. Differences: {lines}{more}. "
            "Resume with the recorded config (workdir/config.json), use a new --workdir, or "
            "pass --accept_config_change to continue with this one.")
    return diff


def write_config(config: ml_collections.ConfigDict, workdir: str | os.PathLike, *,
                 changed_at: int | None = None, warn=print) -> None:
    """Write ``workdir/config.json`` (process 0, atomically); with ``changed_at``, a step, the
    record it replaces is kept as ``config-before-step-<changed_at>.json``."""
    if jax.process_index() != 0:
        return
    path = epath.Path(workdir) / RECORD
    if changed_at is not None and path.exists():
        kept = path.with_name(f"config-before-step-{changed_at}.json")
        path.replace(kept)
        warn(f"warning: config changed at step {changed_at}; the old one is kept as {kept}")
    json_output.write_atomic(path, plain(config))
