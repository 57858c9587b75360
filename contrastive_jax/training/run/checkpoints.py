"""Checkpoints with orbax: the train state and the data iterator, saved together.

``workdir/checkpoints/<step>/{state,data}``: ``state`` is the whole train state pytree (step,
parameters, non-parameter model state such as BatchNorm statistics, optimiser state, rng,
MoCo key encoder and queue), ``data`` the grain iterator's position (one JSON file per
process). Saves are asynchronous (the next steps run while the files are written), happen
every ``checkpoint_every`` steps and at the end, and the last ``keep_checkpoints`` are kept. A
run started with a workdir that holds checkpoints resumes from the latest one.

A checkpoint that cannot be restored (damaged files) or holds non-finite numbers is moved aside
to ``workdir/checkpoints_set_aside/<step>-<reason>-<time>`` (never deleted) and the previous one
is restored; so are the checkpoints a diverged run saved from the step whose parameters led to
the non-finite steps (:func:`set_aside_from`). Only process 0 moves files.

Paths are :class:`etils.epath.Path`: a ``gs://`` workdir keeps its checkpoints in the bucket
(orbax writes the arrays with TensorStore's ``gcs`` driver), and a set-aside there is a copy of
each object followed by a delete (an object store has no rename).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import time
from typing import Any

import grain
import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from etils import epath

from contrastive_jax.errors import (
    STORAGE_ERRNOS,
    CheckpointError,
    ConfigError,
    WorkdirError,
    storage_cause,
)
from contrastive_jax.training.checkpoint_integrity import (
    CHECKSUMS,
    CHECKSUMS_FILE,
    checksum_record,
    checksums_mismatch,
    read_on_host,
)
from contrastive_jax.training.models import scanned_layers
from contrastive_jax.training.parameter_paths import leaves_by_path, path_name
from contrastive_jax.training.run.launch.process_count import (
    process_count_refusal,
    resplit_position,
    saved_process_count,
)
from contrastive_jax.training.run.workdir.workdir_path import absolute, is_remote, write_probe
from contrastive_jax.training.step.train_state import all_finite


def manager(workdir: str | os.PathLike, *, every: int, keep: int,
            timeout_s: int = 1200) -> ocp.CheckpointManager:
    """An async CheckpointManager under ``workdir/checkpoints``, checked writable first (a
    read-only folder would otherwise surface as orbax's 300 s timeout at the first save).
    ``timeout_s``: the longest a save may take (orbax's ``AsyncOptions.timeout_secs``; with
    several processes also the wait at the save's barrier for a process whose write failed)."""
    if every < 1 or keep < 1:
        raise ConfigError(f"checkpoint_every and keep_checkpoints must be >= 1; got {every}, "
                         f"{keep}")
    directory = absolute(workdir) / "checkpoints"
    _check_writable(directory)
    _quiet_orbax_storage_errors()
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int) or timeout_s < 1:
        raise ConfigError(f"checkpoint_timeout_s must be a positive number of seconds; got "
                          f"{timeout_s!r}")
    options = ocp.CheckpointManagerOptions(
        save_interval_steps=every, max_to_keep=keep, enable_async_checkpointing=True,
        create=True, async_options=ocp.AsyncOptions(timeout_secs=timeout_s))
    # the handlers named up front, so that a step's metadata can be read before any save or
    # restore (restore_latest reads it to find the layout a checkpoint was written in)
    return ocp.CheckpointManager(directory, options=options, item_handlers={
        "state": ocp.StandardCheckpointHandler(), "data": grain.checkpoint.CheckpointHandler(),
        CHECKSUMS: ocp.JsonCheckpointHandler(filename=CHECKSUMS_FILE)})


def _check_writable(directory: epath.Path) -> None:
    """Create ``directory`` if needed and write and delete a file in it; a refusal is a
    :class:`WorkdirError` saying why (remote: any error of the storage client)."""
    try:
        write_probe(directory)
    except Exception as err:
        if not isinstance(err, OSError) and not is_remote(directory):
            raise
        reason = STORAGE_ERRNOS.get(getattr(err, "errno", None),
                                    getattr(err, "strerror", None) or str(err))
        raise WorkdirError(f"the checkpoint folder {directory} is not writable "
                           f"({getattr(err, 'strerror', None) or type(err).__name__}: "
                           f"{reason}); a run must save checkpoints there") from None


class _StorageErrorFilter(logging.Filter):
    """Drops orbax's background-thread tracebacks of a refused write (disk full, file-size
    limit, read-only files): the command line reports that cause in one paragraph."""

    def filter(self, record: logging.LogRecord) -> bool:
        err = record.exc_info[1] if record.exc_info else None
        if storage_cause(err) is not None:
            return False
        message = record.getMessage()
        return not any(f"[Errno {n}]" in message or f"os_error_code='{n}'" in message
                       for n in STORAGE_ERRNOS)


def _quiet_orbax_storage_errors() -> None:
    """Install :class:`_StorageErrorFilter`, once, on absl's logger (orbax logs through it) and
    on asyncio's (orbax's writer tasks whose failure nobody awaited: "Task exception was never
    retrieved")."""
    for name in ("absl", "asyncio"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _StorageErrorFilter) for f in logger.filters):
            logger.addFilter(_StorageErrorFilter())


