"""Experiment reports: every script under ``experiments/`` writes the same three files.

``report(out, rows, title=, produced=, tables=, figure=)`` writes ``out.csv`` (one row per
measurement, the raw numbers), ``out.md`` (the measurements only: a title, the provenance line,
one line saying how they were produced, the tables) and ``out.png`` (a matplotlib figure). What
the numbers mean is written by hand in ``experiments/README.md``. :func:`load_config` loads
``configs/NAME.py[:variant]`` the way ``--config`` does, so an experiment runs exactly the config
a user would launch.

Provenance (:func:`contrastive_jax.training.run.provenance.provenance`: date, commit, versions,
devices): the ``.md`` has it as one line under the title (``Provenance: ...``), a ``.csv`` as its
first line, ``# provenance: {JSON}``, before the header; :func:`read_csv` reads the rows past it
and :func:`csv_provenance` the record.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import math
import pathlib
import re
import shlex
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import matplotlib.figure

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the repository
RESULTS = ROOT / "experiments" / "results"


def load_config(spec: str):
    """``configs/NAME.py[:variant]`` (relative to the repository or absolute) -> ConfigDict."""
    path, _, arg = spec.partition(":")
    file = pathlib.Path(path)
    if not file.is_absolute() and not file.exists():
        file = ROOT / path
    if not file.exists():
        raise FileNotFoundError(f"no config file {path!r} (looked in . and {ROOT})")
    module_spec = importlib.util.spec_from_file_location(f"config_{file.stem}", file)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(arg or None)


def parser(doc: str, name: str, quick: str, config: str | None = None,
           seeds: Sequence[int] | None = None) -> argparse.ArgumentParser:
    """The arguments the scripts share: ``--quick`` (a tiny run for the tests; help ``quick``),
    ``--out`` (default ``experiments/results/NAME``) and, given their defaults, ``--config``
    and ``--seeds``. ``doc``: the script's docstring."""
    arguments = argparse.ArgumentParser(description=doc.splitlines()[0])
    arguments.add_argument("--quick", action="store_true", help=quick)
    arguments.add_argument("--out", default=str(RESULTS / name),
                           help="output path without suffix (writes .csv, .md, .png)")
    if config is not None:
        arguments.add_argument("--config", default=config, help="the config file[:variant]")
    if seeds is not None:
        arguments.add_argument("--seeds", type=int, nargs="+", default=list(seeds))
    return arguments


def command(script: str, argv: Sequence[str] | None) -> str:
    """The command line that ran ``script`` (a path) with ``argv`` (None: ``sys.argv[1:]``),
    as inline code: ``python experiments/NAME.py ARGS``."""
    args = sys.argv[1:] if argv is None else list(argv)
    return f"`{shlex.join(['python', f'experiments/{pathlib.Path(script).name}', *args])}`"


def mean_std(values: Iterable[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value); NaNs are kept (they show)."""
    values = [float(v) for v in values]
    if not values:
        return math.nan, math.nan
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def late_mean(rows: Sequence[Mapping[str, Any]], key: str, fraction: float = 0.1) -> float:
    """Mean of ``key`` over the last ``fraction`` of the recorded rows (at least one)."""
    tail = rows[-max(1, round(fraction * len(rows))):]
    return statistics.fmean(float(r[key]) for r in tail)


def summarise(rows: Sequence[Mapping[str, Any]], keys: Sequence[str],
              metrics: Sequence[str]) -> list[dict[str, Any]]:
    """One entry per group of ``rows`` with equal ``keys`` (in first-seen order): those keys,
    ``seeds`` (rows) and ``diverged`` (rows whose ``status`` is not "ok"), and for each metric
    ``m`` its mean and std over the rows that did not diverge, as ``m`` and ``m_std``."""
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in keys), []).append(row)
    summary = []
    for values, group in groups.items():
        ok = [r for r in group if r["status"] == "ok"]
        entry = {**dict(zip(keys, values, strict=True)), "seeds": len(group),
                 "diverged": len(group) - len(ok)}
        for m in metrics:
            entry[m], entry[m + "_std"] = mean_std(r[m] for r in ok)
        summary.append(entry)
    return summary


def pm(entry: Mapping[str, Any], key: str, scale: float = 100.0, digits: int = 1) -> str:
    """``entry[key] ± entry[key + "_std"]`` times ``scale`` as a table cell ("diverged": NaN)."""
    if not math.isfinite(entry[key]):
        return "diverged"
    return f"{scale * entry[key]:.{digits}f} ± {scale * entry[key + '_std']:.{digits}f}"


def accuracies(final: Mapping[str, Any]) -> dict[str, float]:
    """The linear probe and kNN accuracy of an evaluation, those present (none if skipped)."""
    return {k: final[k] for k in ("linear_probe", "knn") if k in final}


def accuracy_cells(final: Mapping[str, Any]) -> tuple[str, str]:
    """Linear probe and kNN as table cells ("–" when not evaluated)."""
    return tuple(f"{final[k]:.4f}" if k in final else "–" for k in ("linear_probe", "knn"))


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A markdown table; floats are printed as given (format them first)."""
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


CSV_PROVENANCE = "# provenance: "  # a CSV file's first line: this, then the record as JSON


def provenance() -> dict[str, Any]:
    """:func:`contrastive_jax.training.run.provenance.provenance` (imported when called: a
    script that sets up JAX's devices first imports this module before JAX)."""
    from contrastive_jax.training.run import provenance as library

    return library.provenance()


def provenance_line(record: Mapping[str, Any] | None = None) -> str:
    """``record`` (default: :func:`provenance` now) as the ``Provenance: ...`` line of a table
    (:func:`contrastive_jax.training.run.provenance.provenance_line`)."""
    from contrastive_jax.training.run import provenance as library

    return library.provenance_line(None if record is None else dict(record))


def write_csv(path: pathlib.Path, rows: Sequence[Mapping[str, Any]],
              record: Mapping[str, Any] | None = None) -> None:
    """``rows`` (dicts with the same keys, in order) to a CSV file: the line ``# provenance:
    {JSON}`` (``record``, default :func:`provenance` now), the header, the rows."""
    if not rows:
        raise ValueError(f"no rows to write to {path}")
    record = provenance() if record is None else record
    with open(path, "w", newline="") as handle:
        handle.write(CSV_PROVENANCE + json.dumps(record) + "\n")
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path: str | pathlib.Path) -> list[dict[str, str]]:
    """The rows of a CSV file :func:`write_csv` wrote (its provenance line skipped), as
    ``{header: cell}``."""
    with open(path, newline="") as handle:
        lines = handle.readlines()
    return list(csv.DictReader(lines[1:] if lines[:1] and lines[0].startswith(CSV_PROVENANCE)
                               else lines))


