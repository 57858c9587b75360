"""Batch-size ablation of SimCLR on MNIST-1D: equal epochs and equal steps, sqrt-scaled rates.

    python experiments/batch_size_ablation.py [--config F] [--seeds 0 1 2] [--epochs 5]
        [--steps N] [--quick] [--out experiments/results/batch_size_ablation]

The main job (``configs/simclr_mnist1d.py``, tau 0.2, L2-normalised NT-Xent) at global batch B
in {32, 64, 128, 256, 512, 1024}, trained two ways:

- **equal epochs**: ``--epochs`` passes over the 4000 training signals, ``ceil(E 4000 / B)``
  steps (larger batches take fewer steps; SimCLR's Figure 9 comparison);
- **equal steps**: ``--steps`` steps at every batch (default: the steps batch 128 takes in the
  equal-epochs runs, so that run is shared by both regimes; larger batches see more data).

The peak learning rate follows the square-root rule from the main job's AdamW rate 2e-3 at
batch 128, ``lr = 2e-3 sqrt(B / 128)`` (SimCLR Appendix B.1 found square-root scaling better
than linear for small batches and short training). The linear warmup is 5% of each run's steps
(the main job's 31 of 625), so every run has the same warmup + cosine shape over its own
training. Each run reports the linear probe and kNN of the frozen encoder and, averaged over the
training batches logged every ``LOG_EVERY`` steps in the last ``TAIL_FRACTION`` of training, the
contrastive top-1 and the InfoNCE bound ``log N - L`` with ``N = 2B - 1`` candidates per anchor
(002 A.12.5, eq. A.12.10) next to its ceiling ``log(2B - 1)``: since ``L >= 0`` the bound can
never exceed ``log N`` (002 A.12.5, remark 1), however much information the views share.

Writes ``OUT.csv`` (one row per run and regime), ``OUT.md`` and ``OUT.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

from common import sweep
from common.reporting import RESULTS, load_config, markdown_table, mean_std, report

CONFIG = "configs/simclr_mnist1d.py"
BATCHES = (32, 64, 128, 256, 512, 1024)
QUICK_BATCHES = (64, 128)
BASE_BATCH = 128  # the main job's batch and learning rate
BASE_LR = 2e-3
WARMUP_FRACTION = 31 / 625  # the main job: 31 warmup steps of 625
REGIMES = ("equal_epochs", "equal_steps")
METRICS = ("linear_probe", "knn", "contrastive_top1", "mi_bound")
LOG_EVERY = 5  # training metrics logged (to the workdir; the console lines are swallowed)
TAIL_FRACTION = 0.2  # training metrics are averaged over the last 20% of the steps
TAIL_KEYS = ("top1", "loss", "mi_bound")


def sqrt_scaled_lr(batch: int, base_lr: float = BASE_LR, base_batch: int = BASE_BATCH) -> float:
    """Square-root learning-rate scaling: ``base_lr * sqrt(batch / base_batch)``.

    (SimCLR, Chen et al. 2020, Appendix B.1: square-root scaling for small batches and short
    training; the linear rule of Goyal et al. would give ``base_lr * batch / base_batch``.)
    """
    return base_lr * math.sqrt(batch / base_batch)


def log_n_ceiling(batch: int) -> float:
    """``log(2B - 1)``: the largest value of the NT-Xent bound ``log N - L`` at batch B.

    Each of the 2B anchors has N = 2B - 1 candidates (its partner and 2B - 2 negatives; the
    self-similarity is masked, 004), and ``L >= 0`` (002 A.12.5, eq. A.12.10 and remark 1).
    """
    return math.log(2 * batch - 1)


def steps_for_epochs(epochs: float, batch: int, train_size: int) -> int:
    """``ceil(epochs * train_size / batch)``, as ``train.total_steps`` computes for epochs."""
    return math.ceil(epochs * train_size / batch)


def warmup_steps(total_steps: int, fraction: float = WARMUP_FRACTION) -> int:
    """Linear-warmup steps: ``round(fraction * total_steps)``, at least 1 and below the total."""
    return min(max(1, round(fraction * total_steps)), total_steps - 1)


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run: batch, steps, peak rate, warmup, and the regimes it stands for."""

    batch: int
    steps: int
    learning_rate: float
    warmup: int
    regimes: tuple[str, ...]