def save(mgr: ocp.CheckpointManager, step: int, state, data_iterator, *,
         force: bool = False, skipped_in_a_row=None) -> bool:
    """Save ``state``, the iterator and the state's :func:`state_checksums` at ``step`` if due
    (or ``force``); whether it saved.

    A save is postponed while updates are being skipped (``skipped_in_a_row``, the train
    step's counter, > 0; read only when a save is due, where the state is waited for anyway):
    such a checkpoint holds the last good parameters under a later step and, saved every few
    steps of a diverging run, would push the good checkpoints out of ``keep`` before the
    guard stops the run and sets the diverged ones aside (docs/reliability.md, "Numerical
    guard"). Pass ``None`` (a signal's save, or the guard turned off) to save regardless."""
    if not (force or mgr.should_save(step)):
        return False
    if skipped_in_a_row is not None and int(skipped_in_a_row) > 0:
        return False
    checksums = checksum_record(state)
    return mgr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=grain.checkpoint.CheckpointSave(data_iterator),
        checksums=ocp.args.JsonSave({"leaves": checksums})), force=True)


SET_ASIDE = "checkpoints_set_aside"


def set_aside(mgr: ocp.CheckpointManager, steps, reason: str, *, warn=print) -> list[str]:
    """Move the step folders ``steps`` of ``mgr`` to ``<workdir>/checkpoints_set_aside/
    <step>-<reason>-<unix time>`` (process 0; a warning each) and reload ``mgr``. Returns the
    new paths. The files are kept for inspection; delete them when done."""
    moved = []
    root = epath.Path(mgr.directory)
    if jax.process_index() == 0:
        for step in sorted(steps):
            source = root / str(step)
            if not source.exists():
                continue
            target = root.parent / SET_ASIDE / f"{step}-{reason}-{int(time.time())}"
            target.parent.mkdir(parents=True, exist_ok=True)
            _move(source, target)
            moved.append(str(target))
            warn(f"warning: checkpoint {step} ({reason}) moved aside to {target}")
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("contrastive_jax: checkpoints set aside")
    mgr.reload()
    return moved


def _move(source: epath.Path, target: epath.Path) -> None:
    """Move the folder ``source`` to ``target``: a rename locally, on remote storage a copy of
    every object then a delete."""
    if not is_remote(source):
        shutil.move(os.fspath(source), os.fspath(target))
        return
    def copy(folder: epath.Path, into: epath.Path) -> None:
        for path in folder.iterdir():
            if path.is_dir():
                copy(path, into / path.name)
            else:
                path.copy(into / path.name)

    copy(source, target)
    source.rmtree()


def set_aside_from(mgr: ocp.CheckpointManager, first: int, reason: str, *,
                   warn=print) -> list[str]:
    """:func:`set_aside` every checkpoint of step ``>= first`` (after the pending saves end):
    a run that stopped on non-finite steps ``first + 1, ...`` saved the parameters that led to
    them at ``first`` and the same parameters later (skipped steps change nothing)."""
    mgr.wait_until_finished()
    return set_aside(mgr, [s for s in mgr.all_steps() if s >= first], reason, warn=warn)


