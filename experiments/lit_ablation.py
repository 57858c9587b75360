"""Locked-image tuning (LiT) on MNIST-1D signals and digit captions: a locked, contrastively
pretrained signal tower against training both towers.

    python experiments/lit_ablation.py [--seeds 0 1 2] [--epochs 5] [--simclr-epochs 5]
        [--quick] [--out experiments/results/lit]

First the SimCLR main job (``configs/simclr_mnist1d.py``, ``--simclr-epochs``) trains a signal
encoder in a temporary workdir; then ``configs/lit_mnist1d.py`` runs, at equal steps and seeds,
in three modes: ``locked`` (the SimCLR encoder as the signal tower, frozen: [LiT]),
``finetune`` (initialised from it, both towers trained) and ``scratch`` (the same
architecture, randomly initialised, both towers trained). Per run: zero-shot accuracy on the
digit prompts, retrieval Recall@1 (signal -> caption and caption -> signal, a caption naming
the right digit counts), the linear probe on the signal tower, and the training time. Writes
``OUT.csv`` (one row per run), ``OUT.md`` (mean ± std per mode) and ``OUT.png``.
"""

from __future__ import annotations

import contextlib
import io
import math
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from common import reporting, sweep
from common.reporting import command, load_config, markdown_table, pm, report, summarise

MODES = ("locked", "finetune", "scratch")
LABELS = {"locked": "LiT: pretrained signal tower, locked",
          "finetune": "pretrained signal tower, both towers trained",
          "scratch": "both towers from scratch"}
METRICS = ("zero_shot", "x_to_y_r1", "y_to_x_r1", "linear_probe")
COLUMNS = (*METRICS, "loss", "steps", "train_s")


def pretrain(epochs: float, *, quick: bool, workdir: str, verbose: bool) -> dict[str, Any]:
    """The SimCLR main job in ``workdir`` (``epochs``; ``quick``: its quick variant)."""
    from contrastive_jax.training.run_spec import total_steps
    from contrastive_jax.training.train import train_and_evaluate

    config = load_config("configs/simclr_mnist1d.py:" + ("quick" if quick else
                                                          f"epochs={epochs!r}"))
    if not quick:
        config.optimizer.warmup_steps = sweep.warmup_steps(
            total_steps(config, sweep.train_size(config)))
    sink = contextlib.nullcontext() if verbose else contextlib.redirect_stdout(io.StringIO())
    with sink:
        return train_and_evaluate(config, workdir)


def make_config(mode: str, seed: int, pretrained: str, *, epochs: float, quick: bool):
    """``configs/lit_mnist1d.py`` in ``mode``, the warmup scaled to the run's length."""
    from contrastive_jax.training.run_spec import total_steps

    variant = f"mode={mode},seed={seed}" + ("" if mode == "scratch" else
                                            f",pretrained={pretrained}")
    variant += ",quick" if quick else f",epochs={epochs!r}"
    config = load_config(f"configs/lit_mnist1d.py:{variant}")
    if not quick:
        config.optimizer.warmup_steps = sweep.warmup_steps(
            total_steps(config, sweep.train_size(config)))
    config.log_every = sweep.LOG_EVERY
    return config


def row_from_result(result: Mapping[str, Any] | None) -> dict[str, Any]:
    """The measured columns of one run (a diverged run: NaN accuracies)."""
    if result is None:
        return {"status": "diverged", **dict.fromkeys(COLUMNS, math.nan)}
    late, ok = sweep.late_metrics(result)
    row = {"status": "ok" if ok else "diverged", **{m: result[m] for m in METRICS},
           "loss": late["loss"], "steps": result["steps"], "train_s": result["train_time_s"]}
    return row if ok else {**row, **dict.fromkeys(METRICS, math.nan)}


