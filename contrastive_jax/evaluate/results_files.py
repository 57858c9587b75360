"""The evaluation command's outputs: ``results.json``, ``results.csv`` and ``results.md`` in
the output directory, rewritten after every task (a task that fails loses no other's result).

``results.json``::

    {"model": description, "command": {flag: value}, "provenance": {...},
     "tasks": {"zeroshot/cifar10": {"status": "ok", "metrics": {"acc1": ...}, "main_metric":
               "acc1", "examples": n, "seconds": s, ...},
               "retrieval/x": {"status": "failed", "error": "what to change"}}}

``results.csv``: one row per (task, metric): ``task,kind,dataset,metric,value``.
``results.md``: the provenance line and one row per task: its main metric first, then the rest.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Mapping
from typing import Any

RESULT_FILES = ("results.json", "results.csv", "results.md")
PER_SEED = "_seed"  # few-shot per-seed scores: in the JSON and CSV, not in the table


def write_results(output: str | os.PathLike, record: Mapping[str, Any]) -> None:
    """Write the three files of ``record`` into ``output`` (created), each through a temporary
    file and a rename (a reader never sees half a file)."""
    os.makedirs(output, exist_ok=True)
    _write(os.path.join(output, "results.json"), json.dumps(record, indent=1) + "\n")
    rows = [["task", "kind", "dataset", "metric", "value"]]
    for name, task in record["tasks"].items():
        kind, _, dataset = name.partition("/")
        for metric, value in task.get("metrics", {}).items():
            rows.append([name, kind, dataset, metric, repr(float(value))])
    path = os.path.join(output, "results.csv")
    with open(path + ".tmp", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    os.replace(path + ".tmp", path)
    _write(os.path.join(output, "results.md"), results_table(record))


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
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