def restore_latest(mgr: ocp.CheckpointManager, state_template, data_iterator, *,
                   warn=print, resplit_data: bool = False):
    """``(state, step)`` from the newest restorable checkpoint (the iterator is restored in
    place), or ``(state_template, None)`` when there is none.

    A checkpoint written by another number of processes is a :class:`CheckpointError` naming
    both counts, unless ``resplit_data``: then the state is restored and every process starts
    at the batch the saved run would have read next (:mod:`~contrastive_jax.training.run.
    launch.process_count`).

    ``state_template`` gives the structure, shapes, dtypes and shardings. A checkpoint written
    with the other layout of a tower's Transformer blocks (unrolled into scanned or back,
    ``model.<tower>.scan``) is restored in its own layout and moved into the template's
    (:func:`~contrastive_jax.training.models.scanned_layers.to_layout`). A checkpoint that
    cannot be read (truncated, corrupted) or holds a non-finite number is moved aside
    (:func:`set_aside`, with a warning) and the previous one is tried, so a rerun never meets
    it again. If none can be read: :class:`CheckpointError`, which says whether the
    checkpoints hold a model of a different shape or depth (a different config; nothing is
    moved) or are all damaged.
    """
    steps = sorted(mgr.all_steps(), reverse=True)
    if not steps:
        return state_template, None
    saved_by = saved_process_count(epath.Path(mgr.directory), steps[0])
    resplit = saved_by is not None and saved_by != jax.process_count()
    if resplit and not resplit_data:
        raise CheckpointError(process_count_refusal(mgr.directory, steps[0], saved_by))
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state_template)
    failures, damaged = [], []
    for step in steps:
        # the target is built from the template and the checkpoint's metadata: an error here
        # is the template's (e.g. shardings that cannot take the other layer layout), not
        # damage, so it is raised as it is and nothing is moved
        try:
            target, into_template = _restore_target(mgr, step, abstract)
        except ValueError as err:
            raise CheckpointError(f"checkpoint {step} in {mgr.directory} holds the other layout "
                                  f"of a tower's blocks, and {err}; nothing was moved") from None
        try:
            if resplit:
                restored = mgr.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(target)))
                resplit_position(epath.Path(mgr.directory), step, saved_by, data_iterator)
            else:
                restored = mgr.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(target),
                    data=grain.checkpoint.CheckpointRestore(data_iterator)))
        except Exception as err:
            failures.append((step, err))
            warn(f"warning: checkpoint {step} in {mgr.directory} cannot be restored "
                 f"({type(err).__name__}: {str(err).splitlines()[0][:200]}); "
                 "trying the previous one")
            damaged.append((step, "damaged"))
            continue
        mismatch = checksums_mismatch(epath.Path(mgr.directory) / str(step), restored["state"])
        if mismatch:
            warn(f"warning: checkpoint {step} in {mgr.directory}: {mismatch}; trying the "
                 "previous one")
            damaged.append((step, "damaged"))
            continue
        state = into_template(restored["state"])
        if not bool(all_finite(state)):
            warn(f"warning: checkpoint {step} in {mgr.directory} holds non-finite numbers; "
                 "trying the previous one")
            damaged.append((step, "non-finite"))
            continue
        _refuse_to_set_aside_sound(mgr, failures)
        for reason in ("damaged", "non-finite"):
            set_aside(mgr, [s for s, r in damaged if r == reason], reason, warn=warn)
        return state, step
    if not failures:
        raise CheckpointError(
            f"every checkpoint in {mgr.directory} (steps {steps}) holds non-finite numbers (a "
            "diverged run). Move them away or use a new --workdir to start over.")
    raise CheckpointError(_explain(mgr, steps, state_template, failures))


def _sound_on_its_own(mgr: ocp.CheckpointManager, step: int) -> bool:
    """Whether checkpoint ``step`` reads on the host without a template and matches its
    checksums, and its data position files are JSON: files that are intact."""
    folder = epath.Path(mgr.directory) / str(step)
    try:
        state = read_on_host(folder / "state")
        for path in (folder / "data").glob("*.json"):
            json.loads(path.read_text())
    except Exception:
        return False
    return checksums_mismatch(folder, state) is None


def _refuse_to_set_aside_sound(mgr: ocp.CheckpointManager, failures) -> None:
    """Before newer checkpoints that failed to restore are moved aside as damaged: a
    :class:`CheckpointError` if one of them is sound on its own (:func:`_sound_on_its_own`),
    i.e. the restore into this template failed, not the files (a library caller's template,
    another layout): a sound checkpoint is never set aside, nor silently passed over for an
    older one."""
    for step, err in failures:
        if _sound_on_its_own(mgr, step):
            raise CheckpointError(
                f"checkpoint {step} in {mgr.directory} reads and matches its checksums, but "
                f"restoring it into this run's state failed ({type(err).__name__}: "
                f"{str(err).splitlines()[0][:300] if str(err) else ''}); nothing was moved. "
                "Resume it with the config (and state shardings) that wrote it.")


def _named_leaves(tree) -> dict[str, Any]:
    """``{leaf name: leaf}`` of a state or a restored / metadata tree (the ``value`` of an
    NNX variable dropped, as an attribute or a key)."""
    return leaves_by_path(tree, drop_value=True)


