"""Gradient-check table: every analytic formula vs jax.grad, float32 and float64.

    python experiments/gradcheck.py [--quick] [--out experiments/results/gradcheck]

Runs :func:`contrastive_jax.analytic.gradcheck.run_gradcheck` (each closed form of
docs/derivations.md, named by its section, against ``jax.grad``) and writes ``gradcheck.md``
(the table), ``gradcheck.csv`` (one row per check) and ``gradcheck.png`` (the errors as a
log-scale bar chart) through :func:`common.reporting.report`. Each row is the worst normwise
relative error ``||formula - autodiff||_2 / ||autodiff||_2`` over the shapes and seeds given in
the ``.md``. Exits 1 if a float64 error reaches 1e-10.
"""

from __future__ import annotations

import pathlib
import platform
import sys
import time
from collections.abc import Sequence

import jax
import numpy as np

from common import reporting
from common.reporting import command, report
from contrastive_jax.analytic import gradcheck

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
    parser = reporting.parser(__doc__, "gradcheck", quick="one small shape, one seed")
    args = parser.parse_args(argv)
    shapes = ((3, 2),) if args.quick else gradcheck.DEFAULT_SHAPES
    seeds = (0,) if args.quick else (0, 1)
    start = time.time()

    def progress(i, total, row):
        print(f"[{i:2d}/{total}] {row['source']:<20} f32 {row['float32']:.1e} "
              f"f64 {row['float64']:.1e}  {time.time() - start:5.1f} s  {row['formula']}",
              flush=True)

    rows = gradcheck.run_gradcheck(shapes=shapes, seeds=seeds, progress=progress)
    produced = (
        f"{command(__file__, argv)}: each closed form of docs/derivations.md (section in the "
        "source column) and each hand-written backward pass against `jax.grad` of the library "
        "loss; error: the worst `||formula - autodiff||_2 / ||autodiff||_2` (for §12.1's "
        f"identity the residual `|u.g| / (|u||g|)`) over shapes (n, d) in {list(shapes)} and "
        f"seeds {list(seeds)}; jax {jax.__version__}, {platform.machine()}, "
        f"{jax.devices()[0].platform}.")
    out = pathlib.Path(args.out)
    out = out.with_suffix("") if out.suffix in (".md", ".csv", ".png") else out
    report(out, rows, title="Gradient check", produced=produced,
           tables=[gradcheck.markdown_table(rows)], figure=plot(rows))
    return 0 if max(r["float64"] for r in rows) < 1e-10 else 1


if __name__ == "__main__":
    sys.exit(main())
