"""Temperature and L2-normalisation ablation of SimCLR on MNIST-1D ([SimCLR] Table 5's grid).

    python experiments/temperature_ablation.py [--config configs/simclr_mnist1d.py]
        [--seeds 0 1 2] [--epochs 5] [--quick] [--out experiments/results/temperature_ablation]

The main job at tau in {0.05, 0.1, 0.2, 0.5, 1} or with a learned log-temperature (initialised
at 0.2, docs/derivations.md §7.6), each with NT-Xent's cosine logits (docs/derivations.md §9.1)
and with dot-product logits ``z_i.z_j / tau`` (docs/derivations.md §9.5, §12.4; also tau 10
and 100, [SimCLR] Table 5's "no l2 norm" rows). Per run: probe, kNN, and late-training means
of the contrastive top-1, loss, ``log N - L`` and embedding norm (:mod:`common.sweep`). Writes
``OUT.csv`` (one row per run), ``OUT.md`` (mean ± std per setting) and ``OUT.png``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from common import reporting, sweep
from common.reporting import command, load_config, markdown_table, pm, report, summarise
from common.sweep import warmup_steps

CONFIG = "configs/simclr_mnist1d.py"
FIXED_TAUS = (0.05, 0.1, 0.2, 0.5, 1.0)
NO_NORM_EXTRA_TAUS = (10.0, 100.0)  # [SimCLR] Table 5's "no l2 norm" temperatures
LEARNED_INIT = 0.2  # the main job's tau, where the learned log-temperature starts
METRICS = ("linear_probe", "knn", "contrastive_top1")
TAIL_KEYS = ("top1", "loss", "mi_bound", "embedding_norm")
SETTING_KEYS = ("setting", "normalize", "learned", "temperature")  # a row's setting columns
SUMMARY_METRICS = (*METRICS, "final_temperature", "embedding_norm")  # mean ± std per setting
COLUMNS = (*METRICS, "final_temperature", "embedding_norm", "mi_bound", "loss", "skipped_steps",
           "steps", "train_s")  # measured, per run
# [SimCLR] Table 5 (ResNet-50, 100 epochs, batch 4096): (l2 norm, tau) -> (probe %, contrastive %)
SIMCLR_TABLE5 = {(True, 0.05): (59.7, 90.5), (True, 0.1): (64.4, 87.8),
                 (True, 0.5): (60.7, 68.2), (True, 1.0): (58.0, 59.1),
                 (False, 10.0): (57.2, 91.7), (False, 100.0): (57.0, 92.1)}


@dataclasses.dataclass(frozen=True)
class Setting:
    """One point of the grid: L2 normalisation on/off, tau (fixed, or the learned one's init)."""

    normalize: bool
    temperature: float
    learned: bool = False

    @property
    def label(self) -> str:
        t = f"{self.temperature:g}"
        tau = f"learned (init {t})" if self.learned else f"tau={t}"
        return f"{'l2' if self.normalize else 'no l2'}, {tau}"


def grid(quick: bool = False) -> list[Setting]:
    """Fixed taus and the learned tau, with and without L2 normalisation (without it also tau 10
    and 100). ``quick``: only the setting furthest from the main job (no l2, learned tau)."""
    if quick:
        return [Setting(False, LEARNED_INIT, learned=True)]
    settings = []
    for normalize in (True, False):
        taus = FIXED_TAUS + (() if normalize else NO_NORM_EXTRA_TAUS)
        settings += [Setting(normalize, tau) for tau in taus]
        settings.append(Setting(normalize, LEARNED_INIT, learned=True))
    return settings


def make_config(setting: Setting, seed: int, *, epochs: float, quick: bool = False,
                config_path: str = CONFIG):
    """The main job's config for ``setting``: any config with the variants ``seed``,
    ``temperature``, ``learn_temperature``, ``epochs`` and ``quick`` and an ``nt_xent`` loss.
    Dot-product logits (``normalize=False``) exist only in ``impl="autodiff"``."""
    variant = f"seed={seed},temperature={setting.temperature!r}"
    variant += ",learn_temperature=True" if setting.learned else ""
    variant += ",quick" if quick else f",epochs={epochs!r}"
    config = load_config(f"{config_path}:{variant}")
    if not setting.normalize:
        config.loss.normalize = False
        config.loss.impl = "autodiff"
    if not quick:
        from contrastive_jax.training.run_spec import total_steps

        config.optimizer.warmup_steps = warmup_steps(total_steps(config, sweep.train_size(config)))
    config.log_every = sweep.LOG_EVERY
    return config


def row_from_result(result: Mapping[str, Any] | None) -> dict[str, Any]:
    """The measured columns of one :func:`common.sweep.run_one` result: late-training means
    (the last step's temperature and skipped steps); a run that raised ``NonFiniteError``
    (None) or ended non-finite is ``diverged``, its accuracies NaN."""
    if result is None:
        return {"status": "diverged", **dict.fromkeys(COLUMNS, math.nan)}
    m, ok = sweep.late_metrics(result)
    last = result["final_train_metrics"]
    row = {"status": "ok" if ok else "diverged", "linear_probe": result["linear_probe"],
           "knn": result["knn"], "contrastive_top1": m["top1"],
           "final_temperature": last["temperature"], "embedding_norm": m["embedding_norm"],
           "mi_bound": m["mi_bound"], "loss": m["loss"], "skipped_steps": int(last["skipped"]),
           "steps": result["steps"], "train_s": result["train_time_s"]}
    return row if ok else {**row, **dict.fromkeys(METRICS, math.nan)}


def effective_scale(entry: Mapping[str, Any]) -> float:
    """The logits' scale at the final tau: ``1 / tau`` for cosines; about ``norm^2 / tau``
    for ``z_i.z_j / tau`` with ``norm`` the mean embedding norm (docs/derivations.md §12.4)."""
    tau = entry["final_temperature"]
    return 1.0 / tau if entry["normalize"] else entry["embedding_norm"] ** 2 / tau


def results_table(summary: Sequence[Mapping[str, Any]]) -> str:
    """One row per setting, accuracies in % as mean ± std over seeds, [SimCLR] Table 5's row."""
    header = ["setting", "seeds (diverged)", "linear probe %", "kNN %", "contrastive top-1 %",
              "final tau", "embedding norm", "logit scale", "SimCLR T5 probe / contr. %"]
    rows = []
    for s in summary:
        ref = None if s["learned"] else SIMCLR_TABLE5.get((s["normalize"], s["temperature"]))
        rows.append([s["setting"], f"{s['seeds']} ({s['diverged']})", pm(s, "linear_probe"),
                     pm(s, "knn"), pm(s, "contrastive_top1"), pm(s, "final_temperature", 1, 3),
                     pm(s, "embedding_norm", 1, 2),
                     f"{effective_scale(s):.1f}" if s["seeds"] > s["diverged"] else "",
                     f"{ref[0]} / {ref[1]}" if ref else ""])
    return markdown_table(header, rows)


def figure(summary: Sequence[Mapping[str, Any]]):
    """Probe, kNN and contrastive top-1 against tau (log scale), one line per normalisation;
    the learned tau is a star at its final value; diverged settings are red crosses at 0."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    titles = ("linear probe", "kNN (k=20)", "contrastive top-1 (late training)")
    styles = {True: ("C0", "L2-normalised: cos / tau"), False: ("C1", "no L2 norm: dot / tau")}
    taus = sorted({s["temperature"] for s in summary if not s["learned"]})
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, key, title in zip(axes, METRICS, titles, strict=True):
        for normalize, (color, name) in styles.items():
            mine = sorted((s for s in summary if s["normalize"] == normalize),
                          key=lambda s: s["temperature"])
            for learned, x, style in (
                    (False, "temperature", {"marker": "o", "label": name}),
                    (True, "final_temperature", {"marker": "*", "markersize": 14, "ls": "none",
                                                 "label": f"{name}, learned tau"})):
                done = [s for s in mine if s["learned"] == learned and math.isfinite(s[key])]
                if done:
                    ax.errorbar([s[x] for s in done], [s[key] for s in done], capsize=3,
                                yerr=[s[key + "_std"] for s in done], color=color, **style)
            lost = [s["temperature"] for s in mine if not math.isfinite(s[key])]
            if lost:
                ax.scatter(lost, [0.0] * len(lost), color="red", marker="x", s=60, zorder=3,
                           label=f"{name}: diverged")
        ax.set_xscale("log")
        ax.set_xticks(taus, [f"{t:g}" for t in taus])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set(xlabel="temperature tau (fixed; learned: final value)", title=title)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("accuracy (mean ± std over seeds)")
    axes[0].legend(fontsize=7)
    fig.suptitle("SimCLR on MNIST-1D: temperature and L2 normalisation (cf. SimCLR Table 5)")
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = reporting.parser(__doc__, "temperature_ablation", config=CONFIG, seeds=(0, 1, 2),
                              quick="the config's quick variant, one setting, one seed (tests)")
    parser.add_argument("--epochs", type=float, default=5.0,
                        help="training epochs per run (the main job: 20)")
    parser.add_argument("--verbose", action="store_true", help="show the trainer's own lines")
    args = parser.parse_args(argv)
    seeds = args.seeds[:1] if args.quick else args.seeds
    settings = grid(args.quick)
    rows = []
    for setting in settings:
        for seed in seeds:
            config = make_config(setting, seed, epochs=args.epochs, quick=args.quick,
                                 config_path=args.config)
            result = sweep.run_one(config, keys=TAIL_KEYS, verbose=args.verbose)
            rows.append({"setting": setting.label, "normalize": setting.normalize,
                         "learned": setting.learned, "temperature": setting.temperature,
                         "seed": seed, **row_from_result(result)})
            print(f"{setting.label}, seed {seed}: {rows[-1]['status']}, probe "
                  f"{rows[-1]['linear_probe']:.4f}", flush=True)
    length = "the quick variant" if args.quick else f"{args.epochs:g} epochs"
    produced = (
        f"{command(__file__, argv)}: `{args.config}`, {len(settings)} settings × seeds "
        f"{', '.join(map(str, seeds))} = {len(rows)} runs of {length} ({rows[0]['steps']} steps "
        f"of batch {config.data.batch_size}, warmup {config.optimizer.warmup_steps}); mean ± std "
        f"over the seeds that did not diverge; top-1, norm: late-training means "
        f"({sweep.TAIL_FRACTION:.0%} of the steps, logged every {sweep.LOG_EVERY}).")
    summary = summarise(rows, SETTING_KEYS, SUMMARY_METRICS)
    report(args.out, rows, title="Temperature and L2 normalisation (SimCLR, MNIST-1D)",
           produced=produced, tables=[results_table(summary)], figure=figure(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
