"""Batch-size ablation of SimCLR on MNIST-1D: equal epochs and equal steps, sqrt-scaled rates.

    python experiments/batch_size_ablation.py [--config F] [--seeds 0 1 2] [--epochs 5]
        [--steps N] [--quick] [--out experiments/results/batch_size_ablation]

The main job (tau 0.2) at batch B = 32 ... 1024, at equal epochs ([SimCLR] Figure 9) and at
equal steps (default: batch 128's, whose run serves both), peak rate ``2e-3 sqrt(B / 128)``
([SimCLR] Appendix B.1). Per run: probe, kNN, and late-training means of the contrastive top-1
and of the bound ``log N - L``, N = 2B - 1 (docs/derivations.md §15.1), whose ceiling is
``log(2B - 1)`` (docs/derivations.md §15.3, limit 1). Writes ``OUT.csv`` (one row per run and
regime), ``OUT.md`` and ``OUT.png``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy.stats import rankdata

from common import reporting, sweep
from common.reporting import command, load_config, markdown_table, pm, report, summarise
from common.sweep import warmup_steps

CONFIG = "configs/simclr_mnist1d.py"
BATCHES = (32, 64, 128, 256, 512, 1024)
QUICK_BATCHES = (64, 128)
BASE_BATCH, BASE_LR = 128, 2e-3  # the main job's batch and peak learning rate
REGIMES = ("equal_epochs", "equal_steps")
METRICS = ("linear_probe", "knn", "contrastive_top1", "mi_bound")
TAIL_KEYS = ("top1", "loss", "mi_bound")
RUN_KEYS = ("regime", "batch", "steps", "epochs", "learning_rate", "warmup_steps",
            "log_n_ceiling")  # the columns that describe a run, not a measurement


def sqrt_scaled_lr(batch: int, base_lr: float = BASE_LR, base_batch: int = BASE_BATCH) -> float:
    """``base_lr * sqrt(batch / base_batch)`` ([SimCLR] Appendix B.1)."""
    return base_lr * math.sqrt(batch / base_batch)


def log_n_ceiling(batch: int) -> float:
    """``log(2B - 1)``, the largest possible ``log N - L`` at batch B: each of the 2B anchors
    has N = 2B - 1 candidates (self masked, docs/derivations.md §9.1) and ``L >= 0``."""
    return math.log(2 * batch - 1)


def steps_for_epochs(epochs: float, batch: int, train_size: int) -> int:
    """``ceil(epochs * train_size / batch)``, as ``train.total_steps`` computes for epochs."""
    return math.ceil(epochs * train_size / batch)


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run: batch, steps, peak rate, warmup, and the regimes it stands for."""

    batch: int
    steps: int
    learning_rate: float
    warmup: int
    regimes: tuple[str, ...]


def plan(batches: Sequence[int], epochs: float, steps: int | None, train_size: int) -> list[Run]:
    """The runs of both regimes (equal steps: ``steps``, or ``BASE_BATCH``'s equal-epochs
    steps); a (batch, steps) pair both regimes need is run once."""
    steps = steps or steps_for_epochs(epochs, BASE_BATCH, train_size)
    wanted: dict[tuple[int, int], list[str]] = {}
    for regime in REGIMES:
        for batch in batches:
            n = steps_for_epochs(epochs, batch, train_size) if regime == "equal_epochs" else steps
            wanted.setdefault((batch, n), []).append(regime)
    return [Run(batch, n, sqrt_scaled_lr(batch), warmup_steps(n), tuple(regimes))
            for (batch, n), regimes in wanted.items()]


def make_config(run: Run, seed: int, *, quick: bool = False, config_path: str = CONFIG):
    """The config (any with the variants ``seed``, ``batch``, ``quick``) at ``run``'s batch,
    steps, rate and warmup."""
    config = load_config(f"{config_path}:seed={seed},batch={run.batch}"
                         + (",quick" if quick else ""))
    config.data.batch_size = run.batch  # the quick variant sets its own batch
    config.total_steps = run.steps
    config.optimizer.learning_rate = run.learning_rate
    config.optimizer.warmup_steps = run.warmup
    config.log_every = sweep.LOG_EVERY
    return config


def row_from_result(result: Mapping[str, Any] | None) -> dict[str, Any]:
    """The measured columns of one run, late-training means (None or non-finite: diverged,
    probe and kNN NaN)."""
    keys = ("linear_probe", "knn", "contrastive_top1", "mi_bound", "loss", "train_s")
    if result is None:
        return {"status": "diverged", **dict.fromkeys(keys, math.nan)}
    m, ok = sweep.late_metrics(result)
    values = (result["linear_probe"] if ok else math.nan, result["knn"] if ok else math.nan,
              m["top1"], m["mi_bound"], m["loss"], result["train_time_s"])
    return {"status": "ok" if ok else "diverged", **dict(zip(keys, values, strict=True))}


