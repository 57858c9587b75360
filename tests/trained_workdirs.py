"""Trained workdirs that several tests start from (not a test): trained once per test process,
copied into each test's own folder.

A test that begins with the same run (the same config, from scratch) copies this run's
workdir instead of training it again: the files are those the run writes (checkpoints,
``config.json``, ``results.json``, ``metrics.jsonl``, TensorBoard events); the workdir lock is
an ``flock`` held only while a run lives, so a copy is free to run in.
"""

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

from test_train import load_config


def simclr_quick_config():
    """SimCLR's quick config without evaluation: 6 steps, checkpoints at 3 and 6."""
    config = load_config("simclr_mnist1d.py:quick")
    config.evaluation.enabled = False
    assert (config.total_steps, config.checkpoint_every) == (6, 3)
    return config


@functools.cache
def _simclr_quick_trained() -> Path:
    from contrastive_jax.training import train

    folder = Path(tempfile.mkdtemp(prefix="simclr_quick_"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    train.train_and_evaluate(simclr_quick_config(), str(folder / "workdir"))
    return folder / "workdir"


def simclr_quick_workdir(dest: Path) -> Path:
    """``dest`` (created, or an existing empty folder) holding a copy of the workdir of
    ``train_and_evaluate(simclr_quick_config(), ...)``: trained at the first call of the
    process, copied at every call."""
    shutil.copytree(_simclr_quick_trained(), dest, dirs_exist_ok=True)
    return Path(dest)
