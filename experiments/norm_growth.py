"""Norm growth and the effective learning rate of SimCLR on MNIST-1D (derivations §12.3, §12.4).

    python experiments/norm_growth.py [--quick] [--every 5] [--out experiments/results/norm_growth]

Runs of the main job (``configs/simclr_mnist1d.py``, AdamW, lr 2e-3, 20 epochs), :data:`RUNS`:
``cosine`` (the default: cosine logits at tau 0.2, weight decay 0.1); ``dot`` and ``dot_tau10``,
dot-product logits ``z_i . z_j / tau`` at tau 1 and 10 (``loss.normalize=False``, docs/
derivations.md §12.4: the loss rewards growing ``||z||`` when the positive leads, shrinking it
when it loses); ``cosine_wd0``, the default without weight decay (docs/derivations.md §12.3:
then nothing shrinks the norm of the scale-invariant weights).

Every ``--every`` steps it records the mean embedding norm ``||z||`` before normalisation, the
norm ``||W||`` of the scale-invariant weights (the kernels followed by BatchNorm,
docs/derivations.md §12.2), the learning rate, the predicted angular step of ``W``
(:func:`effective_lr`) and the measured one (:func:`angular_step`). At the end each frozen
encoder gets the linear probe and kNN (not with ``--quick``: 8 steps, recorded every step).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from common import reporting, sweep
from common.reporting import accuracies, accuracy_cells, command, load_config, markdown_table
from contrastive_jax.training.parameter_paths import path_keys

CONFIG = "configs/simclr_mnist1d.py"
DOT = {"loss.normalize": False, "loss.impl": "autodiff"}
# run name -> (description, config overrides)
RUNS: dict[str, tuple[str, dict]] = {
    "cosine": ("cosine / tau 0.2, wd 0.1 (default)", {}),
    "dot": ("dot product / tau 1, wd 0.1", {**DOT, "loss.temperature": 1.0}),
    "dot_tau10": ("dot product / tau 10, wd 0.1", {**DOT, "loss.temperature": 10.0}),
    "cosine_wd0": ("cosine / tau 0.2, wd 0", {"optimizer.weight_decay": 0.0}),
}


def is_scale_invariant(names: Sequence) -> bool:
    """A kernel followed by BatchNorm (no bias): the loss is invariant to its scale
    (docs/derivations.md §12.1-12.2); in the SimCLR model the conv and head hidden kernels."""
    return bool(names) and names[-1] == "kernel" and any(n in ("convs", "hidden") for n in names)


def scale_invariant_weights(params) -> jax.Array:
    """The scale-invariant kernels of ``params`` flattened and concatenated (one vector)."""
    leaves = [leaf for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
              if is_scale_invariant(path_keys(path))]
    if not leaves:
        raise ValueError("no scale-invariant kernels (a kernel under 'convs' or 'hidden')")
    return jnp.concatenate([jnp.ravel(leaf).astype(jnp.float32) for leaf in leaves])


def angular_step(before: np.ndarray, after: np.ndarray) -> float:
    """``|| a/||a|| - b/||b|| ||``: the chord between two directions (~ the angle in radians
    for small steps), the turn of the weights over one step (docs/derivations.md §12.3)."""
    before, after = np.asarray(before, np.float64), np.asarray(after, np.float64)
    return float(np.linalg.norm(after / np.linalg.norm(after) - before / np.linalg.norm(before)))


def effective_lr(learning_rate: float, n_params: int, weight_norm: float) -> float:
    """Predicted angular step of scale-invariant weights under Adam(W): ``lr sqrt(n) / ||W||``.

    docs/derivations.md §12.3's ``lr / ||W||^2`` is SGD's, whose gradient shrinks as
    ``1 / ||W||``; Adam's update has about ``lr`` per coordinate whatever the gradient's size,
    ``||dW|| ~ lr sqrt(n)``, so one factor of ``1 / ||W||`` remains (the measured step is this
    times the RMS of the part of Adam's normalised update orthogonal to ``W``).
    """
    return learning_rate * math.sqrt(n_params) / weight_norm


def run_config(name: str, quick: bool, seed: int):
    """The main job's config (or its ``quick`` variant, 8 steps) with run ``name``'s overrides."""
    config = load_config(f"{CONFIG}:seed={seed}" + (",quick" if quick else ""))
    config.update_from_flattened_dict(RUNS[name][1])
    if quick:
        config.total_steps = 8
    return config


def train_run(config, every: int, final_eval: bool = True) -> tuple[list[dict], dict]:
    """Train ``config``, recording every ``every`` steps: ``(rows, final evaluation)``."""
    weights = jax.jit(scale_invariant_weights)

    def record(state, metrics, before):
        after = np.asarray(weights(state.params))
        lr, norm = float(metrics["learning_rate"]), float(np.linalg.norm(after))
        return {"learning_rate": lr, "loss": float(metrics["loss"]),
                "top1": float(metrics["top1"]), "embedding_norm": float(metrics["embedding_norm"]),
                "weight_norm": norm, "n_params": after.size,
                "effective_lr": effective_lr(lr, after.size, norm),
                "angular_step": angular_step(before, after)}

    return sweep.train_recording(config, every, record, final_eval=final_eval,
                                 before=lambda state: np.asarray(weights(state.params)))


def logit_scale(row: dict) -> float:
    """``1 / tau`` for cosine logits, about ``||z||^2 / tau`` (the mean norm squared) for
    dot-product logits (docs/derivations.md §12.4: the norm is a learned scale)."""
    return (1.0 if row["normalize"] else row["embedding_norm"] ** 2) / row["temperature"]


def summary_table(runs: dict[str, list[dict]], finals: dict[str, dict]) -> str:
    """Per run: ||z||, the logit scale and ||W|| first and last; the measured and predicted
    angular steps averaged while the rate is above half its peak, their ratio; accuracies."""
    header = ("run", "‖z‖ first → last", "logit scale first → last", "‖W‖ first → max → last",
              "angular step (measured)", "lr·sqrt(n)/‖W‖", "ratio", "linear probe", "kNN")
    lines = []
    for name, rows in runs.items():
        first, last = rows[0], rows[-1]
        peak = max(r["learning_rate"] for r in rows)
        mid = [r for r in rows if r["learning_rate"] > 0.5 * peak]
        measured = float(np.mean([r["angular_step"] for r in mid]))
        formula = float(np.mean([r["effective_lr"] for r in mid]))
        lines.append((RUNS[name][0],
                      f"{first['embedding_norm']:.3g} → {last['embedding_norm']:.3g}",
                      f"{logit_scale(first):.3g} → {logit_scale(last):.3g}",
                      f"{first['weight_norm']:.2f} → {max(r['weight_norm'] for r in rows):.2f}"
                      f" → {last['weight_norm']:.2f}",
                      f"{measured:.2e}", f"{formula:.2e}", f"{measured / formula:.2f}",
                      *accuracy_cells(finals[name])))
    return markdown_table(header, lines)


def plot(runs: dict[str, list[dict]]):
    """Six panels over steps: ||z||, the logit scale, ||W||, the learning rate, the measured
    vs predicted angular step, and their ratio."""
    import matplotlib.pyplot as plt

    panels = (  # (y of a row, axis settings)
        (lambda r: r["embedding_norm"], {"yscale": "log", "ylabel": "mean ‖z‖ before "
         "normalisation", "title": "embedding norm (derivations §12.4)"}),
        (logit_scale, {"yscale": "log", "ylabel": "1/tau (cosine), (mean ‖z‖)²/tau (dot)",
                       "title": "logit scale the loss sees"}),
        (lambda r: r["weight_norm"], {"ylabel": "‖W‖, kernels followed by BatchNorm",
                                      "title": "scale-invariant weights (derivations §12.2)"}),
        (lambda r: r["learning_rate"], {"ylabel": "learning rate (AdamW)",
                                        "title": "schedule: warmup + cosine"}),
        (lambda r: r["angular_step"], {"yscale": "log", "ylabel": "angular step of W per step",
                                       "title": "measured (solid) vs lr·sqrt(n)/‖W‖ (dashed)"}),
        (lambda r: r["angular_step"] / r["effective_lr"] if r["effective_lr"] > 0 else math.nan,
         {"ylabel": "measured / (lr·sqrt(n)/‖W‖)",
          "title": "ratio: RMS of Adam's update orthogonal to W"}))
    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5))
    for ax, (y, settings) in zip(axes.flat, panels, strict=True):
        for i, (name, rows) in enumerate(runs.items()):
            ax.plot([r["step"] for r in rows], [y(r) for r in rows], color=f"C{i}",
                    label=RUNS[name][0])
        ax.set(xlabel="step", **settings)
        ax.grid(alpha=0.3)
    for i, rows in enumerate(runs.values()):
        axes[1][1].plot([r["step"] for r in rows], [r["effective_lr"] for r in rows],
                        color=f"C{i}", ls="--")
    fig.tight_layout()
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="upper center", ncol=4, fontsize=9,
               bbox_to_anchor=(0.5, 0.0))
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = reporting.parser(__doc__, "norm_growth",
                              quick="quick config, 8 steps, no final evaluation (tests)")
    parser.add_argument("--every", type=int, default=5, help="record every N steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    args = parser.parse_args(argv)
    every = 1 if args.quick else args.every
    runs, finals, csv_rows = {}, {}, []
    for name in args.runs:
        config = run_config(name, args.quick, args.seed)
        rows, finals[name] = train_run(config, every, final_eval=not args.quick)
        setting = {"run": name, "normalize": bool(config.loss.get("normalize", True)),
                   "temperature": float(config.loss.temperature),
                   "weight_decay": float(config.optimizer.weight_decay)}
        runs[name] = [{**setting, **row} for row in rows]
        csv_rows += [{**row, **accuracies(finals[name])} for row in runs[name]]
        print(f"{name}: probe / kNN {accuracy_cells(finals[name])}", flush=True)
    first = runs[args.runs[0]]
    produced = (
        f"{command(__file__, argv)}: `{CONFIG}`" + (" (quick variant)" if args.quick else "")
        + f", seed {args.seed}, {first[-1]['step']} steps, AdamW lr "
        f"{config.optimizer.learning_rate:g} peak (warmup + cosine), recorded every {every} "
        f"steps; n = {first[0]['n_params']} scale-invariant weights.")
    reporting.report(args.out, csv_rows, title="Norm growth and the effective learning rate "
                     "(derivations §12.3, §12.4)", produced=produced,
                     tables=[summary_table(runs, finals)], figure=plot(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