def plan(batches: Sequence[int], epochs: float, steps: int | None, train_size: int) -> list[Run]:
    """The runs of both regimes; a (batch, steps) pair that both regimes need is run once.

    Equal epochs: ``steps_for_epochs(epochs, B, train_size)`` steps. Equal steps: ``steps``, or
    if None the equal-epochs steps of ``BASE_BATCH`` (then that batch's run is shared).
    """
    if steps is None:
        steps = steps_for_epochs(epochs, BASE_BATCH, train_size)
    wanted: dict[tuple[int, int], list[str]] = {}
    for regime in REGIMES:
        for batch in batches:
            n = steps_for_epochs(epochs, batch, train_size) if regime == "equal_epochs" else steps
            wanted.setdefault((batch, n), []).append(regime)
    return [Run(batch, n, sqrt_scaled_lr(batch), warmup_steps(n), tuple(regimes))
            for (batch, n), regimes in wanted.items()]


def make_config(run: Run, seed: int, *, quick: bool = False, config_path: str = CONFIG):
    """The main job's config (or its quick variant) at ``run``'s batch, steps, rate and warmup.

    ``config_path``: any config with the variants ``seed``, ``batch`` and ``quick`` (a bigger
    config runs the same ablation at pod scale; the rates scale from this script's base).
    """
    config = load_config(f"{config_path}:seed={seed},batch={run.batch}"
                         + (",quick" if quick else ""))
    config.data.batch_size = run.batch  # the quick variant sets its own batch
    config.total_steps = run.steps
    config.optimizer.learning_rate = run.learning_rate
    config.optimizer.warmup_steps = run.warmup
    config.log_every = LOG_EVERY
    return config


def train_size(config_path: str = CONFIG) -> int:
    """Training examples of the config's dataset (the main job's MNIST-1D: 4000)."""
    from contrastive_jax.training.data import open_split

    config = load_config(config_path)
    return len(open_split(config.data.name, config.data.train_split, None, None))


def run_one(config, *, verbose: bool = False) -> dict[str, Any] | None:
    """:func:`common.sweep.run_one` with this script's late-training keys."""
    return sweep.run_one(config, keys=TAIL_KEYS, fraction=TAIL_FRACTION, verbose=verbose)

def row_from_result(result: Mapping[str, Any] | None) -> dict[str, Any]:
    """The measured columns of one run (None or a non-finite loss/probe/kNN: diverged, NaN).

    Top-1, loss and ``log N - L`` are the late-training means of ``result["tail_metrics"]``
    when present, else the last step's."""
    nan = math.nan
    keys = ("linear_probe", "knn", "contrastive_top1", "mi_bound", "loss", "train_s")
    if result is None:
        return {"status": "diverged", **dict.fromkeys(keys, nan)}
    last = result["final_train_metrics"]
    m = {**last, **result.get("tail_metrics", {})}
    values = {"linear_probe": result["linear_probe"], "knn": result["knn"],
              "contrastive_top1": m["top1"], "mi_bound": m["mi_bound"], "loss": m["loss"],
              "train_s": result["train_time_s"]}
    ok = all(math.isfinite(v) for v in (values["linear_probe"], values["knn"], values["loss"],
                                        last["loss"]))
    return {"status": "ok" if ok else "diverged",
            **(values if ok else dict(values, linear_probe=nan, knn=nan))}


