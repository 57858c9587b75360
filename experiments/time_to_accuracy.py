"""Linear-probe and kNN accuracy against training time for one config (the main job by default).

    python experiments/time_to_accuracy.py [--config configs/simclr_mnist1d.py] [--every 50]
        [--target 0.82] [--seeds 0 1 2] [--quick]

Runs the trainer with an evaluation every ``--every`` steps (evaluation time is not counted as
training time) for each seed and writes ``experiments/results/time_to_accuracy.{csv,md}``:
per evaluation the step, training seconds (after compilation), linear probe and kNN; and per
seed the final accuracies, the training time and the first training time at which the probe
reached ``--target``.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import pathlib
import statistics
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"


def load_config(path: str, arg: str | None):
    spec = importlib.util.spec_from_file_location("config", ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/simclr_mnist1d.py")
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--target", type=float, default=0.82)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--quick", action="store_true", help="tiny run (for the tests)")
    parser.add_argument("--out", default=str(RESULTS / "time_to_accuracy"))
    args = parser.parse_args(argv)
    from contrastive_jax.train import train_and_evaluate

    rows, summary = [], []
    for seed in args.seeds:
        config = load_config(args.config, f"seed={seed}" + (",quick" if args.quick else ""))
        config.evaluation.every = 3 if args.quick else args.every
        with tempfile.TemporaryDirectory() as workdir:
            result = train_and_evaluate(config, workdir)
        for ev in result["evaluations"]:
            rows.append({"seed": seed, "step": ev["step"], "train_s": ev["train_s"],
                         "linear_probe": ev["linear_probe"], "knn": ev["knn"]})
        reached = [ev["train_s"] for ev in result["evaluations"]
                   if ev["linear_probe"] >= args.target]
        summary.append({"seed": seed, "steps": result["steps"],
                        "train_s": result["train_time_s"], "wall_s": result["wall_time_s"],
                        "linear_probe": result["linear_probe"], "knn": result["knn"],
                        "to_target_s": reached[0] if reached else None})
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".csv"), "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = [f"# Time to accuracy: {args.config} (evaluation every {args.every} steps)", "",
             f"| seed | steps | linear probe | kNN | train s | wall s (incl. evals) | "
             f"train s to probe >= {args.target:.2f} |", "| --- " * 7 + "|"]
    for s in summary:
        to = f"{s['to_target_s']:.1f}" if s["to_target_s"] is not None else "not reached"
        lines.append(f"| {s['seed']} | {s['steps']} | {s['linear_probe']:.4f} | {s['knn']:.4f}"
                     f" | {s['train_s']:.1f} | {s['wall_s']:.1f} | {to} |")
    probes = [s["linear_probe"] for s in summary]
    knns = [s["knn"] for s in summary]
    std = statistics.stdev if len(summary) > 1 else (lambda v: 0.0)
    lines += ["", f"Linear probe {statistics.mean(probes):.4f} ± {std(probes):.4f}, kNN "
              f"{statistics.mean(knns):.4f} ± {std(knns):.4f} over {len(summary)} seeds "
              "(mean ± std).",
              "Training seconds exclude compilation (the first step) and the evaluations.", ""]
    out.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
