"""Patch dropout and low-resolution pre-training against plain CLIP at equal FLOPs.

    python experiments/cheaper_clip.py [--budget 800] [--seeds 0 1] [--quick]

On ``configs/clip_vit_canvas.py`` (digits pasted on 48 x 48 canvases, read at 32 x 32 by a ViT
of patch 4: 64 patches; digit_captions/canvas), every arm spends the FLOPs of ``--budget``
unmasked steps at 32 x 32 (the step's model FLOPs as the progress line counts them,
``model_flops.step_flops``), in one or two phases:

* ``unmasked``: patch_dropout 0 at 32 for the whole budget;
* ``p=0.5``, ``p=0.75``: FLIP's masking for the whole budget, so more steps and examples;
* ``p=0.5 + tuning``, ``p=0.75 + tuning``: masked for 90% of the budget, then 10% unmasked
  (a second run from the first's workdir, ``model.init_from``; FLIP's unmasked tuning);
* ``res=16 + tuning``: CLIPA's recipe: 16 x 16 images (16 patches) for 90%, then 10% at 32 x
  32 from its workdir (the position table resampled 4 x 4 -> 8 x 8).

A phase of ``f`` of the budget runs ``round(f * budget * flops(unmasked step) / flops(its
step))`` steps (warmup 10% of them, cosine decay; the tuning phase at learning rate
``TUNING_LR``), evaluated (zero-shot accuracy with the digit prompts, image-to-text Recall@1
by digit, on the 720 test canvases at 32 x 32, or at 16 for a phase at 16) ``EVALUATIONS`` times.
Writes ``experiments/results/cheaper_clip.{csv,md,png}``: every evaluation (arm, seed,
examples seen, FLOPs spent, accuracies), the final accuracies per arm (mean ± std over seeds)
and accuracy against examples seen and against FLOPs.
"""

from __future__ import annotations

import tempfile

import matplotlib.pyplot as plt

from common import reporting
from common.reporting import command, load_config, markdown_table, mean_std, report

CONFIG = "configs/clip_vit_canvas.py"
TUNING_FRACTION = 0.1
TUNING_LR = 3e-4
EVALUATIONS = 4  # per phase (the last one at its end)
# arm -> phases: (patch_dropout, image size, fraction of the budget)
ARMS = {
    "unmasked": ((0.0, 32, 1.0),),
    "p=0.5": ((0.5, 32, 1.0),),
    "p=0.5 + tuning": ((0.5, 32, 1 - TUNING_FRACTION), (0.0, 32, TUNING_FRACTION)),
    "p=0.75": ((0.75, 32, 1.0),),
    "p=0.75 + tuning": ((0.75, 32, 1 - TUNING_FRACTION), (0.0, 32, TUNING_FRACTION)),
    "res=16 + tuning": ((0.0, 16, 1 - TUNING_FRACTION), (0.0, 32, TUNING_FRACTION)),
}
QUICK_ARMS = ("unmasked", "p=0.5 + tuning", "res=16 + tuning")