def summarise(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per (regime, batch): the run's settings, and mean and std over the finished seeds."""
    groups: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["regime"], row["batch"]), []).append(row)
    summary = []
    for (regime, batch), group in groups.items():
        ok = [r for r in group if r["status"] == "ok"]
        first = group[0]
        entry = {"regime": regime, "batch": batch, "steps": first["steps"],
                 "epochs": first["epochs"], "learning_rate": first["learning_rate"],
                 "warmup_steps": first["warmup_steps"], "log_n_ceiling": first["log_n_ceiling"],
                 "seeds": len(group), "diverged": len(group) - len(ok)}
        for key in METRICS:
            entry[key], entry[key + "_std"] = mean_std(r[key] for r in ok)
        summary.append(entry)
    return summary


def trend(summary: Sequence[Mapping[str, Any]], regime: str, key: str = "linear_probe") -> str:
    """How ``key`` moves with the batch in ``regime``: the best batch and the smallest/largest."""
    points = sorted((s for s in summary if s["regime"] == regime and math.isfinite(s[key])),
                    key=lambda s: s["batch"])
    if len(points) < 2:
        return f"{regime}: too few batches"
    best = max(points, key=lambda s: s[key])
    lo, hi = points[0], points[-1]
    return (f"best at B = {best['batch']} ({100 * best[key]:.1f} ± {100 * best[key + '_std']:.1f}"
            f"%); B = {lo['batch']}: {100 * lo[key]:.1f}%, B = {hi['batch']}: "
            f"{100 * hi[key]:.1f}%")


