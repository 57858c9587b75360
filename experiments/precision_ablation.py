"""Mixed precision on the main job: ``model.dtype`` float32 against bfloat16 (and remat).

    python experiments/precision_ablation.py [--config configs/simclr_mnist1d.py]
        [--seeds 0 1 2] [--remat] [--quick] [--out experiments/results/precision]

The main job (SimCLR on MNIST-1D, 20 epochs) as it ships, once with float32 compute (the
default) and once with ``model.dtype = "bfloat16"`` (bfloat16 matmuls, convolutions and
activations; float32 parameters, optimiser state, BatchNorm statistics and loss;
``contrastive_jax/training/models/precision.py``, [MixedPrecision] in docs/references.md);
with ``--remat`` also bfloat16 with ``model.remat = True``. Per run: linear probe, kNN, the
late-training loss and the training seconds. Writes ``OUT.csv`` (one row per run), ``OUT.md``
(mean ± std per setting, and the probe's difference to float32) and ``OUT.png``.

On a CPU bfloat16 is emulated (XLA widens it to float32 around each op), so its seconds here say
nothing about a TPU or GPU, where it runs natively at about twice float32's matmul rate and half
its activation bytes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from common import reporting, sweep
from common.reporting import command, load_config, markdown_table, pm, report, summarise

CONFIG = "configs/simclr_mnist1d.py"
METRICS = ("linear_probe", "knn")
COLUMNS = (*METRICS, "loss", "skipped_steps", "steps", "train_s")  # measured, per run
SETTING_KEYS = ("setting", "dtype", "remat")
FLOOR_POINTS = 1.5  # issue 17: bfloat16's probe within 1.5 points of float32's


@dataclasses.dataclass(frozen=True)
class Setting:
    """A compute dtype (``model.dtype``) and whether the repeated blocks are rematerialised."""

    dtype: str
    remat: bool = False

    @property
    def label(self) -> str:
        return self.dtype + (" + remat" if self.remat else "")


def settings(remat: bool = False) -> list[Setting]:
    """float32 and bfloat16; with ``remat`` also bfloat16 with ``model.remat = True``."""
    return [Setting("float32"), Setting("bfloat16")] + ([Setting("bfloat16", True)]
                                                        if remat else [])


def make_config(setting: Setting, seed: int, *, quick: bool = False, config_path: str = CONFIG):
    """The config at ``config_path`` (variants ``seed`` and ``quick``) as it ships, with
    ``model.dtype`` and ``model.remat`` of ``setting``."""
    config = load_config(f"{config_path}:seed={seed}" + (",quick" if quick else ""))
    config.model.dtype = setting.dtype
    config.model.remat = setting.remat
    config.log_every = sweep.LOG_EVERY
    return config


def row_from_result(result: Mapping[str, Any] | None) -> dict[str, Any]:
    """The measured columns of one :func:`common.sweep.run_one` result (loss: late-training
    mean); a run that raised ``NonFiniteError`` (None) or ended non-finite is ``diverged``."""
    if result is None:
        return {"status": "diverged", **dict.fromkeys(COLUMNS, math.nan)}
    m, ok = sweep.late_metrics(result)
    row = {"status": "ok" if ok else "diverged", "linear_probe": result["linear_probe"],
           "knn": result["knn"], "loss": m["loss"],
           "skipped_steps": int(result["final_train_metrics"]["skipped"]),
           "steps": result["steps"], "train_s": result["train_time_s"]}
    return row if ok else {**row, **dict.fromkeys(METRICS, math.nan)}


def results_table(summary: Sequence[Mapping[str, Any]]) -> str:
    """One row per setting: probe and kNN in % (mean ± std over seeds), the probe's difference
    to the float32 row in points, whether it is within the issue's 1.5-point floor, seconds."""
    header = ["setting", "seeds (diverged)", "linear probe %", "kNN %",
              "probe - float32 (points)", f"within {FLOOR_POINTS} points", "late loss",
              "train s"]
    base = next((s for s in summary if s["dtype"] == "float32" and not s["remat"]), None)
    rows = []
    for s in summary:
        delta = 100 * (s["linear_probe"] - base["linear_probe"]) if base else math.nan
        rows.append([s["setting"], f"{s['seeds']} ({s['diverged']})", pm(s, "linear_probe"),
                     pm(s, "knn"), f"{delta:+.1f}" if math.isfinite(delta) else "",
                     ("yes" if abs(delta) <= FLOOR_POINTS else "no")
                     if math.isfinite(delta) else "", pm(s, "loss", 1, 3),
                     pm(s, "train_s", 1, 1)])
    return markdown_table(header, rows)


