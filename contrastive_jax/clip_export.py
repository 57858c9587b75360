"""Export a trained or converted dual encoder as an open_clip model directory.

    python -m contrastive_jax.clip_export \\
        --workdir=W | --converted=DIR  --output=OUT [--step=N] [--timm_model_name=NAME]

reads the parameters of a trainer workdir (its latest usable checkpoint, or ``--step``; the
model block and pixel settings from its ``config.json``) or of a converted directory
(``model.json``, ``params/``, ``preprocess.json``;
:mod:`~contrastive_jax.training.models.converters.pretrained_source`) and writes the
layout of an open_clip model on the Hugging Face hub ([OpenCLIP] in docs/references.md)::

    OUT/open_clip_model.safetensors  the state dict open_clip's model holds (float32, every key)
    OUT/open_clip_config.json        {"model_cfg": the open_clip model config that builds
                                      exactly this architecture, "preprocess_cfg": mean, std,
                                      interpolation, resize_mode}

which open_clip loads with ``open_clip.create_model_and_transforms("local-dir:OUT")`` (a model
whose image tower is a timm trunk that timm does not register, ``--timm_model_name``, needs
that name registered first; ``timm_model_args`` in the config gives its arguments).

What open_clip can hold, and what is refused by name:
:mod:`contrastive_jax.training.models.converters.open_clip.export_files` (docs/pretrained.md,
"Exporting to open_clip").
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import numpy as np
from absl import flags

from contrastive_jax import command_line
from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models.converters.open_clip.export_files import export
from contrastive_jax.training.models.converters.pretrained_source import (
    PretrainedSource,
    read_source,
    source_kind,
    with_weights,
)
from contrastive_jax.training.parameter_paths import leaves_by_path


def read_export_source(path: str | os.PathLike, kind: str, step: int | None = None
                       ) -> PretrainedSource:
    """The source to export, with its weights: ``kind`` ``"workdir"`` (``--workdir``: its
    latest usable checkpoint, or ``step``; the model block and pixel settings from its
    ``config.json``) or ``"converted"`` (``--converted``), read by the one pretrained-source
    reader (:mod:`~contrastive_jax.training.models.converters.pretrained_source`); a path of
    another kind is a :class:`ConfigError` naming the flag that fits."""
    flag = {"workdir": "--workdir", "converted": "--converted"}[kind]
    found = source_kind(path)
    if found != kind:
        other = {"workdir": "a trainer workdir is --workdir",
                 "converted": "a converted directory is --converted"}.get(found, "")
        what = {"workdir": "config.json and checkpoints/", "converted": "model.json and "
                "params/"}[kind]
        raise ConfigError(f"{flag} {path}: no {what}, so not a "
                          f"{'trainer workdir' if kind == 'workdir' else 'converted directory'}"
                          f"{' (' + other + ')' if other else ''}")
    source = with_weights(read_source(path, step=step))
    if not source.model:
        raise ConfigError(f"{flag} {path}: no config.json, so the model is not recorded")
    for why in source.skipped:
        print(f"warning: {flag} {path}: {why}; using an earlier one")
    return source


FLAGS = flags.FlagValues()  # this command's own (contrastive_jax.command_line)
_WORKDIR = flags.DEFINE_string("workdir", None, "a trainer workdir to export (its latest "
                               "usable checkpoint, or --step)", flag_values=FLAGS)
_CONVERTED = flags.DEFINE_string("converted", None, "a converted directory (model.json, "
                                 "params/) to export", flag_values=FLAGS)
_OUTPUT = flags.DEFINE_string("output", None, "new directory to write", flag_values=FLAGS)
_STEP = flags.DEFINE_integer("step", None, "with --workdir: this checkpoint step (default: "
                             "the latest usable)", flag_values=FLAGS)
_TIMM_MODEL_NAME = flags.DEFINE_string(
    "timm_model_name", None, "the timm model that is the image trunk of a SigLIP-shaped model, "
    "when timm registers none of its sizes (you register it; the config records its "
    "arguments as timm_model_args)", flag_values=FLAGS)
COMMAND = command_line.Command(
    program="python -m contrastive_jax.clip_export", doc=__doc__,
    flag_values=FLAGS, required=("output",))


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (module docstring; ``argv``: its arguments, ``sys.argv[1:]`` when
    None): 0 when exported; an error a user can fix prints ``error: ...`` and returns 2
    (:func:`contrastive_jax.command_line.run_command`)."""
    return command_line.run_command(COMMAND, _export, argv)


def _export(positional: list[str]) -> None:
    """Read ``--workdir`` or ``--converted``, write ``--output``, print what was written."""
    if (_WORKDIR.value is None) == (_CONVERTED.value is None):
        raise ConfigError("give exactly one of --workdir (a trainer workdir) and --converted "
                          "(a converted directory)")
    if _STEP.value is not None and _WORKDIR.value is None:
        raise ConfigError("--step applies to --workdir (a converted directory holds one set "
                          "of parameters)")
    if _WORKDIR.value is not None:
        source = read_export_source(_WORKDIR.value, "workdir", _STEP.value)
    else:
        source = read_export_source(_CONVERTED.value, "converted")
    config = export(_OUTPUT.value, source.model, source.params, source.preprocess,
                    timm_model_name=_TIMM_MODEL_NAME.value)
    where = source.description
    leaves = leaves_by_path(source.params).values()
    count = sum(int(np.prod(np.shape(x))) for x in leaves)
    kind = ("CustomTextCLIP, timm trunk " + config["model_cfg"]["vision_cfg"]["timm_model_name"]
            if config["model_cfg"].get("custom_text") else "CLIP")
    print(f"wrote {_OUTPUT.value} from {where}: {count:,} parameters (open_clip {kind}); load "
          f"with open_clip.create_model_and_transforms('local-dir:{_OUTPUT.value}')")


if __name__ == "__main__":
    sys.exit(main())
