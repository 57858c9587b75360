"""Norm growth and the effective learning rate of SimCLR on MNIST-1D (000 P7, P10).

    python experiments/norm_growth.py [--quick] [--every 5] [--out experiments/results/norm_growth]

Three runs of the main job (``configs/simclr_mnist1d.py``, AdamW, lr 2e-3, 20 epochs):

* ``cosine``: the default, cosine logits at tau 0.2, weight decay 0.1;
* ``dot``: dot-product logits ``z_i . z_j / tau`` at tau 1 (``loss.normalize=False``,
  impl ``autodiff``; 000 P10: the loss rewards growing ``||z||`` when the positive leads, and
  shrinking it when the positive loses);
* ``dot_tau10``: the same at tau 10, whose initial logit scale ``||z||^2 / tau`` (about 5.7)
  is close to the cosine run's ``1 / 0.2``;
* ``cosine_wd0``: the default without weight decay (000 P7: nothing shrinks the norm of the
  scale-invariant weights).

Every ``--every`` steps the script records the mean embedding norm ``||z||`` before
normalisation, the norm ``||W||`` of the scale-invariant weights (every kernel followed by
BatchNorm: the three conv kernels and the head's hidden kernel, concatenated), the learning
rate, the predicted angular step (the effective learning rate, see :func:`effective_lr`) and
the measured angular step ``|| W_t/||W_t|| - W_{t-1}/||W_{t-1}|| ||`` of that step. At the end
each run's frozen encoder gets the trainer's linear probe and kNN (not with ``--quick``: 8 steps
of the quick variant, recorded every step).
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from common import sweep
from common.reporting import (
    RESULTS,
    accuracies,
    accuracy_cells,
    load_config,
    markdown_table,
    report,
)
from contrastive_jax.training.evaluation.frozen_model import evaluate
from contrastive_jax.training.optimizers import leaf_names

CONFIG = "configs/simclr_mnist1d.py"
# run name -> (description, config overrides as (dotted key, value))
RUNS: dict[str, tuple[str, tuple[tuple[str, object], ...]]] = {
    "cosine": ("cosine / tau 0.2, wd 0.1 (default)", ()),
    "dot": ("dot product / tau 1, wd 0.1", (("loss.normalize", False), ("loss.impl", "autodiff"),
                                            ("loss.temperature", 1.0))),
    "dot_tau10": ("dot product / tau 10, wd 0.1", (("loss.normalize", False),
                                                   ("loss.impl", "autodiff"),
                                                   ("loss.temperature", 10.0))),
    "cosine_wd0": ("cosine / tau 0.2, wd 0", (("optimizer.weight_decay", 0.0),)),
}


def is_scale_invariant(names: Sequence) -> bool:
    """True for a kernel whose output feeds a BatchNorm (no bias): the loss is invariant to its
    scale (per output channel, hence for the whole kernel), 000 P7.1. In the SimCLR model
    these are the encoder's conv kernels and the head's hidden kernels."""
    return bool(names) and names[-1] == "kernel" and any(n in ("convs", "hidden") for n in names)


def scale_invariant_weights(params) -> jax.Array:
    """The scale-invariant kernels of ``params`` flattened and concatenated (one vector)."""
    leaves = [leaf for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
              if is_scale_invariant(leaf_names(path))]
    if not leaves:
        raise ValueError("no scale-invariant kernels (a kernel under 'convs' or 'hidden')")
    return jnp.concatenate([jnp.ravel(leaf).astype(jnp.float32) for leaf in leaves])


def angular_step(before: np.ndarray, after: np.ndarray) -> float:
    """``|| a/||a|| - b/||b|| ||``: the chord between two directions (~ the angle in radians
    for small steps), the change of the weight direction over one step (000 P7)."""
    before, after = np.asarray(before, np.float64), np.asarray(after, np.float64)
    return float(np.linalg.norm(after / np.linalg.norm(after) - before / np.linalg.norm(before)))


def effective_lr(learning_rate: float, n_params: int, weight_norm: float) -> float:
    """Predicted angular step of scale-invariant weights under Adam(W): ``lr sqrt(n) / ||W||``.

    000 P7's ``lr / ||W||^2`` is for SGD: the gradient of a scale-invariant loss shrinks as
    ``1 / ||W||`` and a step of fixed length turns a long vector by less, another ``1 / ||W||``.
    Adam divides each coordinate's gradient by its running RMS, so its update has a size of
    about ``lr`` per coordinate whatever ``||grad||`` is: ``||dW|| ~ lr sqrt(n)`` and the
    direction turns by ``~ lr sqrt(n) / ||W||`` (the measured step is this times the RMS of
    Adam's normalised update, 1 on the first update and typically below 1 once the gradient is
    noisy, and only its part orthogonal to ``W`` turns it). One factor of ``1 / ||W||`` remains.
    """
    return learning_rate * math.sqrt(n_params) / weight_norm


def set_path(config, dotted: str, value) -> None:
    """``config.a.b = value`` for ``dotted = "a.b"``."""
    *parents, leaf = dotted.split(".")
    node = config
    for name in parents:
        node = node[name]
    node[leaf] = value


def run_config(name: str, quick: bool, seed: int):
    """The main job's config (or its ``quick`` variant) with run ``name``'s overrides."""
    config = load_config(f"{CONFIG}:seed={seed}" + (",quick" if quick else ""))
    for key, value in RUNS[name][1]:
        set_path(config, key, value)
    if quick:
        config.total_steps = 8
    return config


def train_run(config, every: int, final_eval: bool = True) -> tuple[list[dict], dict]:
    """Train ``config`` with the library's pieces, recording every ``every`` steps (and the
    first and last): ``(rows, final evaluation)`` (``{}`` without ``final_eval``)."""
    started = sweep.start_run(config)
    state, steps = started.state, started.steps
    weights = jax.jit(scale_invariant_weights)
    n_params = int(weights(state.params).size)
    rows = []
    for step in range(1, steps + 1):
        batch = next(started.stream)
        record = step % every == 0 or step in (1, steps)
        before = np.asarray(weights(state.params)) if record else None  # state is donated
        state, metrics = started.step_fn(state, batch)
        if record:
            after = np.asarray(weights(state.params))
            m = jax.device_get(metrics)
            lr, norm = float(m["learning_rate"]), float(np.linalg.norm(after))
            rows.append({"step": step, "learning_rate": lr, "loss": float(m["loss"]),
                         "top1": float(m["top1"]), "embedding_norm": float(m["embedding_norm"]),
                         "weight_norm": norm, "n_params": n_params,
                         "effective_lr": effective_lr(lr, n_params, norm),
                         "angular_step": angular_step(before, after)})
    return rows, evaluate(started.graphdef, state, config, started.mesh) if final_eval else {}


def summary_table(runs: dict[str, list[dict]], finals: dict[str, dict]) -> str:
    """One markdown row per run: ||z||, the logit scale and ||W|| at the first and last record;
    the measured and predicted angular steps averaged while the rate is above half its peak,
    and their ratio; the final accuracies."""
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


def logit_scale(row: dict) -> float:
    """The logit scale the loss sees: ``1 / tau`` for cosine logits, about ``||z||^2 / tau``
    (the mean norm squared) for dot-product logits (000 P10: the norm is a learned scale)."""
    norm = row["embedding_norm"] if row["normalize"] is False else 1.0
    return norm ** 2 / row["temperature"]


def plot(runs: dict[str, list[dict]]):
    """Six panels over steps: ||z||, the logit scale, ||W||, the learning rate, the measured
    vs predicted angular step, and their ratio."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5))
    (ax_z, ax_s, ax_w), (ax_lr, ax_a, ax_r) = axes
    for i, (name, rows) in enumerate(runs.items()):
        steps = [r["step"] for r in rows]
        style = {"color": f"C{i}", "label": RUNS[name][0]}
        ax_z.plot(steps, [r["embedding_norm"] for r in rows], **style)
        ax_s.plot(steps, [logit_scale(r) for r in rows], **style)
        ax_w.plot(steps, [r["weight_norm"] for r in rows], **style)
        ax_lr.plot(steps, [r["learning_rate"] for r in rows], **style)
        ax_a.plot(steps, [r["angular_step"] for r in rows], alpha=0.7, **style)
        ax_a.plot(steps, [r["effective_lr"] for r in rows], color=f"C{i}", ls="--")
        live = [r for r in rows if r["effective_lr"] > 0]
        ax_r.plot([r["step"] for r in live], [r["angular_step"] / r["effective_lr"]
                                              for r in live], **style)
    ax_z.set(yscale="log", ylabel="mean ‖z‖ before normalisation",
             title="embedding norm (000 P10)")
    ax_s.set(yscale="log", ylabel="1/tau (cosine), (mean ‖z‖)²/tau (dot)",
             title="logit scale the loss sees")
    ax_w.set(ylabel="‖W‖, kernels followed by BatchNorm", title="scale-invariant weights (000 P7)")
    ax_lr.set(ylabel="learning rate (AdamW)", title="schedule: warmup + cosine")
    ax_a.set(yscale="log", ylabel="angular step of W per step",
             title="measured (solid) vs lr·sqrt(n)/‖W‖ (dashed)")
    ax_r.set(ylabel="measured / (lr·sqrt(n)/‖W‖)",
             title="ratio: RMS of Adam's update orthogonal to W")
    for ax in axes.flat:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.legend(*ax_z.get_legend_handles_labels(), loc="upper center", ncol=4, fontsize=9,
               bbox_to_anchor=(0.5, 0.0))
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="quick config, 8 steps, no final evaluation (tests)")
    parser.add_argument("--every", type=int, default=5, help="record every N steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS / "norm_growth")
    args = parser.parse_args(argv)
    every = 1 if args.quick else args.every
    start = time.perf_counter()
    runs, finals, csv_rows = {}, {}, []
    for name in args.runs:
        config = run_config(name, args.quick, args.seed)
        rows, finals[name] = train_run(config, every, final_eval=not args.quick)
        setting = {"run": name, "normalize": bool(config.loss.get("normalize", True)),
                   "temperature": float(config.loss.temperature),
                   "weight_decay": float(config.optimizer.weight_decay)}
        runs[name] = [{**setting, **row} for row in rows]
        csv_rows += [{**row, **accuracies(finals[name])} for row in runs[name]]
        print(f"{name}: {len(rows)} records, probe / kNN {accuracy_cells(finals[name])} "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
    elapsed = time.perf_counter() - start
    body = f"""
`python experiments/norm_growth.py{' --quick' if args.quick else ''}`: `{CONFIG}` (seed
{args.seed}{', quick variant' if args.quick else ''}), AdamW (the main job's optimiser, lr
{load_config(CONFIG).optimizer.learning_rate:g} peak, warmup + cosine), recorded every {every}
steps; {elapsed:.0f} s in all.

- `‖z‖`: mean norm of the projections before normalisation (the trainer's
  `embedding_norm`).
- `‖W‖`: norm of the scale-invariant weights, every kernel followed by BatchNorm (the three
  conv kernels and the head's hidden kernel, n = {runs[args.runs[0]][0]['n_params']} numbers,
  concatenated).
- Effective learning rate: AdamW's update has about `lr` per coordinate whatever the gradient's
  size, so the predicted angular step is `lr·sqrt(n)/‖W‖` (000 P7's `lr/‖W‖²` is SGD's:
  there the gradient itself shrinks as `1/‖W‖`). The measured angular step is
  `‖W_t/‖W_t‖ - W_(t-1)/‖W_(t-1)‖‖` of one step. The table averages both while the rate is
  above half its peak; their ratio is about the RMS of the part of Adam's normalised update
  orthogonal to `W`.
- Logit scale: `1/tau` for cosine logits; for dot-product logits `z_i·z_j/tau` the norm is part
  of the scale, about `(mean ‖z‖)²/tau` (000 P10).

{summary_table(runs, finals)}
"""
    report(args.out, csv_rows, title="Norm growth and the effective learning rate (000 P7, P10)",
           body=body, figure=plot(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
