"""Command line: ``python -m contrastive_jax.main --config=configs/X.py[:variant] --workdir=DIR``.

Any field can be overridden: ``--config.data.batch_size=256 --config.loss.temperature=0.2``.
Run the same command on every host of a pod (see README "Launching"); a workdir that holds
checkpoints resumes. Results go to ``DIR/results.json``, TensorBoard scalars to
``DIR/tensorboard``, per-step metrics to ``DIR/metrics.jsonl``, checkpoints to
``DIR/checkpoints``.

Exit status: 0 when the run finished or was stopped by SIGTERM/SIGINT after saving a
checkpoint; 2 with a one-paragraph ``error: ...`` message (no traceback) for a bad config,
bad input data, an unusable workdir or checkpoint, or a run that kept producing non-finite
losses. Set ``CONTRASTIVE_JAX_TRACEBACK=1`` to see the traceback instead.
"""

from __future__ import annotations

import os
import pathlib
import sys
import uuid

from absl import app, flags, logging
from ml_collections import config_flags

from contrastive_jax.training.distributed import initialize, launch_settings

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file (.py).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs and results.")
flags.mark_flags_as_required(["config", "workdir"])


class UsageError(ValueError):
    """A problem with the command line or its environment that the user must fix."""


def check_workdir(workdir: str) -> None:
    """Create ``workdir`` if needed and check that a file can be written there."""
    if "://" in workdir:  # gs://... : checked by orbax on first write
        return
    path = pathlib.Path(workdir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{uuid.uuid4().hex}"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise UsageError(f"workdir {workdir} is not writable ({err.strerror}); choose another "
                         "--workdir") from None


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not flags.FLAGS["verbosity"].present:  # orbax and tfds log every file at INFO
        logging.set_verbosity(logging.WARNING)
    config = _CONFIG.value
    check_workdir(_WORKDIR.value)
    initialize(launch_settings(config.get("launch")))
    from contrastive_jax.training.train import train_and_evaluate  # after the distributed start-up

    train_and_evaluate(config, _WORKDIR.value)


def _user_errors() -> tuple[type[BaseException], ...]:
    from contrastive_jax.training.checkpoints import CheckpointError
    from contrastive_jax.training.data.sources import DatasetNotPreparedError
    from contrastive_jax.training.train import NonFiniteError

    # ValueError / TypeError / KeyError / AttributeError: bad settings (config_flags reports
    # unknown keys as AttributeError with "Did you mean ...", wrong types as TypeError)
    return (ValueError, TypeError, KeyError, AttributeError, DatasetNotPreparedError,
            CheckpointError, NonFiniteError, flags.Error)


def run() -> None:
    """``app.run(main)`` with user errors reported as one message and exit status 2."""
    try:
        app.run(main)
    except _user_errors() as err:
        if os.environ.get("CONTRASTIVE_JAX_TRACEBACK"):
            raise
        message = str(err).strip().strip("'\"").replace("\\n", "\n").replace("\\'", "'")
        if isinstance(err, AttributeError) and "Did you mean" in message:
            message = f"unknown config key {message}"
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    run()
