"""A checkpoint resumed by another number of processes than the run that wrote it.

Each process saves its own place in the data (grain's ``data/process_I-of-N.json``, in the
checkpoint's step folder), so a checkpoint of ``N`` processes does not restore into ``M``:
:func:`~contrastive_jax.training.run.checkpoints.restore_latest` refuses it
(:func:`process_count_refusal`) unless ``--resplit_data``. Then every process starts at the
batch the saved run would have read next (:func:`resplit_position`): every saved state is the
same batch index ``k``, and batch ``k`` of any process count holds the same examples (each
process reads batch ``k`` of its own slice of one global stream; tests/test_data_pipeline.py),
in another row order, so with other per-row random augmentations: a continuation, not the
saved run's own.
"""

from __future__ import annotations

import json
import re

import jax
from etils import epath

from contrastive_jax.errors import CheckpointError

DATA_FILE = re.compile(r"process_\d+-of-(\d+)\.json")  # grain's file per process
STREAM_STATE = '"image-text shards"'  # in a stream reader's state (data/stream/shard_stream.py)


def saved_process_count(directory: epath.Path, step: int) -> int | None:
    """How many processes wrote checkpoint ``step`` of the checkpoint ``directory``, or None
    when that cannot be read."""
    try:
        names = [p.name for p in (directory / str(step) / "data").iterdir()]
    except OSError:
        return None
    counts = {int(m.group(1)) for m in map(DATA_FILE.fullmatch, names) if m}
    return counts.pop() if len(counts) == 1 else None


def process_count_refusal(directory, step: int, saved_by: int) -> str:
    """The message for a checkpoint of ``saved_by`` processes resumed by this run's count."""
    return (f"checkpoint {step} in {directory} was written by a run of {saved_by} "
            f"process{'es' if saved_by > 1 else ''} and this run has {jax.process_count()}: "
            f"each process saved its own place in the data. Resume with {saved_by} "
            "processes, or add --resplit_data to continue at the same batch (each step then "
            "trains on the same examples in another row order, with other random "
            f"augmentations: a continuation, not the run {saved_by} processes would make)")


def resplit_position(directory: epath.Path, step: int, saved_by: int, data_iterator) -> None:
    """Set ``data_iterator`` (this process's) to the batch checkpoint ``step``'s run would
    have read next (module docstring); a :class:`CheckpointError` for the position of grain
    worker processes, which is per worker and cannot be split again."""
    path = directory / str(step) / "data" / f"process_0-of-{saved_by}.json"
    saved = json.loads(path.read_text())
    if set(saved) != {"next_index"}:
        what = ("a stream of shards (each reader's shards, buffer and place in them)"
                if STREAM_STATE in path.read_text() else
                "grain worker processes (data.worker_count > 0)")
        raise CheckpointError(
            f"checkpoint {step} in {directory} holds the data position of {what}, which "
            f"cannot be split again over another process count: resume with {saved_by} "
            "processes")
    data_iterator.set_state(saved)