def figure(summary: Sequence[Mapping[str, Any]]):
    """Probe and kNN per setting (mean ± std over seeds), and training seconds."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    labels = [s["setting"] for s in summary]
    x = range(len(summary))
    for offset, key, name in ((-0.2, "linear_probe", "linear probe"), (0.2, "knn", "kNN")):
        axes[0].bar([i + offset for i in x], [100 * s[key] for s in summary], width=0.4,
                    yerr=[100 * s[key + "_std"] for s in summary], capsize=3, label=name)
    low = min(100 * min(s["linear_probe"], s["knn"]) for s in summary)
    axes[0].set(xticks=list(x), ylabel="test accuracy % (mean ± std over seeds)",
                ylim=(max(0.0, low - 5) if math.isfinite(low) else 0.0, 100),
                title="frozen encoder")
    axes[0].set_xticklabels(labels)
    axes[0].legend(fontsize=8)
    axes[1].bar(list(x), [s["train_s"] for s in summary],
                yerr=[s["train_s_std"] for s in summary], capsize=3, color="C2")
    axes[1].set(xticks=list(x), ylabel="seconds", title="training time (CPU: bf16 emulated)")
    axes[1].set_xticklabels(labels)
    fig.suptitle("SimCLR on MNIST-1D: float32 vs bfloat16 compute")
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = reporting.parser(__doc__, "precision", config=CONFIG, seeds=(0, 1, 2),
                              quick="the config's quick variant, one seed (tests)")
    parser.add_argument("--remat", action="store_true",
                        help="also run bfloat16 with model.remat = True")
    parser.add_argument("--verbose", action="store_true", help="show the trainer's own lines")
    args = parser.parse_args(argv)
    seeds = args.seeds[:1] if args.quick else args.seeds
    grid = settings(args.remat)
    rows = []
    for seed in seeds:  # seed-major: a partial run still compares the dtypes
        for setting in grid:
            config = make_config(setting, seed, quick=args.quick, config_path=args.config)
            result = sweep.run_one(config, keys=("loss",), verbose=args.verbose)
            rows.append({"setting": setting.label, "dtype": setting.dtype,
                         "remat": setting.remat, "seed": seed, **row_from_result(result)})
            print(f"{setting.label}, seed {seed}: {rows[-1]['status']}, probe "
                  f"{rows[-1]['linear_probe']:.4f}, {rows[-1]['train_s']:.1f} s", flush=True)
    length = "the quick variant" if args.quick else "the config as it ships"
    produced = (
        f"{command(__file__, argv)}: `{args.config}`, {len(grid)} settings × seeds "
        f"{', '.join(map(str, seeds))} = {len(rows)} runs of {length} ({rows[0]['steps']} steps "
        f"of batch {config.data.batch_size}); mean ± std over the seeds that did not diverge; "
        f"late loss: mean over the last {sweep.TAIL_FRACTION:.0%} of the steps; seconds on a "
        "CPU, where bfloat16 is emulated.")
    summary = summarise(rows, SETTING_KEYS, (*METRICS, "loss", "train_s"))
    report(args.out, rows, title="Mixed precision (SimCLR, MNIST-1D)", produced=produced,
           tables=[results_table(summary)], figure=figure(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
