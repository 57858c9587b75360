"""Batch-size ablation of SimCLR on MNIST-1D: equal epochs and equal steps, sqrt-scaled rates.

    python experiments/batch_size_ablation.py [--config F] [--seeds 0 1 2] [--epochs 5]
        [--steps N] [--batches 32 ... 2048] [--memory-budget-mb 128] [--quick]
        [--out experiments/results/batch_size_ablation]

The main job (tau 0.2) at batch B = 32 ... 2048 (half of MNIST-1D's 4000 training signals),
at equal epochs ([SimCLR] Figure 9) and at equal steps (default: batch 128's, whose run serves
both), peak rate ``2e-3 sqrt(B / 128)`` ([SimCLR] Appendix B.1). Per run: probe, kNN, and
late-training means of the contrastive top-1 and of the bound ``log N - L``, N = 2B - 1
(docs/derivations.md §15.1), whose ceiling is ``log(2B - 1)`` (docs/derivations.md §15.3,
limit 1).

Batches past a device's memory: every batch runs with the fewest micro-batches ``K``
(``config.accumulation_steps``, exact gradient accumulation, docs/derivations.md §14.7) whose
compiled step keeps XLA's temporaries within ``--memory-budget-mb``, a notional device (128 MiB:
K = 1 reaches B = 512, B = 1024 and 2048 need K = 2 and 4). One point runs both ways (B = 512
at equal steps, K = 1 and K = 4) to show accumulation leaves the curve where it was: the
gradient is exact except for the encoder's BatchNorm, whose statistics are per micro-batch
(ghost BatchNorm, B/K examples). Writes ``OUT.csv`` (one row per run and regime), ``OUT.md``
and ``OUT.png``.
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
BATCHES = (32, 64, 128, 256, 512, 1024, 2048)
QUICK_BATCHES = (64, 128)
BUDGET_MB = 128.0  # a notional device's memory for one step's temporaries
CHECK = (512, 4)  # (batch, K): the equal-steps point also run with K micro-batches
QUICK_CHECK = (128, 2)
BASE_BATCH, BASE_LR = 128, 2e-3  # the main job's batch and peak learning rate
REGIMES = ("equal_epochs", "equal_steps")
METRICS = ("linear_probe", "knn", "contrastive_top1", "mi_bound")
TAIL_KEYS = ("top1", "loss", "mi_bound")
# the columns that describe a run, not a measurement
RUN_KEYS = ("regime", "batch", "accumulation_steps", "cross_check", "steps", "epochs",
            "learning_rate", "warmup_steps", "log_n_ceiling")


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
    """One training run: batch, steps, peak rate, warmup, the regimes it stands for, its
    micro-batches ``K``, and whether it is the cross-check (a second ``K`` at the same point)."""

    batch: int
    steps: int
    learning_rate: float
    warmup: int
    regimes: tuple[str, ...]
    accumulation_steps: int = 1
    cross_check: bool = False


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


def with_accumulation(runs: Sequence[Run], micro_batches: Mapping[int, int],
                      check: tuple[int, int] | None) -> list[Run]:
    """``runs`` with ``accumulation_steps = micro_batches[batch]``, plus the cross-check: the
    equal-steps run at ``check = (batch, K)`` again with ``K`` micro-batches (equal steps only;
    None: no cross-check)."""
    runs = [dataclasses.replace(run, accumulation_steps=micro_batches[run.batch]) for run in runs]
    if check is not None:
        batch, k = check
        base = [run for run in runs if run.batch == batch and "equal_steps" in run.regimes]
        if not base or base[0].accumulation_steps == k:
            raise ValueError(f"cross-check {check}: no equal-steps run at batch {batch} with "
                             f"another K (planned batches: {sorted(micro_batches)})")
        runs.append(dataclasses.replace(base[0], regimes=("equal_steps",), accumulation_steps=k,
                                        cross_check=True))
    return runs


def make_config(run: Run, seed: int, *, quick: bool = False, config_path: str = CONFIG):
    """The config (any with the variants ``seed``, ``batch``, ``quick``) at ``run``'s batch,
    steps, rate and warmup."""
    config = load_config(f"{config_path}:seed={seed},batch={run.batch}"
                         + (",quick" if quick else ""))
    config.data.batch_size = run.batch  # the quick variant sets its own batch
    config.total_steps = run.steps
    config.optimizer.learning_rate = run.learning_rate
    config.optimizer.warmup_steps = run.warmup
    config.accumulation_steps = run.accumulation_steps
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
    """One row per (regime, batch, K), accuracies in % as mean ± std over seeds; the
    cross-check's row is marked."""
    header = ["regime", "batch", "K", "steps", "epochs", "peak lr", "warmup", "seeds (div.)",
              "linear probe %", "kNN %", "contrastive top-1 %", "log N - L (nats)",
              "ceiling log(2B-1)"]
    rows = [[s["regime"].replace("_", " ") + (" (cross-check)" if s["cross_check"] else ""),
             s["batch"], s["accumulation_steps"], s["steps"], f"{s['epochs']:.1f}",
             f"{s['learning_rate']:.2e}", s["warmup_steps"], f"{s['seeds']} ({s['diverged']})",
             pm(s, "linear_probe"), pm(s, "knn"), pm(s, "contrastive_top1"),
             pm(s, "mi_bound", 1, 2), f"{s['log_n_ceiling']:.3f}"] for s in summary]
    return markdown_table(header, rows)