def rank_correlation(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rho: the Pearson correlation of the ranks (ties get their mean rank); NaN
    for fewer than two points or a constant sequence."""
    def ranks(values):
        order = sorted(range(len(values)), key=lambda i: values[i])
        r = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    if len(xs) < 2:
        return math.nan
    rx, ry = ranks(list(xs)), ranks(list(ys))
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx and syy else math.nan


def _direction(rhos: Sequence[float]) -> str:
    """'help' if every rank correlation is positive, 'hurt' if every one is negative, else
    'mixed'."""
    if all(r > 0 for r in rhos):
        return "help"
    if all(r < 0 for r in rhos):
        return "hurt"
    return "mixed"


def findings(summary: Sequence[Mapping[str, Any]]) -> list[str]:
    """Sentences: per regime the probe/kNN trend (best batch, Spearman rho against B) and whether
    larger batches help (both rhos > 0), as SimCLR found at equal epochs (Chen et al. 2020,
    Figure 9: more so for short training); then the bound ``log N - L`` against its ceiling
    ``log(2B - 1)`` (002 A.12.5: never above it; saturated when close to it)."""
    lines = []
    for regime in REGIMES:
        name = regime.replace("_", " ")
        points = [s for s in summary if s["regime"] == regime and math.isfinite(s["knn"])]
        rho = {key: rank_correlation([s["batch"] for s in points], [s[key] for s in points])
               for key in ("linear_probe", "knn", "mi_bound")}
        direction = _direction([rho["linear_probe"], rho["knn"]])
        verdict = {"help": "larger batches help", "hurt": "larger batches hurt",
                   "mixed": "no consistent direction"}[direction]
        if regime == "equal_epochs":
            verdict += (", as SimCLR found at equal epochs (Figure 9)" if direction == "help"
                        else ", unlike SimCLR at equal epochs (Figure 9: larger batches help, "
                        "the more so the shorter the training)")
            if points:
                biggest = max(points, key=lambda s: s["batch"])
                verdict += f"; B = {biggest['batch']} trains for only {biggest['steps']} steps here"
        else:
            verdict += " (larger batches also see more examples here)"
        lines.append(f"**{name.capitalize()}**: linear probe {trend(summary, regime)}; kNN "
                     f"{trend(summary, regime, 'knn')}. Spearman rho against B: probe "
                     f"{rho['linear_probe']:+.2f}, kNN {rho['knn']:+.2f}: {verdict}.")
    done = [s for s in summary if math.isfinite(s["mi_bound"])]
    if not done:
        return lines
    below = all(s["mi_bound"] < s["log_n_ceiling"] for s in done)
    top = max(done, key=lambda s: s["mi_bound"] / s["log_n_ceiling"])
    parts = []
    for regime in REGIMES:
        points = sorted((s for s in done if s["regime"] == regime), key=lambda s: s["batch"])
        if points:
            parts.append(f"{regime.replace('_', ' ')} " + " / ".join(
                f"{s['mi_bound']:.2f}" for s in points) + " nats at B = " + " / ".join(
                str(s["batch"]) for s in points))
    fraction = top["mi_bound"] / top["log_n_ceiling"]
    lines.append(
        "**MI bound**: log N - L is below its ceiling log(2B - 1) in "
        + ("every" if below else "not every") + " setting, as it must be (L >= 0, 002 A.12.5). "
        f"It is {'; '.join(parts)}, against ceilings "
        + " / ".join(f"{log_n_ceiling(b):.2f}" for b in sorted({s["batch"] for s in done}))
        + f". It reaches at most {fraction:.0%} of the ceiling (B = {top['batch']}, "
        f"{top['regime'].replace('_', ' ')}): "
        + ("below half of it everywhere, so the finite number of negatives does not cap it "
           "here (the saturation of 002 A.12.5, remark 1, sets in near the ceiling); what "
           "keeps it low is the loss L itself." if fraction < 0.5 else
           "close to its ceiling, where a finite number of negatives saturates the bound "
           "(002 A.12.5, remark 1)."))
    return lines


def results_table(summary: Sequence[Mapping[str, Any]]) -> str:
    """Markdown: one row per (regime, batch), accuracies in % as mean ± std over seeds."""
    def cell(s, key, scale=100.0, digits=1):
        if not math.isfinite(s[key]):
            return "diverged"
        return f"{scale * s[key]:.{digits}f} ± {scale * s[key + '_std']:.{digits}f}"

    header = ["regime", "batch", "steps", "epochs", "peak lr", "warmup", "seeds (div.)",
              "linear probe %", "kNN %", "contrastive top-1 %", "log N - L (nats)",
              "ceiling log(2B-1)"]
    rows = [[s["regime"].replace("_", " "), s["batch"], s["steps"], f"{s['epochs']:.1f}",
             f"{s['learning_rate']:.2e}", s["warmup_steps"], f"{s['seeds']} ({s['diverged']})",
             cell(s, "linear_probe"), cell(s, "knn"), cell(s, "contrastive_top1"),
             cell(s, "mi_bound", 1.0, 2), f"{s['log_n_ceiling']:.3f}"] for s in summary]
    return markdown_table(header, rows)


def figure(summary: Sequence[Mapping[str, Any]]):
    """Probe, kNN and the MI bound (with its ceiling) against the batch, per regime."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    colors = {"equal_epochs": "C0", "equal_steps": "C1"}
    for regime, color in colors.items():
        points = sorted((s for s in summary if s["regime"] == regime), key=lambda s: s["batch"])
        x = [s["batch"] for s in points]
        for ax, key in zip(axes, ("linear_probe", "knn", "mi_bound"), strict=True):
            ax.errorbar(x, [s[key] for s in points], yerr=[s[key + "_std"] for s in points],
                        color=color, marker="o", capsize=3, label=regime.replace("_", " "))
    batches = sorted({s["batch"] for s in summary})
    axes[2].plot(batches, [log_n_ceiling(b) for b in batches], "k--",
                 label="ceiling log(2B - 1)")
    titles = ("linear probe", "kNN (k=20)", "InfoNCE bound log N - L (late training)")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.set_xlabel("global batch B (lr = 2e-3 sqrt(B/128))")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("accuracy (mean ± std over seeds)")
    axes[2].set_ylabel("nats")
    fig.suptitle("SimCLR on MNIST-1D: batch size at equal epochs and at equal steps")
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=CONFIG, help="a SimCLR config file with the "
                        "variants seed, batch, quick")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=float, default=5.0,
                        help="equal-epochs regime: passes over the data (the main job: 20)")
    parser.add_argument("--steps", type=int, default=None,
                        help="equal-steps regime (default: batch 128's equal-epochs steps)")
    parser.add_argument("--quick", action="store_true",
                        help="the config's quick variant, batches 64 and 128, one seed (tests)")
    parser.add_argument("--verbose", action="store_true", help="show the trainer's own lines")
    parser.add_argument("--out", default=str(RESULTS / "batch_size_ablation"))
    args = parser.parse_args(argv)
    seeds = args.seeds[:1] if args.quick else args.seeds
    epochs = 0.1 if args.quick else args.epochs
    size = train_size(args.config)
    runs = plan(QUICK_BATCHES if args.quick else BATCHES, epochs, args.steps, size)
    jobs = [(run, seed) for run in runs for seed in seeds]
    rows, start = [], time.perf_counter()
    for i, (run, seed) in enumerate(jobs, 1):
        t0 = time.perf_counter()
        measured = row_from_result(run_one(make_config(run, seed, quick=args.quick,
                                                       config_path=args.config),
                                           verbose=args.verbose))
        for regime in run.regimes:
            rows.append({"regime": regime, "batch": run.batch, "seed": seed, "steps": run.steps,
                         "epochs": run.steps * run.batch / size,
                         "learning_rate": run.learning_rate, "warmup_steps": run.warmup,
                         "log_n_ceiling": log_n_ceiling(run.batch),
                         "shared_run": len(run.regimes) > 1, **measured})
        print(f"run {i}/{len(jobs)} | B={run.batch}, {run.steps} steps, lr {run.learning_rate:.2e}"
              f" ({' + '.join(run.regimes)}), seed {seed} | {measured['status']} | probe "
              f"{measured['linear_probe']:.4f} | kNN {measured['knn']:.4f} | log N - L "
              f"{measured['mi_bound']:.2f} of {log_n_ceiling(run.batch):.2f} | "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    rows.sort(key=lambda r: (REGIMES.index(r["regime"]), r["batch"], r["seed"]))
    summary = summarise(rows)
    steps = {s["steps"] for s in summary if s["regime"] == "equal_steps"}
    body = "\n\n".join([
        f"`python experiments/batch_size_ablation.py` ({len(jobs)} training runs, "
        f"{time.perf_counter() - start:.0f} s). SimCLR on MNIST-1D (`{args.config}`"
        + (", quick variant" if args.quick else "") + f", tau 0.2), seeds "
        f"{', '.join(map(str, seeds))}; mean ± std over seeds. Equal epochs: {epochs:g} epochs "
        f"of the {size} training signals (the main job: 20 epochs at batch 128); equal steps: "
        f"{', '.join(map(str, sorted(steps)))} steps at every batch"
        + (" (batch 128's equal-epochs run serves both regimes)" if args.steps is None else "")
        + ". Peak learning rate 2e-3 sqrt(B / 128) (square-root scaling, SimCLR Appendix B.1; "
        "AdamW's decoupled weight decay 0.1 scales with it); linear warmup over 5% of each "
        "run's steps (the main job's 31/625, at least one step), then cosine decay to 0. "
        f"Contrastive top-1 and log N - L are means over the training batches logged every "
        f"{LOG_EVERY} steps in the last {TAIL_FRACTION:.0%} of each run (the top-1 on the "
        "first min(B, 256) anchors of a batch), with N = 2B - 1 candidates per anchor: Monte "
        "Carlo values of the bound (002 A.12.5, remark 2), and a top-1 that is harder at "
        "larger B.",
        results_table(summary),
        "\n\n".join(findings(summary)),
    ])
    report(args.out, rows, title="Batch size (SimCLR, MNIST-1D)", body=body,
           figure=figure(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