def results_table(summary: Sequence[Mapping[str, Any]]) -> str:
    header = ["signal tower", "seeds (diverged)", "zero-shot %", "Recall@1 signal->text %",
              "Recall@1 text->signal %", "linear probe %", "train s"]
    return markdown_table(header, [
        [LABELS[s["mode"]], f"{s['seeds']} ({s['diverged']})", pm(s, "zero_shot"),
         pm(s, "x_to_y_r1"), pm(s, "y_to_x_r1"), pm(s, "linear_probe"),
         pm(s, "train_s", 1, 1)] for s in summary])


def figure(summary: Sequence[Mapping[str, Any]]):
    """Bars: zero-shot, both Recall@1 and the probe per mode, mean ± std over seeds."""
    import matplotlib.pyplot as plt
    import numpy as np

    titles = ("zero-shot accuracy", "Recall@1 signal -> caption", "Recall@1 caption -> signal",
              "linear probe (signal tower)")
    fig, ax = plt.subplots(figsize=(10, 4.2))
    width = 0.8 / len(summary)
    for i, s in enumerate(summary):
        ax.bar(np.arange(len(METRICS)) + (i - (len(summary) - 1) / 2) * width,
               [s[m] for m in METRICS], width, yerr=[s[m + "_std"] for m in METRICS],
               capsize=3, label=LABELS[s["mode"]])
    ax.set_xticks(np.arange(len(METRICS)), titles)
    ax.set(ylabel="accuracy (mean ± std over seeds)", ylim=(0, 1))
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title("LiT on MNIST-1D + digit captions: locked SimCLR signal tower vs both trained")
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = reporting.parser(__doc__, "lit", seeds=(0, 1, 2),
                              quick="the configs' quick variants, one seed (tests)")
    parser.add_argument("--epochs", type=float, default=5.0, help="epochs of each LiT run")
    parser.add_argument("--simclr-epochs", type=float, default=5.0,
                        help="epochs of the SimCLR pretraining (the main job: 20)")
    parser.add_argument("--verbose", action="store_true", help="show the trainer's own lines")
    args = parser.parse_args(argv)
    seeds = args.seeds[:1] if args.quick else args.seeds
    rows = []
    with tempfile.TemporaryDirectory() as simclr:
        pre = pretrain(args.simclr_epochs, quick=args.quick, workdir=simclr,
                       verbose=args.verbose)
        print(f"SimCLR pretraining: {pre['steps']} steps, probe {pre['linear_probe']:.4f}",
              flush=True)
        for mode in MODES:
            for seed in seeds:
                config = make_config(mode, seed, simclr, epochs=args.epochs, quick=args.quick)
                result = sweep.run_one(config, keys=("loss",), verbose=args.verbose)
                rows.append({"mode": mode, "seed": seed, **row_from_result(result)})
                print(f"{mode}, seed {seed}: zero-shot {rows[-1]['zero_shot']:.4f}, R@1 "
                      f"{rows[-1]['x_to_y_r1']:.4f}", flush=True)
    length = "the quick variants" if args.quick else f"{args.epochs:g} epochs"
    simclr_length = "quick" if args.quick else f"{args.simclr_epochs:g} epochs"
    produced = (
        f"{command(__file__, argv)}: `configs/lit_mnist1d.py` in 3 modes × seeds "
        f"{', '.join(map(str, seeds))} = {len(rows)} runs of {length} ({rows[0]['steps']} steps "
        f"of batch {config.data.batch_size}, warmup {config.optimizer.warmup_steps}); the "
        f"signal tower pretrained by `configs/simclr_mnist1d.py` ({simclr_length}, "
        f"{pre['steps']} steps, seed 0, probe {100 * pre['linear_probe']:.1f}%); mean ± std "
        "over seeds; evaluation on the test split.")
    summary = summarise(rows, ("mode",), (*METRICS, "train_s"))
    report(args.out, rows, title="Locked-image tuning (LiT) on MNIST-1D and digit captions",
           produced=produced, tables=[results_table(summary)], figure=figure(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