def phase_config(rate: float, size: int, steps: int, seed: int, quick: bool):
    """The canvas config of one phase (its own warmup and schedule over ``steps``)."""
    variant = f"patch_dropout={rate},res={size},steps={steps},seed={seed}"
    config = load_config(f"{CONFIG}:{variant}" + (",quick" if quick else ""))
    config.total_steps = steps
    config.optimizer.warmup_steps = steps // 10
    config.evaluation.every = max(1, steps // EVALUATIONS)
    return config


def step_flops(config) -> float:
    """The model FLOPs of one step of ``config`` (the progress line's count, one device)."""
    import jax

    from contrastive_jax.mesh import make_mesh
    from contrastive_jax.plan import example_shapes
    from contrastive_jax.training.step import model_flops

    rows = config.data.batch_size
    shapes = {k: jax.ShapeDtypeStruct((rows, *shape), dtype)
              for k, (shape, dtype) in example_shapes(config).items()}
    mesh = make_mesh({"data": 1}, devices=jax.devices()[:1])
    return model_flops.step_flops(config, mesh, shapes, config.total_steps)


def phase_steps(budget: int, quick: bool) -> dict[tuple[float, int, float], tuple[int, float]]:
    """``{phase: (steps, FLOPs a step)}`` of every phase of :data:`ARMS` for a budget of
    ``budget`` unmasked 32 x 32 steps."""
    cost = {}
    for rate, size in {(r, s) for phases in ARMS.values() for r, s, _ in phases}:
        cost[rate, size] = step_flops(phase_config(rate, size, 100, 0, quick))
    unit = cost[0.0, 32]
    return {(r, s, f): (max(1, round(f * budget * unit / cost[r, s])), cost[r, s])
            for phases in ARMS.values() for r, s, f in phases}


def run_arm(arm: str, seed: int, steps: dict, quick: bool) -> list[dict]:
    """The arm's phases, one run each (a tuning phase from the previous one's workdir); a row
    per evaluation with the examples and FLOPs spent so far."""
    from contrastive_jax.training.train import train_and_evaluate

    rows, examples, flops, previous = [], 0, 0.0, None
    with tempfile.TemporaryDirectory() as root:
        for k, (rate, size, fraction) in enumerate(ARMS[arm]):
            count, per_step = steps[rate, size, fraction]
            config = phase_config(rate, size, count, seed, quick)
            if previous is not None:
                config.model.init_from = {"path": previous}
                config.optimizer.learning_rate = TUNING_LR
            workdir = f"{root}/phase{k}"
            result = train_and_evaluate(config, workdir)
            batch = config.data.batch_size
            for ev in result["evaluations"]:
                rows.append({"arm": arm, "seed": seed, "phase": k, "patch_dropout": rate,
                             "image_size": size, "step": ev["step"],
                             "examples": examples + ev["step"] * batch,
                             "pflop": (flops + ev["step"] * per_step) / 1e15,
                             "zero_shot": ev["zero_shot"], "image_to_text_r1": ev["x_to_y_r1"],
                             "train_s": ev["train_s"]})
            examples += count * batch
            flops += count * per_step
            previous = workdir
    return rows


def plot(rows: list[dict]) -> plt.Figure:
    """Zero-shot accuracy against examples seen and against FLOPs, one line per arm (the mean
    over seeds at each evaluation)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for arm in ARMS:
        mine = [r for r in rows if r["arm"] == arm]
        if not mine:
            continue
        points = sorted({(r["phase"], r["step"]) for r in mine})
        mean = [[r for r in mine if (r["phase"], r["step"]) == p] for p in points]
        for ax, key in zip(axes, ("examples", "pflop"), strict=True):
            ax.plot([m[0][key] for m in mean],
                    [sum(r["zero_shot"] for r in m) / len(m) for m in mean], marker=".",
                    label=arm)
    axes[0].set_xlabel("training examples seen")
    axes[1].set_xlabel("model PFLOP spent")
    axes[0].set_ylabel("zero-shot accuracy (test canvases, at the phase's size)")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = reporting.parser(__doc__, "cheaper_clip", quick="tiny runs of three arms (tests)",
                              seeds=(0, 1))
    parser.add_argument("--budget", type=int, default=800,
                        help="the FLOPs of this many unmasked 32 x 32 steps, every arm")
    args = parser.parse_args(argv)
    budget = 6 if args.quick else args.budget
    steps = phase_steps(budget, args.quick)
    arms = QUICK_ARMS if args.quick else tuple(ARMS)
    rows = []
    for seed in args.seeds:
        for arm in arms:
            rows += run_arm(arm, seed, steps, args.quick)
            print(f"{arm}, seed {seed}: {rows[-1]}", flush=True)
    final = {}
    for r in rows:  # the last evaluation of each (arm, seed)
        final[r["arm"], r["seed"]] = r
    table_rows = []
    for arm in arms:
        ends = [final[arm, s] for s in args.seeds]
        phases = " then ".join(f"p={rate:g} at {size} ({steps[rate, size, f][0]} steps)"
                               for rate, size, f in ARMS[arm])
        table_rows.append([arm, phases, f"{ends[0]['examples']:,}",
                           f"{ends[0]['pflop']:.3f}",
                           "{:.3f} ± {:.3f}".format(*mean_std(e["zero_shot"] for e in ends)),
                           "{:.3f} ± {:.3f}".format(*mean_std(e["image_to_text_r1"]
                                                              for e in ends))])
    table = markdown_table(["arm", "phases", "examples seen", "PFLOP", "zero-shot",
                            "image-to-text R@1"], table_rows)
    produced = (f"{command(__file__, argv)}: `{CONFIG}`, a budget of {budget} unmasked 32 x 32 "
                f"steps of batch {phase_config(0.0, 32, 100, 0, args.quick).data.batch_size} "
                f"per arm, seeds {', '.join(map(str, args.seeds))}; tuning phases "
                f"{TUNING_FRACTION:.0%} of the budget at learning rate {TUNING_LR:g}.")
    report(args.out, rows, title="Patch dropout and low resolution at equal FLOPs",
           produced=produced, tables=[table], figure=plot(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