def rank_correlation(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rho (ties get their mean rank); NaN for < 2 points or a constant sequence."""
    if len(xs) < 2 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return math.nan
    return float(np.corrcoef(rankdata(xs), rankdata(ys))[0, 1])


def results_table(summary: Sequence[Mapping[str, Any]]) -> str:
    """One row per (regime, batch), accuracies in % as mean ± std over seeds."""
    header = ["regime", "batch", "steps", "epochs", "peak lr", "warmup", "seeds (div.)",
              "linear probe %", "kNN %", "contrastive top-1 %", "log N - L (nats)",
              "ceiling log(2B-1)"]
    rows = [[s["regime"].replace("_", " "), s["batch"], s["steps"], f"{s['epochs']:.1f}",
             f"{s['learning_rate']:.2e}", s["warmup_steps"], f"{s['seeds']} ({s['diverged']})",
             pm(s, "linear_probe"), pm(s, "knn"), pm(s, "contrastive_top1"),
             pm(s, "mi_bound", 1, 2), f"{s['log_n_ceiling']:.3f}"] for s in summary]
    return markdown_table(header, rows)


def trends_table(summary: Sequence[Mapping[str, Any]]) -> str:
    """Per regime: Spearman's rho of the probe, kNN and bound against B ("–": undefined), and
    the largest fraction ``(log N - L) / log(2B - 1)`` of its ceiling the bound reaches."""
    rows = []
    for regime in REGIMES:
        points = [s for s in summary if s["regime"] == regime and math.isfinite(s["knn"])]
        rhos = [rank_correlation([s["batch"] for s in points], [s[key] for s in points])
                for key in ("linear_probe", "knn", "mi_bound")]
        top = max((s["mi_bound"] / s["log_n_ceiling"] for s in points), default=math.nan)
        rows.append([regime.replace("_", " "),
                     *(f"{rho:+.2f}" if math.isfinite(rho) else "–" for rho in rhos),
                     f"{top:.0%}"])
    return markdown_table(["regime", "Spearman rho: probe vs B", "kNN vs B", "log N - L vs B",
                           "max (log N - L) / log(2B-1)"], rows)


def figure(summary: Sequence[Mapping[str, Any]]):
    """Probe, kNN and the bound (with its ceiling) against the batch, per regime."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    keys = ("linear_probe", "knn", "mi_bound")
    titles = ("linear probe", "kNN (k=20)", "InfoNCE bound log N - L (late training)")
    batches = sorted({s["batch"] for s in summary})
    for regime, color in zip(REGIMES, ("C0", "C1"), strict=True):
        points = sorted((s for s in summary if s["regime"] == regime), key=lambda s: s["batch"])
        for ax, key in zip(axes, keys, strict=True):
            ax.errorbar([s["batch"] for s in points], [s[key] for s in points],
                        yerr=[s[key + "_std"] for s in points], color=color, marker="o",
                        capsize=3, label=regime.replace("_", " "))
    axes[2].plot(batches, [log_n_ceiling(b) for b in batches], "k--", label="ceiling log(2B - 1)")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.set(xlabel="global batch B (lr = 2e-3 sqrt(B/128))", title=title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("accuracy (mean ± std over seeds)")
    axes[2].set_ylabel("nats")
    fig.suptitle("SimCLR on MNIST-1D: batch size at equal epochs and at equal steps")
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = reporting.parser(__doc__, "batch_size_ablation", config=CONFIG, seeds=(0, 1, 2),
                              quick="the config's quick variant, batches 64 and 128, one seed")
    parser.add_argument("--epochs", type=float, default=5.0,
                        help="equal-epochs regime: passes over the data (the main job: 20)")
    parser.add_argument("--steps", type=int, default=None,
                        help="equal-steps regime (default: batch 128's equal-epochs steps)")
    parser.add_argument("--verbose", action="store_true", help="show the trainer's own lines")
    args = parser.parse_args(argv)
    seeds = args.seeds[:1] if args.quick else args.seeds
    epochs = 0.1 if args.quick else args.epochs
    size = sweep.train_size(load_config(args.config))
    runs = plan(QUICK_BATCHES if args.quick else BATCHES, epochs, args.steps, size)
    rows = []
    for run in runs:
        for seed in seeds:
            config = make_config(run, seed, quick=args.quick, config_path=args.config)
            measured = row_from_result(sweep.run_one(config, keys=TAIL_KEYS,
                                                     verbose=args.verbose))
            print(f"B={run.batch}, {run.steps} steps, seed {seed}: {measured['status']}, probe "
                  f"{measured['linear_probe']:.4f}", flush=True)
            rows += [{"regime": regime, "batch": run.batch, "seed": seed, "steps": run.steps,
                      "epochs": run.steps * run.batch / size, "learning_rate": run.learning_rate,
                      "warmup_steps": run.warmup, "log_n_ceiling": log_n_ceiling(run.batch),
                      "shared_run": len(run.regimes) > 1, **measured} for regime in run.regimes]
    rows.sort(key=lambda r: (REGIMES.index(r["regime"]), r["batch"], r["seed"]))
    summary = summarise(rows, RUN_KEYS, METRICS)
    produced = (
        f"{command(__file__, argv)}: `{args.config}`" + (", quick variant" if args.quick else "")
        + f", seeds {', '.join(map(str, seeds))}, {len(runs) * len(seeds)} training runs; "
        f"equal epochs: {epochs:g} epochs of {size} examples; equal steps: "
        f"{rows[-1]['steps']} steps; mean ± std over seeds; top-1 and log N - L: late-training "
        f"means ({sweep.TAIL_FRACTION:.0%} of the steps, logged every {sweep.LOG_EVERY}).")
    report(args.out, rows, title="Batch size (SimCLR, MNIST-1D)", produced=produced,
           tables=[results_table(summary), trends_table(summary)], figure=figure(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