def memory_table(trials: Mapping[int, Mapping[int, float]], budget_mb: float) -> str:
    """Per batch: the compiled step's temporaries (MiB) for each ``K`` tried, smallest first,
    and the ``K`` chosen (the first within ``budget_mb``)."""
    rows = [[batch, ", ".join(f"K={k}: {mb:.0f}" for k, mb in tried.items()),
             next(k for k, mb in tried.items() if mb <= budget_mb)]
            for batch, tried in sorted(trials.items())]
    return ("## Micro-batches: compiled step temporaries against the budget\n"
            + markdown_table(["batch", f"step temporaries, MiB (budget {budget_mb:g})",
                              "K run"], rows))


def cross_check_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The cross-check: per metric, mean ± std over seeds with each ``K`` at the same batch and
    steps, and the largest per-seed difference (same seed: same data, keys and initialisation;
    what differs is BatchNorm's statistics, over B/K examples per micro-batch as in ghost
    BatchNorm (docs/training.md, "Gradient accumulation"), and float32 rounding)."""
    check = [r for r in rows if r["cross_check"]]
    if not check:
        return ""
    batch, k = check[0]["batch"], check[0]["accumulation_steps"]
    base = {r["seed"]: r for r in rows if r["regime"] == "equal_steps" and r["batch"] == batch
            and not r["cross_check"]}
    k1 = next(iter(base.values()))["accumulation_steps"]
    out = []
    for key, scale, digits in (("linear_probe", 100, 1), ("knn", 100, 1),
                               ("contrastive_top1", 100, 2), ("mi_bound", 1, 3),
                               ("loss", 1, 4)):
        cells = []
        for group in ([base[r["seed"]] for r in check], check):
            mean, std = reporting.mean_std(r[key] for r in group)
            cells.append(f"{scale * mean:.{digits}f} ± {scale * std:.{digits}f}")
        diff = max(abs(r[key] - base[r["seed"]][key]) for r in check)
        out.append([key, *cells, f"{scale * diff:.{digits + 1}f}"])
    return (f"## Cross-check: batch {batch} at equal steps with K = {k1} and K = {k}\n"
            + markdown_table(["metric (x100 for accuracies)", f"B={batch}, K={k1}",
                              f"B={batch}, K={k}", "max per-seed difference"], out))
def trends_table(summary: Sequence[Mapping[str, Any]]) -> str:
    """Per regime: Spearman's rho of the probe, kNN and bound against B ("–": undefined), and
    the largest fraction ``(log N - L) / log(2B - 1)`` of its ceiling the bound reaches."""
    rows = []
    for regime in REGIMES:
        points = [s for s in summary if s["regime"] == regime and math.isfinite(s["knn"])
                  and not s.get("cross_check")]
        rhos = [rank_correlation([s["batch"] for s in points], [s[key] for s in points])
                for key in ("linear_probe", "knn", "mi_bound")]
        top = max((s["mi_bound"] / s["log_n_ceiling"] for s in points), default=math.nan)
        rows.append([regime.replace("_", " "),
                     *(f"{rho:+.2f}" if math.isfinite(rho) else "–" for rho in rhos),
                     f"{top:.0%}"])
    return markdown_table(["regime", "Spearman rho: probe vs B", "kNN vs B", "log N - L vs B",
                           "max (log N - L) / log(2B-1)"], rows)


def figure(summary: Sequence[Mapping[str, Any]]):
    """Probe, kNN and the bound (with its ceiling) against the batch, per regime; batches run
    with K > 1 micro-batches hollow, the cross-check a star."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    keys = ("linear_probe", "knn", "mi_bound")
    titles = ("linear probe", "kNN (k=20)", "InfoNCE bound log N - L (late training)")
    batches = sorted({s["batch"] for s in summary})
    for regime, color in zip(REGIMES, ("C0", "C1"), strict=True):
        points = sorted((s for s in summary if s["regime"] == regime and not s["cross_check"]),
                        key=lambda s: s["batch"])
        accumulated = [s for s in points if s["accumulation_steps"] > 1]
        checks = [s for s in summary if s["regime"] == regime and s["cross_check"]]
        for ax, key in zip(axes, keys, strict=True):
            ax.errorbar([s["batch"] for s in points], [s[key] for s in points],
                        yerr=[s[key + "_std"] for s in points], color=color, marker="o",
                        capsize=3, label=regime.replace("_", " "))
            ax.plot([s["batch"] for s in accumulated], [s[key] for s in accumulated], "o",
                    color="white", markeredgecolor=color, markersize=5, zorder=4)
            for s in checks:
                ax.plot([s["batch"]], [s[key]], "*", color="C3", markersize=11, zorder=5,
                        label=f"B={s['batch']}, K={s['accumulation_steps']}")
    axes[2].plot(batches, [log_n_ceiling(b) for b in batches], "k--", label="ceiling log(2B - 1)")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.set(xlabel="global batch B (lr = 2e-3 sqrt(B/128); hollow: K > 1 micro-batches)",
               title=title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("accuracy (mean ± std over seeds)")
    axes[2].set_ylabel("nats")
    fig.suptitle("SimCLR on MNIST-1D: batch size at equal epochs and at equal steps")
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = reporting.parser(__doc__, "batch_size_ablation", config=CONFIG, seeds=(0, 1, 2),
                              quick="the config's quick variant, batches 64 and 128, one seed, "
                                    f"cross-check {QUICK_CHECK}")
    parser.add_argument("--epochs", type=float, default=5.0,
                        help="equal-epochs regime: passes over the data (the main job: 20)")
    parser.add_argument("--steps", type=int, default=None,
                        help="equal-steps regime (default: batch 128's equal-epochs steps)")
    parser.add_argument("--batches", type=int, nargs="+", default=None,
                        help=f"global batches (default {' '.join(map(str, BATCHES))})")
    parser.add_argument("--memory-budget-mb", type=float, default=BUDGET_MB,
                        help="a notional device's memory for one step's temporaries: each batch "
                             "runs with the fewest micro-batches K that fit it")
    parser.add_argument("--no-cross-check", action="store_true",
                        help=f"skip the second run of {CHECK} (batch, K)")
    parser.add_argument("--verbose", action="store_true", help="show the trainer's own lines")
    args = parser.parse_args(argv)
    seeds = args.seeds[:1] if args.quick else args.seeds
    epochs = 0.1 if args.quick else args.epochs
    size = sweep.train_size(load_config(args.config))
    batches = args.batches or (QUICK_BATCHES if args.quick else BATCHES)
    runs = plan(batches, epochs, args.steps, size)
    trials = {}
    for batch in batches:  # the memory plan: compiled, not run
        probe_run = next(run for run in runs if run.batch == batch)
        config = make_config(probe_run, seeds[0], quick=args.quick, config_path=args.config)
        trials[batch] = sweep.micro_batch_trials(config, args.memory_budget_mb)
        print(f"B={batch}: step temporaries " + ", ".join(
            f"K={k} {mb:.0f} MiB" for k, mb in trials[batch].items()), flush=True)
    check = None if args.no_cross_check else QUICK_CHECK if args.quick else CHECK
    runs = with_accumulation(runs, {b: list(t)[-1] for b, t in trials.items()}, check)
    rows = []
    for run in runs:
        for seed in seeds:
            config = make_config(run, seed, quick=args.quick, config_path=args.config)
            measured = row_from_result(sweep.run_one(config, keys=TAIL_KEYS,
                                                     verbose=args.verbose))
            print(f"B={run.batch}, K={run.accumulation_steps}, {run.steps} steps, seed {seed}: "
                  f"{measured['status']}, probe {measured['linear_probe']:.4f}", flush=True)
            rows += [{"regime": regime, "batch": run.batch,
                      "accumulation_steps": run.accumulation_steps,
                      "cross_check": run.cross_check, "seed": seed, "steps": run.steps,
                      "epochs": run.steps * run.batch / size, "learning_rate": run.learning_rate,
                      "warmup_steps": run.warmup, "log_n_ceiling": log_n_ceiling(run.batch),
                      "shared_run": len(run.regimes) > 1, **measured} for regime in run.regimes]
    rows.sort(key=lambda r: (REGIMES.index(r["regime"]), r["batch"], r["cross_check"],
                             r["seed"]))
    summary = summarise(rows, RUN_KEYS, METRICS)
    produced = (
        f"{command(__file__, argv)}: `{args.config}`" + (", quick variant" if args.quick else "")
        + f", seeds {', '.join(map(str, seeds))}, {len(runs) * len(seeds)} training runs; "
        f"equal epochs: {epochs:g} epochs of {size} examples; equal steps: "
        f"{rows[-1]['steps']} steps; K: the fewest micro-batches whose compiled step keeps its "
        f"temporaries within {args.memory_budget_mb:g} MiB (BatchNorm per micro-batch); mean ± std "
        f"over seeds; top-1 and log N - L: late-training means ({sweep.TAIL_FRACTION:.0%} of "
        f"the steps, logged every {sweep.LOG_EVERY}).")
    tables = [results_table(summary), trends_table(summary),
              memory_table(trials, args.memory_budget_mb), cross_check_table(rows)]
    report(args.out, rows, title="Batch size (SimCLR, MNIST-1D)", produced=produced,
           tables=[t for t in tables if t], figure=figure(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
