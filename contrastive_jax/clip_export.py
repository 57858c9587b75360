"""Export a trained or converted dual encoder as an open_clip model directory.

    python -m contrastive_jax.clip_export \\
        --workdir=W | --converted=DIR  --output=OUT [--step=N] [--timm_model_name=NAME]

reads the parameters of a trainer workdir (its latest usable checkpoint, or ``--step``; the
model block and pixel settings from its ``config.json``) or of a converted directory
(``model.json``, ``params/``, ``preprocess.json``;
:mod:`~contrastive_jax.training.models.converters.converted_directory`) and writes the
layout of an open_clip model on the Hugging Face hub ([OpenCLIP] in docs/references.md)::

    OUT/open_clip_model.safetensors  the state dict open_clip's model holds (float32, every key)
    OUT/open_clip_config.json        {"model_cfg": the open_clip model config that builds
                                      exactly this architecture, "preprocess_cfg": mean, std,
                                      interpolation, resize_mode}

which open_clip loads with ``open_clip.create_model_and_transforms("local-dir:OUT")`` (a model
whose image tower is a timm trunk that timm does not register, ``--timm_model_name``, needs
that name registered first; ``timm_model_args`` in the config gives its arguments).

What open_clip can hold, and what is refused by name:
:mod:`contrastive_jax.training.models.converters.open_clip_export` (docs/pretrained.md,
"Exporting to open_clip").
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
from absl import flags

from contrastive_jax import command_line
from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models.converters.open_clip_export import export, read_converted
from contrastive_jax.training.parameter_paths import leaves_by_path, nested
from contrastive_jax.training.run import init_from
from contrastive_jax.training.run.workdir.config_record import recorded_config, upgrade


def read_workdir(workdir: str | os.PathLike, step: int | None = None
                 ) -> tuple[dict[str, Any], dict, dict[str, Any], str]:
    """``(model block, params, data.preprocess, description)`` of a trainer workdir: its
    ``config.json`` and its latest usable checkpoint's ``state.params``, or checkpoint
    ``step`` (:func:`contrastive_jax.training.run.init_from.read`)."""
    recorded = recorded_config(workdir)
    if recorded is None:
        raise ConfigError(f"--workdir {workdir}: no config.json, so not a trainer workdir "
                          "(a converted directory is --converted)")
    recorded = upgrade(recorded)
    preprocess = dict(dict(recorded.get("data") or {}).get("preprocess") or {})
    stored = init_from.read(workdir, step=step)
    for why in stored.skipped:
        print(f"warning: --workdir {workdir}: {why}; using an earlier one")
    return dict(recorded.get("model") or {}), nested(stored.params), preprocess, \
        stored.description


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
        block, params, preprocess, where = read_workdir(_WORKDIR.value, _STEP.value)
    else:
        block, params, preprocess, where = read_converted(_CONVERTED.value)
    config = export(_OUTPUT.value, block, params, preprocess,
                    timm_model_name=_TIMM_MODEL_NAME.value)
    leaves = leaves_by_path(params).values()
    count = sum(int(np.prod(np.shape(x))) for x in leaves)
    kind = ("CustomTextCLIP, timm trunk " + config["model_cfg"]["vision_cfg"]["timm_model_name"]
            if config["model_cfg"].get("custom_text") else "CLIP")
    print(f"wrote {_OUTPUT.value} from {where}: {count:,} parameters (open_clip {kind}); load "
          f"with open_clip.create_model_and_transforms('local-dir:{_OUTPUT.value}')")


if __name__ == "__main__":
    sys.exit(main())
