"""Command line: ``python -m contrastive_jax.main --config=configs/X.py[:variant] --workdir=DIR``.

Any field can be overridden: ``--config.data.batch_size=256 --config.loss.temperature=0.2``.
Run the same command on every host of a pod (see README "Launching"); a workdir that holds
checkpoints resumes. Results go to ``DIR/results.json``, TensorBoard scalars to
``DIR/tensorboard``, per-step metrics to ``DIR/metrics.jsonl``, checkpoints to
``DIR/checkpoints``.
"""

from __future__ import annotations

from absl import app, flags, logging
from ml_collections import config_flags

from contrastive_jax.distributed import initialize, launch_settings

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file (.py).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs and results.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not flags.FLAGS["verbosity"].present:  # orbax and tfds log every file at INFO
        logging.set_verbosity(logging.WARNING)
    config = _CONFIG.value
    initialize(launch_settings(config.get("launch")))
    from contrastive_jax.train import train_and_evaluate  # after the distributed start-up

    train_and_evaluate(config, _WORKDIR.value)


if __name__ == "__main__":
    app.run(main)