def _restore_target(mgr: ocp.CheckpointManager, step: int, abstract):
    """``(restore target, function from the restored tree to the template's)``: the abstract
    template itself when the checkpoint has its layout (or its metadata cannot be read: the
    restore then fails and says why), else the checkpoint's own tree of shape structs with
    the template's shardings moved to that layout, and a jitted move back."""
    try:
        meta = mgr.item_metadata(step)["state"]
        tree = getattr(meta, "tree", meta)
        saved = _named_leaves(tree)
    except Exception:
        return abstract, lambda state: state
    want = _named_leaves(abstract)
    if set(saved) == set(want):
        return abstract, lambda state: state
    moved = scanned_layers.to_layout(want, saved, stack=scanned_layers.abstract_stack,
                                     row=scanned_layers.abstract_row)
    if set(moved) != set(saved) or any(tuple(moved[k].shape) != tuple(saved[k].shape)
                                       for k in saved if hasattr(saved[k], "shape")):
        return abstract, lambda state: state  # another model: the restore says so
    target = jax.tree_util.tree_map_with_path(
        lambda path, _: moved[path_name(path, drop_value=True)], tree)
    names, treedef = list(want), jax.tree.structure(abstract)
    shardings = {k: v.sharding for k, v in want.items()}

    @functools.partial(jax.jit, out_shardings=shardings)
    def into_layout(flat):
        return scanned_layers.to_layout(flat, names, stack=jnp.stack)

    def into_template(restored):
        flat = into_layout(_named_leaves(restored))
        return jax.tree.unflatten(treedef, [flat[k] for k in names])

    return target, into_template


def _paths(tree) -> set[str]:
    """The leaf paths of a pytree as ``a/b/c`` strings (dict keys and dataclass fields alike)."""
    def name(entry):
        for attr in ("key", "name", "idx"):
            if hasattr(entry, attr):
                return str(getattr(entry, attr))
        return str(entry)

    leaves = jax.tree_util.tree_flatten_with_path(
        tree, is_leaf=lambda x: hasattr(x, "shape") and not isinstance(x, dict))[0]
    return {"/".join(name(e) for e in path) for path, _ in leaves}


def _explain(mgr, steps, state_template, failures) -> str:
    want = sorted(tuple(leaf.shape) for leaf in jax.tree.leaves(state_template))
    try:
        meta = mgr.item_metadata(steps[0])["state"]
        tree = getattr(meta, "tree", meta)
        have = sorted(tuple(m.shape) for m in jax.tree.leaves(tree) if hasattr(m, "shape"))
        layout = _paths(tree) ^ _paths(state_template)
        depths = (scanned_layers.depths(_named_leaves(tree)),
                  scanned_layers.depths(_named_leaves(state_template)))
    except Exception:
        have, layout, depths = None, set(), ({}, {})
    top_level = {p.split("/")[0] for p in layout}
    differ = sorted(k for k in depths[0].keys() & depths[1].keys()
                    if k.startswith("params/") and depths[0][k] != depths[1][k])
    if differ:
        stack = differ[0]
        tower = stack[len("params/"):-len("/blocks")].replace("/", ".")
        return (f"the checkpoints in {mgr.directory} (steps {steps}) hold {depths[0][stack]} "
                f"Transformer blocks in {stack[len('params/'):]} but this config builds "
                f"{depths[1][stack]}: set model.{tower}.depth = {depths[0][stack]} to resume "
                "them, or use a new --workdir")
    if have is not None and top_level - {"params", "rest", "opt_state", "extra"}:
        return (f"the checkpoints in {mgr.directory} (steps {steps}) were written with another "
                f"train-state layout (entries {sorted(top_level)[:6]} differ): an older "
                f"contrastive_jax (0.2.0 keeps the train state as a TrainState with the method's "
                "state under 'extra') or another method. Resume them with the version and "
                "config that wrote them, or use a new --workdir.")
    if have is not None and have != want:
        extra = sorted(set(have) - set(want))[:3]
        missing = sorted(set(want) - set(have))[:3]
        return (f"the checkpoints in {mgr.directory} (steps {steps}) hold a model of a "
                f"different shape than this config builds (shapes only there: {extra}; only in "
                f"this config: {missing}). Use a new --workdir, or the config that wrote them.")
    last = failures[0][1]
    return (f"none of the checkpoints in {mgr.directory} (steps {steps}) can be restored; the "
            f"newest failed with {type(last).__name__}: {str(last).splitlines()[0][:300]}. "
            "Delete the damaged step folders to start over from the last good one, or use a "
            "new --workdir.")
