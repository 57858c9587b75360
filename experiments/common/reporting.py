"""Experiment reports: every script under ``experiments/`` writes the same three files.

``report(out, rows, title, table, notes, figure)`` writes ``out.csv`` (one row per measurement,
the raw numbers), ``out.md`` (a markdown table for a reader) and ``out.png`` (a matplotlib
figure), creating the folder. :func:`load_config` loads ``configs/NAME.py[:variant]`` the way
``--config`` does, so an experiment runs exactly the config a user would launch.
"""

from __future__ import annotations

import csv
import importlib.util
import math
import pathlib
import statistics
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


def write_csv(path: pathlib.Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """``rows`` (dicts with the same keys, in order) to a CSV file with a header."""
    if not rows:
        raise ValueError(f"no rows to write to {path}")
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def report(out: str | pathlib.Path, rows: Sequence[Mapping[str, Any]], *, title: str,
           body: str, figure: matplotlib.figure.Figure | None) -> pathlib.Path:
    """Write ``out.csv`` (``rows``), ``out.md`` (``# title`` + ``body``) and ``out.png``.

    ``out`` is a path without suffix (``experiments/results/temperature``); the figure is
    closed after saving. Returns the markdown path. The markdown is also printed.
    """
    out = pathlib.Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_csv(out.with_suffix(".csv"), rows)
    text = f"# {title}\n\n{body.strip()}\n"
    if figure is not None:
        import matplotlib.pyplot as plt

        figure.savefig(out.with_suffix(".png"), dpi=120, bbox_inches="tight")
        plt.close(figure)
        text += f"\n![{title}]({out.with_suffix('.png').name})\n"
    out.with_suffix(".md").write_text(text)
    print(text)
    return out.with_suffix(".md")
