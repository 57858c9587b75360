"""A learned logit scale with and without CLIP's clip at 100 (docs/derivations.md §7.5-7.6).

    python experiments/learned_temperature.py [--quick] [--every 5]
        [--out experiments/results/learned_temperature]

SimCLR on MNIST-1D with a learned temperature (``configs/simclr_mnist1d.py:learn_temperature``:
the model holds ``t = log s``, ``s = 1 / tau``, initialised at ``log 5``), either ``clip``
(``loss.max_scale = 100``, the default: the loss uses ``min(e^t, 100)`` and the trainer clamps
``t`` one float below ``log 100`` after each update, [CLIP], [OpenCLIP]) or ``no_clip``
(``max_scale = inf``). docs/derivations.md §7.5: ``dl/dt = (sum_j p_j c_j - c_pos) / tau`` is
negative whenever the positive beats the softmax-weighted similarity. The runs (:data:`RUNS`):
the main job's views at the config's temperature rate (the main rate) and at a raised
``optimizer.temperature_lr`` of 0.5; and identical views (every augmentation off: every
positive has cosine 1 and wins) at the raised rate.

``--quick`` runs only the identical-views pair, 8 steps of the quick variant, at
``temperature_lr`` 1.5, without the final evaluation. The script records ``t`` after every
``--every``-th update with that step's loss and contrastive top-1, and evaluates each frozen
encoder at the end (linear probe, kNN).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from common import reporting, sweep
from common.reporting import (
    accuracies,
    accuracy_cells,
    command,
    late_mean,
    load_config,
    markdown_table,
)

CONFIG = "configs/simclr_mnist1d.py"
CLIP = 100.0
LOG_CLIP = math.log(CLIP)


class Run(NamedTuple):
    """One training run: the views, the temperature's peak rate (0: the main rate, the config's
    default) and ``loss.max_scale``."""

    name: str
    views: str  # "default" (the config's augmentations) | "identical" (all off)
    temperature_lr: float
    max_scale: float


RUNS = (
    Run("default_lr_clip", "default", 0.0, CLIP),
    Run("default_clip", "default", 0.5, CLIP),
    Run("default_no_clip", "default", 0.5, math.inf),
    Run("identical_clip", "identical", 0.5, CLIP),
    Run("identical_no_clip", "identical", 0.5, math.inf),
)
QUICK_RUNS = (
    Run("identical_clip", "identical", 1.5, CLIP),
    Run("identical_no_clip", "identical", 1.5, math.inf),
)


def run_config(run: Run, quick: bool, seed: int):
    """The main job (or its quick variant) with a learned temperature and ``run``'s settings."""
    config = load_config(f"{CONFIG}:learn_temperature,seed={seed}" + (",quick" if quick else ""))
    config.loss.max_scale = run.max_scale
    config.optimizer.temperature_lr = run.temperature_lr
    if run.views == "identical":
        no_augmentation(config)
    if quick:
        config.total_steps = 8
    return config


def no_augmentation(config) -> None:
    """Every augmentation strength 0: the two views are identical, each positive has cosine 1
    and beats every negative, so ``dl/dt < 0`` at every step (docs/derivations.md §7.5)."""
    for op, strength in config.augment.items():
        if op != "kind" and strength:
            config.augment[op] = 0.0


def train_run(config, every: int, final_eval: bool = True) -> tuple[list[dict], dict]:
    """Train ``config``, recording ``t`` after every ``every``-th update: ``(rows, final
    evaluation)``."""
    def record(state, metrics, _):
        t = float(np.asarray(state.params["log_scale"][...]))  # the model's learned t
        return {"log_scale": t, "temperature": math.exp(-t), "loss": float(metrics["loss"]),
                "top1": float(metrics["top1"]), "learning_rate": float(metrics["learning_rate"])}

    return sweep.train_recording(config, every, record, final_eval=final_eval)


def first_step_at_clip(rows: Sequence[dict]) -> int | None:
    """The first recorded step with ``t >= log 100`` (within float32 rounding), or None."""
    return next((r["step"] for r in rows if r["log_scale"] >= LOG_CLIP - 1e-6), None)


