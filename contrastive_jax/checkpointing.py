"""Checkpoints with orbax: the train state and the data iterator, saved together.

``workdir/checkpoints/<step>/{state,data}``: ``state`` is the whole train state pytree (step,
parameters, non-parameter model state such as BatchNorm statistics, optimiser state, rng,
MoCo key encoder and queue), ``data`` the grain iterator's position (one JSON file per
process). Saves are asynchronous (the next steps run while the files are written), happen
every ``checkpoint_every`` steps and at the end, and the last ``keep_checkpoints`` are kept. A
run started with a workdir that holds checkpoints resumes from the latest one.
"""

from __future__ import annotations

import pathlib

import grain
import jax
import orbax.checkpoint as ocp


def manager(workdir: str | pathlib.Path, *, every: int, keep: int) -> ocp.CheckpointManager:
    """An async CheckpointManager under ``workdir/checkpoints``."""
    if every < 1 or keep < 1:
        raise ValueError(f"checkpoint_every and keep_checkpoints must be >= 1; got {every}, "
                         f"{keep}")
    options = ocp.CheckpointManagerOptions(save_interval_steps=every, max_to_keep=keep,
                                           enable_async_checkpointing=True, create=True)
    return ocp.CheckpointManager(pathlib.Path(workdir).resolve() / "checkpoints",
                                 options=options, item_names=("state", "data"))


def save(mgr: ocp.CheckpointManager, step: int, state, data_iterator, *,
         force: bool = False) -> bool:
    """Save ``state`` and the iterator at ``step`` if due (or ``force``); whether it saved."""
    return mgr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=grain.checkpoint.CheckpointSave(data_iterator)), force=force)


def restore_latest(mgr: ocp.CheckpointManager, state_template, data_iterator):
    """``(state, step)`` from the latest checkpoint (the iterator is restored in place), or
    ``(state_template, None)`` when there is none. ``state_template`` gives the structure,
    shapes, dtypes and shardings."""
    step = mgr.latest_step()
    if step is None:
        return state_template, None
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state_template)
    restored = mgr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract),
        data=grain.checkpoint.CheckpointRestore(data_iterator)))
    return restored["state"], step
