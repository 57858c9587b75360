"""Gradient-check table: every analytic formula vs jax.grad, float32 and float64.

    python experiments/gradcheck.py [--quick] [--out experiments/results/gradcheck]

Prints the table and writes ``gradcheck.md`` (the table), ``gradcheck.csv`` (one row per check)
and ``gradcheck.png`` (the errors as a log-scale bar chart) through
:func:`common.reporting.report`. Each row is the worst normwise relative error
``||formula - autodiff||_2 / ||autodiff||_2`` over the shapes and seeds listed in the header.
"""

from __future__ import annotations

import argparse
import pathlib
import platform
import sys
import time
from collections.abc import Sequence

import jax
import numpy as np

from common.reporting import RESULTS, report
from contrastive_jax.analytic import gradcheck

DEFAULT_OUT = RESULTS / "gradcheck"
FLOOR = 1e-30  # errors below this (exact zeros) are drawn at the floor of the log axis


def plot(rows: Sequence[dict]):
    """Horizontal log-scale bars: each check's float32 and float64 error, with the two machine
    epsilons and the tests' float64 bound 1e-10 as reference lines."""
    import matplotlib.pyplot as plt

    y = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(9, 0.28 * len(rows) + 1.5))
    for offset, key, color in ((-0.2, "float32", "C0"), (0.2, "float64", "C3")):
        ax.barh(y + offset, [max(r[key], FLOOR) for r in rows], height=0.4, color=color,
                label=key, log=True)
    for value, style, label in ((float(np.finfo(np.float32).eps), ":", "float32 eps"),
                                (1e-10, "--", "test bound (float64)"),
                                (float(np.finfo(np.float64).eps), "-.", "float64 eps")):
        ax.axvline(value, color="k", ls=style, lw=1, label=label)
    ax.set_yticks(y, [f"{r['source']}: {r['formula'][:44]}" for r in rows], fontsize=7)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # first check on top, no margins
    ax.set_xlim(left=FLOOR)
    ax.set_xlabel("max relative error vs jax.grad (log scale)")
    ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=5)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small shape, one seed")
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    shapes = ((3, 2),) if args.quick else gradcheck.DEFAULT_SHAPES
    seeds = (0,) if args.quick else (0, 1)
    start = time.time()

    def progress(i, total, row):
        print(f"[{i:2d}/{total}] {row['source']:<13} f32 {row['float32']:.1e} "
              f"f64 {row['float64']:.1e}  {time.time() - start:5.1f} s  {row['formula']}",
              flush=True)

    rows = gradcheck.run_gradcheck(shapes=shapes, seeds=seeds, progress=progress)
    worst = max(r["float64"] for r in rows)
    body = (
        "Every closed form of `000` Problems 1-10 and `002` A.12.6-A.12.8 (and the analytic\n"
        "backward passes of `clip_loss` / `nt_xent`) against `jax.grad` of the library loss.\n"
        "Error: worst `||formula - autodiff||_2 / ||autodiff||_2` over shapes (n, d) in\n"
        f"{list(shapes)} and seeds {list(seeds)}; for P7.2 the residual `|u.g| / (|u||g|)`.\n"
        f"jax {jax.__version__}, {platform.machine()}, {jax.devices()[0].platform}. "
        f"Worst float64 error: {worst:.1e}.\n\n"
    )
    out = args.out.with_suffix("") if args.out.suffix in (".md", ".csv", ".png") else args.out
    path = report(out, rows, title="Gradient check",
                  body=body + gradcheck.markdown_table(rows), figure=plot(rows))
    print(f"wrote {path} (and .csv, .png)")
    return 0 if worst < 1e-10 else 1


if __name__ == "__main__":
    sys.exit(main())
