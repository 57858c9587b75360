"""The evaluation command's outputs: ``results.json``, ``results.csv`` and ``results.md`` in
the output directory, rewritten after every task (a task that fails loses no other's result).

The folder is checked and locked before any work (:func:`output_folder`): an ``--output`` that
is empty, remote, a file, under a file or not writable is a :class:`~contrastive_jax.errors.
ConfigError` / :class:`~contrastive_jax.errors.WorkdirError` at start, and a second command
on the same folder is refused with the first one's pid (the trainer's workdir lock,
:func:`~contrastive_jax.training.run.workdir.workdir_lock.folder_lock`). Each file is written
to a temporary file of a name unique to the writer and renamed over the old one, so a reader
(or a kill) sees the previous file or the new one; temporary files left by a killed command
are removed when the next one takes the folder. A write the system refuses later (a full
disk, a file-size limit) is a :class:`~contrastive_jax.errors.WorkdirError` naming the file,
its temporary file removed and the previous ``results.*`` left as they were.

``results.json``::

    {"model": description, "command": {flag: value}, "provenance": {...},
     "tasks": {"zeroshot/cifar10": {"status": "ok", "metrics": {"acc1": ...}, "main_metric":
               "acc1", "examples": n, "seconds": s, ...},
               "retrieval/x": {"status": "failed", "error": "what to change"}}}

``results.csv``: one row per (task, metric): ``task,kind,dataset,metric,value``.
``results.md``: the provenance line and one row per task: its main metric first, then the rest.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import os
import pathlib
from collections.abc import Iterator, Mapping
from typing import Any

from contrastive_jax.errors import STORAGE_ERRNOS, ConfigError, WorkdirError
from contrastive_jax.training.run.workdir import json_output
from contrastive_jax.training.run.workdir.workdir_lock import folder_lock
from contrastive_jax.training.run.workdir.workdir_path import write_probe

RESULT_FILES = ("results.json", "results.csv", "results.md")
PER_SEED = "_seed"  # few-shot per-seed scores: in the JSON and CSV, not in the table


@contextlib.contextmanager
def output_folder(output: str) -> Iterator[pathlib.Path]:
    """The output folder ``output``, created, checked writable and locked for the ``with``
    block (temporary files a killed command left in it removed). One line a user can act on,
    before any work, for an empty or remote ``output``, an existing file, a path under a file,
    a folder that cannot be created or written, or one another command holds (its pid)."""
    if not output or not output.strip():
        raise ConfigError("--output is empty: give the folder for results.json, results.csv "
                          "and results.md")
    if "://" in output:
        raise ConfigError(f"--output={output}: the results are written to a local folder; "
                          "give one and copy it to the bucket afterwards")
    folder = pathlib.Path(output)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"--output={output} is an existing file, not a folder; give a folder "
                          "(it is created if missing)")
    try:
        write_probe(folder)
    except OSError as err:
        raise WorkdirError(f"--output={output} cannot be written ({_reason(err)})") from None

    def refusal(holder: str) -> WorkdirError:
        return WorkdirError(f"--output={output} is in use by another evaluation ({holder}); "
                            "wait for it to finish, or give another --output")

    with folder_lock(folder, refusal):
        for name in RESULT_FILES:  # a killed writer's temporaries; nobody else writes here
            for stale in json_output.temporary_files(folder, name):
                stale.unlink(missing_ok=True)
        yield folder


def _reason(err: OSError) -> str:
    """An OS error as ``strerror: what to do`` (:data:`~contrastive_jax.errors.STORAGE_ERRNOS`
    for refusals of the system), else ``strerror``."""
    what = {errno.ENOTDIR: "a part of the path is a file, not a folder",
            errno.EEXIST: "a part of the path is a file, not a folder",
            errno.ENOENT: "no such folder"}.get(err.errno)
    what = STORAGE_ERRNOS.get(err.errno, what)
    text = err.strerror or type(err).__name__
    return f"{text}: {what}" if what else text


def write_results(output: str | os.PathLike, record: Mapping[str, Any]) -> None:
    """Write the three files of ``record`` into the folder ``output`` (see
    :func:`output_folder`), each through a temporary file of this writer's own and a rename
    (a reader never sees half a file). ``results.json`` is strict JSON (a non-finite metric is
    ``null``). A write the system refuses: :class:`~contrastive_jax.errors.WorkdirError`
    naming the file, nothing half-written left."""
    rows = [["task", "kind", "dataset", "metric", "value"]]
    for name, task in record["tasks"].items():
        kind, _, dataset = name.partition("/")
        for metric, value in task.get("metrics", {}).items():
            rows.append([name, kind, dataset, metric, repr(float(value))])
    table = io.StringIO(newline="")
    csv.writer(table).writerows(rows)
    for name, text in (("results.json", json_output.dumps(record, indent=1) + "\n"),
                       ("results.csv", table.getvalue()),
                       ("results.md", results_table(record))):
        _write(os.path.join(output, name), text)


def results_table(record: Mapping[str, Any]) -> str:
    """The Markdown table of ``record``: one row per task."""
    from contrastive_jax.training.run.provenance import provenance_line

    lines = [f"# Evaluation of {record['model']}", "",
             provenance_line(record.get("provenance")), "",
             "| task | split | main metric | value | examples | s | other metrics |",
             "| --- | --- | --- | ---: | ---: | ---: | --- |"]
    for name, task in record["tasks"].items():
        if task.get("status") != "ok":
            lines.append(f"| {name} | {task.get('split', '')} | failed | | | | "
                         f"{task.get('error', '')} |")
            continue
        metrics, main = task["metrics"], task["main_metric"]
        rest = ", ".join(f"{k} {_number(v)}" for k, v in metrics.items()
                         if k != main and PER_SEED not in k)
        lines.append(f"| {name} | {task.get('split', '')} | {main} | {_number(metrics[main])} | "
                     f"{task['examples']:,} | {task['seconds']:.1f} | {rest} |")
    return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    return f"{value:.4f}" if abs(value) < 10 else f"{value:.3g}"


def _write(path: str, text: str) -> None:
    """``text`` to ``path`` atomically (:func:`~contrastive_jax.training.run.workdir.
    json_output.write_text_atomic`: a temporary file of this writer's own, removed if the write
    fails; a Ctrl-C waits for the rename); a refused write is a
    :class:`~contrastive_jax.errors.WorkdirError` naming the file."""
    try:
        json_output.write_text_atomic(path, text)
    except OSError as err:
        raise WorkdirError(f"cannot write {path} ({_reason(err)})") from None