def csv_provenance(path: str | pathlib.Path) -> dict[str, Any]:
    """The provenance record of a CSV file :func:`write_csv` wrote; ValueError if it has none."""
    with open(path) as handle:
        first = handle.readline()
    if not first.startswith(CSV_PROVENANCE):
        raise ValueError(f"{path}: no '{CSV_PROVENANCE.strip()}' first line")
    return json.loads(first[len(CSV_PROVENANCE):])


def report(out: str | pathlib.Path, rows: Sequence[Mapping[str, Any]], *, title: str,
           produced: str, tables: Sequence[str],
           figure: matplotlib.figure.Figure | None) -> pathlib.Path:
    """Write ``out.csv`` (``rows``), ``out.md`` and ``out.png`` (``figure``, then closed).

    ``out`` is a path without suffix (``experiments/results/temperature``). The markdown is
    ``# title``, the provenance line (:func:`provenance_line`; the same record heads the CSV),
    the line ``produced`` (how: command, config, seeds, step counts), the ``tables`` (markdown,
    each may start with a ``## heading``) and a link to the figure; it is also printed.
    Returns its path.
    """
    out = pathlib.Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = provenance()
    write_csv(out.with_suffix(".csv"), rows, record)
    parts = [f"# {title}", provenance_line(record), produced.strip(),
             *(t.strip() for t in tables)]
    if figure is not None:
        import matplotlib.pyplot as plt

        figure.savefig(out.with_suffix(".png"), dpi=120, bbox_inches="tight")
        plt.close(figure)
        parts.append(f"![{title}]({out.with_suffix('.png').name})")
    text = "\n\n".join(parts) + "\n"
    out.with_suffix(".md").write_text(text)
    print(text)
    return out.with_suffix(".md")


def read_report(path: str | pathlib.Path) -> tuple[str, str, list[list[dict[str, str]]]]:
    """``(title, produced, tables)`` of a markdown file :func:`report` wrote, each table a
    list of ``{header: cell}`` rows. Raises ValueError on anything else (no provenance line, a
    paragraph of prose, a second line of text), so a test can hold a report to measurements
    with their provenance."""
    blocks = pathlib.Path(path).read_text().strip().split("\n\n")
    if (len(blocks) < 3 or not blocks[0].startswith("# ")
            or not blocks[1].startswith("Provenance: ") or "\n" in "".join(blocks[:3])):
        raise ValueError(f"{path}: expected '# title', the 'Provenance: ' line and one line of "
                         "how, each after a blank line")
    tables = []
    for block in blocks[3:]:
        lines = block.splitlines()
        if lines[0].startswith("## "):  # a table's heading
            lines = lines[1:]
        if len(lines) == 1 and lines[0].startswith("!["):  # the figure
            continue
        if len(lines) < 2 or not all(line.startswith("|") for line in lines):
            raise ValueError(f"{path}: not a table or the figure:\n{block}")
        cells = [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in lines]
        tables.append([dict(zip(cells[0], row, strict=True)) for row in cells[2:]])
    return blocks[0][2:], blocks[2], tables
