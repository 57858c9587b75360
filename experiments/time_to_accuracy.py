"""Linear-probe and kNN accuracy against training time for one config (the main job by default).

    python experiments/time_to_accuracy.py [--config configs/simclr_mnist1d.py] [--every 50]
        [--target 0.82] [--seeds 0 1 2] [--quick]

Runs the trainer with an evaluation every ``--every`` steps (evaluation time is not counted as
training time) for each seed and writes ``experiments/results/time_to_accuracy.{csv,md,png}``:
per evaluation the step, training seconds (after compilation), linear probe and kNN (``.csv``);
per seed the final accuracies, the training time and the first training time at which the probe
reached ``--target``, and their mean ± std (``.md``); both accuracies against training seconds
(``.png``).
"""

from __future__ import annotations

import tempfile

import matplotlib.pyplot as plt

from common import reporting
from common.reporting import command, load_config, markdown_table, mean_std, report


def plot(rows: list[dict], target: float) -> plt.Figure:
    """Probe and kNN accuracy against training seconds, one line per seed."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, metric in zip(axes, ("linear_probe", "knn"), strict=True):
        for seed in sorted({r["seed"] for r in rows}):
            mine = [r for r in rows if r["seed"] == seed]
            ax.plot([r["train_s"] for r in mine], [r[metric] for r in mine], marker=".",
                    label=f"seed {seed}")
        ax.axhline(target, color="grey", ls="--", lw=1, label=f"target {target:.2f}")
        ax.set_xlabel("training seconds (excluding compilation and evaluation)")
        ax.set_title({"linear_probe": "linear probe", "knn": "kNN (k=20)"}[metric])
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy")
    axes[0].legend()
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = reporting.parser(__doc__, "time_to_accuracy", quick="tiny run (for the tests)",
                              config="configs/simclr_mnist1d.py", seeds=(0, 1, 2))
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--target", type=float, default=0.82)
    args = parser.parse_args(argv)
    from contrastive_jax.training.train import train_and_evaluate

    every = 3 if args.quick else args.every
    rows, summary = [], []
    for seed in args.seeds:
        config = load_config(f"{args.config}:seed={seed}" + (",quick" if args.quick else ""))
        config.evaluation.every = every
        with tempfile.TemporaryDirectory() as workdir:
            result = train_and_evaluate(config, workdir)
        for ev in result["evaluations"]:
            rows.append({"seed": seed, "step": ev["step"], "train_s": ev["train_s"],
                         "linear_probe": ev["linear_probe"], "knn": ev["knn"]})
        reached = [ev["train_s"] for ev in result["evaluations"]
                   if ev["linear_probe"] >= args.target]
        summary.append({"seed": seed, "steps": result["steps"],
                        "linear_probe": result["linear_probe"], "knn": result["knn"],
                        "train_s": result["train_time_s"], "wall_s": result["wall_time_s"],
                        "to_target_s": f"{reached[0]:.1f}" if reached else "not reached"})
    table = markdown_table(
        ["seed", "steps", "linear probe", "kNN", "train s", "wall s (incl. evals)",
         f"train s to probe >= {args.target:.2f}"],
        [[s["seed"], s["steps"], f"{s['linear_probe']:.4f}", f"{s['knn']:.4f}",
          f"{s['train_s']:.1f}", f"{s['wall_s']:.1f}", s["to_target_s"]] for s in summary]
        + [["mean ± std", "", *("{:.4f} ± {:.4f}".format(*mean_std(s[k] for s in summary))
                                for k in ("linear_probe", "knn")), "", "", ""]])
    produced = (f"{command(__file__, argv)}: `{args.config}`, seeds "
                f"{', '.join(map(str, args.seeds))}, evaluation every {every} steps; training "
                "seconds exclude compilation (the first step) and the evaluations.")
    report(args.out, rows, title=f"Time to accuracy: {args.config} (evaluation every {every} "
           "steps)", produced=produced, tables=[table], figure=plot(rows, args.target))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