def summary_table(runs: dict[Run, list[dict]], finals: dict[Run, dict], main_lr: float) -> str:
    """Per run: t at the end and at most, when it reached log 100, late top-1 and loss, and
    the accuracies."""
    header = ("run", "views", "temperature_lr", "max_scale", "t final (s = e^t)", "max t",
              "first step t ≥ log 100", "top-1, last 10%", "loss, last 10%", "linear probe",
              "kNN")
    lines = []
    for run, rows in runs.items():
        t_final, t_max = rows[-1]["log_scale"], max(r["log_scale"] for r in rows)
        reached = first_step_at_clip(rows)
        lr = f"{run.temperature_lr:g}" if run.temperature_lr else f"{main_lr:g} (default)"
        lines.append((run.name, run.views, lr, f"{run.max_scale:g}",
                      f"{t_final:.3f} ({math.exp(t_final):.4g})", f"{t_max:.3f}",
                      "never" if reached is None else str(reached),
                      f"{late_mean(rows, 'top1'):.3f}", f"{late_mean(rows, 'loss'):.2e}",
                      *accuracy_cells(finals[run])))
    return markdown_table(header, lines)


def plot(runs: dict[Run, list[dict]]):
    """t over steps (with log 100) and the training loss of each recorded step."""
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_loss) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, (run, rows) in enumerate(runs.items()):
        steps = [r["step"] for r in rows]
        style = {"color": f"C{i}", "ls": "-" if run.max_scale == CLIP else "--",
                 "label": f"{run.name} (temperature_lr {run.temperature_lr or 'main'}, "
                          f"max_scale {run.max_scale:g})"}
        ax_t.plot(steps, [r["log_scale"] for r in rows], **style)
        ax_loss.plot(steps, [max(r["loss"], 1e-12) for r in rows], alpha=0.8, **style)
    ax_t.axhline(LOG_CLIP, color="k", ls=":", lw=1, label="log 100 (tau = 0.01)")
    ax_t.set(xlabel="step", ylabel="t = log s = -log tau",
             title="learned log-scale (derivations §7.5)")
    ax_loss.set(xlabel="step", ylabel="NT-Xent loss (training batch)", yscale="log",
                title="training loss")
    for ax in (ax_t, ax_loss):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.legend(*ax_t.get_legend_handles_labels(), loc="upper center", ncol=3, fontsize=8,
               bbox_to_anchor=(0.5, 0.0))
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = reporting.parser(__doc__, "learned_temperature",
                              quick="quick config, 8 steps, no final evaluation (tests)")
    parser.add_argument("--every", type=int, default=5, help="record every N steps")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    every = 1 if args.quick else args.every
    runs, finals, csv_rows = {}, {}, []
    for run in QUICK_RUNS if args.quick else RUNS:
        config = run_config(run, args.quick, args.seed)
        runs[run], finals[run] = train_run(config, every, final_eval=not args.quick)
        print(f"{run.name}: t {runs[run][-1]['log_scale']:.3f}, probe / kNN "
              f"{accuracy_cells(finals[run])}", flush=True)
        csv_rows += [{"run": run.name, "views": run.views,
                      "temperature_lr": run.temperature_lr or config.optimizer.learning_rate,
                      "max_scale": run.max_scale, **row, **accuracies(finals[run])}
                     for row in runs[run]]
    main_lr = config.optimizer.learning_rate
    produced = (
        f"{command(__file__, argv)}: `{CONFIG}:learn_temperature`"
        + (" (quick variant)" if args.quick else "") + f", seed {args.seed}, "
        f"{runs[run][-1]['step']} steps; t starts at log(1 / {config.model.init_temperature:g})"
        f" = {math.log(1 / config.model.init_temperature):.3f}, log 100 = {LOG_CLIP:.3f}; "
        f"network AdamW lr {main_lr:g}, t Adam at temperature_lr; recorded every {every} steps.")
    reporting.report(args.out, csv_rows, title="Learned temperature with and without the clip "
                     "(derivations §7.5-7.6)", produced=produced,
                     tables=[summary_table(runs, finals, main_lr)], figure=plot(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
