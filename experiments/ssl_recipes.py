"""SimCLR and MoCo v2 at CPU size: linear-probe and kNN accuracy against steps on the generated
``shapes`` task, beside a supervised and a random-encoder baseline.

    python experiments/ssl_recipes.py [--steps 600] [--moco_steps 1200] [--every 150]
        [--runs simclr moco_v2 simclr_no_colour supervised] [--quick]
        [--out experiments/results/ssl_recipes]

The task: ``shapes`` (:mod:`contrastive_jax.training.data.datasets.shapes`), 32 x 32 RGB images
of ten shapes whose colours are drawn independently of the class. Every run starts from the same
seed-0 initialisation of the same ResNet (the templates' ``small`` encoder, 16-32-64):

- ``simclr``: ``configs/simclr_resnet50_imagenet.py:small,steps=S`` (LARS, NT-Xent at tau 0.1,
  SimCLR's augmentations at 32 px);
- ``moco_v2``: ``configs/moco_v2_resnet50_imagenet.py:small,steps=M`` (SGD, queue 4,096,
  m = 0.99, MoCo v2's augmentations; ``M = 2 S`` by default: a MoCo step back-propagates
  through one view, SimCLR's through two, so the two runs cost about the same);
- ``simclr_no_colour``: ``simclr`` without colour jitter and grayscale (crop, flip and blur only;
  [SimCLR] §3, Figure 5);
- ``supervised`` (:func:`train_supervised`): the same encoder and a linear classifier trained
  with cross-entropy on the labels, on the first of the SimCLR data block's two host crops of
  each example with a random horizontal flip: SGD with Nesterov momentum 0.9 at
  0.1 x batch / 256, linear warm-up over 10% of the steps then cosine decay, weight decay 1e-4
  on the kernels, batch 256, S steps;
- ``random``: the untrained encoder (step 0).

Each is scored every E steps and at the end by the trainer's classification evaluator (the
linear probe, L-BFGS logistic regression with its L2 strength chosen on held-out training
features, and the weighted 20-NN at T = 0.07, both on the encoder's pooled features h of
``shapes`` train, scored on test; docs/evaluation.md); the supervised run also by its own
classifier; the contrastive runs' last logged pretext top-1 (the positive ranked first among
the candidates) is kept beside. Writes ``OUT.csv`` and ``OUT.json`` (one row per run and
evaluation), ``OUT.md`` (the tables) and ``OUT.png`` (both accuracies against steps).
``--quick``: tiny sizes (256 training and 64 test images, batch 16, 4 steps, a 8-16 ResNet),
for the tests.
"""

from __future__ import annotations

import json
import pathlib
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt

from common import reporting
from common.reporting import command, load_config, markdown_table, report

CONFIGS = {"simclr": "configs/simclr_resnet50_imagenet.py",
           "moco_v2": "configs/moco_v2_resnet50_imagenet.py"}
RUNS = ("simclr", "moco_v2", "simclr_no_colour", "supervised")
LABELS = {"simclr": "SimCLR", "moco_v2": "MoCo v2", "simclr_no_colour":
          "SimCLR without colour jitter/grayscale", "supervised": "supervised (same encoder)",
          "random": "random encoder"}
SUPERVISED = {"learning_rate": 0.1, "momentum": 0.9, "weight_decay": 1e-4,
              "warmup_fraction": 0.1}  # lr = 0.1 x batch / 256
COLUMNS = ("method", "step", "train_s", "linear_probe", "knn", "classifier")


def make_config(run: str, steps: int, every: int, *, quick: bool = False):
    """The config of ``run`` (``random`` and ``supervised``: SimCLR's, whose data block and
    encoder they use): the template's ``small`` variant for ``steps`` steps, evaluated every
    ``every`` steps by the classification evaluator only; ``quick``: tiny sizes."""
    base = "moco_v2" if run == "moco_v2" else "simclr"
    config = load_config(f"{CONFIGS[base]}:small,steps={steps}")
    config.evaluation.every = every
    config.evaluation.evaluators = ("classification",)
    if run == "simclr_no_colour":  # crop, flip, blur ([SimCLR] §3, Figure 5)
        config.augment.jitter_p = 0.0
        config.augment.grayscale = 0.0
    if quick:
        config.data.update({"train_split": "train[:256]", "eval_split": "test[:64]",
                            "batch_size": 16, "eval_batch_size": 64})
        config.model.encoder.widths = (8, 16)
        config.model.head.update({"hidden": 16, "out": 8})
        config.optimizer.warmup_steps = 1
        config.evaluation.l2_grid = (1e-4,)
        if base == "moco_v2":
            config.moco.queue_size = 32
        else:
            config.loss.block_size = 4
    return config


def evaluated(result: dict[str, Any], method: str) -> list[dict[str, Any]]:
    """The rows of a trainer run's evaluations (periodic and final)."""
    return [{"method": method, "step": ev["step"], "train_s": ev["train_s"],
             "linear_probe": ev["linear_probe"], "knn": ev["knn"], "classifier": None}
            for ev in result["evaluations"]]


def train_ssl(run: str, steps: int, every: int,
              quick: bool) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Train ``run`` (SimCLR, MoCo v2 and their ablations) with the trainer; its rows and its
    last logged step's pretext metrics (``loss``, ``top1``: the first anchors' positive ranked
    first among the candidates: SimCLR's 2N - 1, MoCo's key and queue)."""
    from contrastive_jax.training.train import train_and_evaluate

    with tempfile.TemporaryDirectory() as workdir:
        result = train_and_evaluate(make_config(run, steps, every, quick=quick), workdir)
    if "stopped_at" in result:  # SIGTERM/SIGINT: the trainer checkpointed and returned
        raise SystemExit(f"{run}: interrupted by a signal at step {result['stopped_at']}")
    last = result["final_train_metrics"]
    return evaluated(result, run), {"loss": last["loss"], "top1": last["top1"]}


def classification(graphdef, state, config, mesh) -> dict[str, float]:
    """The trainer's classification evaluator (linear probe, kNN) on ``state``'s encoder."""
    from contrastive_jax.training.evaluation.evaluators import EVALUATORS, evaluate

    return evaluate(graphdef, state, config, mesh, (EVALUATORS["classification"],))


def random_encoder(steps: int, quick: bool) -> list[dict[str, Any]]:
    """The untrained encoder (the runs' common initialisation), scored as the runs are."""
    from common.sweep import start_run

    config = make_config("random", steps, 0, quick=quick)
    started = start_run(config)
    scores = classification(started.graphdef, started.state, config, started.mesh)
    return [{"method": "random", "step": 0, "train_s": 0.0, "linear_probe":
             scores["linear_probe"], "knn": scores["knn"], "classifier": None}]


def train_supervised(steps: int, every: int, quick: bool) -> list[dict[str, Any]]:
    """The supervised baseline (module docstring): the SimCLR config's encoder and training
    stream (view 1 of each example's two crops, flipped with probability 1/2 on the device),
    a linear classifier ``logits = h W + b`` (W ~ N(0, 0.01^2), b = 0), cross-entropy, SGD;
    every ``every`` steps and at the end the encoder is put back into the SimCLR model and
    scored by :func:`classification`, and the classifier by its test accuracy."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from common.sweep import start_run
    from contrastive_jax.training.augmentations.pixels import unit_range
    from contrastive_jax.training.evaluation.run_evaluation import extract_features

    config = make_config("supervised", steps, every, quick=quick)
    started = start_run(config)
    model = nnx.merge(started.graphdef, started.state.params, started.state.rest)
    encoder_def, encoder_params, rest = nnx.split(model.encoder, nnx.Param, ...)
    classes = 10
    params = {"encoder": encoder_params, "b": jnp.zeros((classes,)),
              "w": 0.01 * jax.random.normal(jax.random.key(1), (model.encoder.features, classes))}
    batch = config.data.batch_size
    warmup = max(1, round(SUPERVISED["warmup_fraction"] * steps))
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, SUPERVISED["learning_rate"] * batch / 256, warmup, max(steps, warmup + 1))
    tx = optax.chain(
        optax.add_decayed_weights(SUPERVISED["weight_decay"],
                                  mask=lambda p: jax.tree.map(lambda a: a.ndim > 1, p)),
        optax.sgd(schedule, momentum=SUPERVISED["momentum"], nesterov=True))
    # on the run's mesh, replicated, as the state is (else the second step compiles again)
    params, rest, opt_state = jax.device_put((params, rest, tx.init(params)),
                                             NamedSharding(started.mesh, P()))

    @jax.jit
    def step_fn(params, rest, opt_state, images, labels, key):
        x = unit_range(images[:, 0])  # (B, S, S, 3) in [0, 1]: the first host crop
        flip = jax.random.bernoulli(key, 0.5, (x.shape[0], 1, 1, 1))
        x = jnp.where(flip, x[:, :, ::-1], x)

        def loss_fn(p):
            encoder = nnx.merge(encoder_def, p["encoder"], rest, copy=True)
            logits = encoder(x, train=True) @ p["w"] + p["b"]
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
            return loss, nnx.split(encoder, nnx.Param, ...)[2]

        (loss, new_rest), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new_rest, opt_state, loss

    def scores(step: int, train_s: float) -> dict[str, Any]:
        nnx.update(model.encoder, params["encoder"], rest)
        _, model_params, model_rest = nnx.split(model, nnx.Param, ...)
        state = started.state.replace(params=model_params, rest=model_rest)
        probes = classification(started.graphdef, state, config, started.mesh)
        features, labels = extract_features(started.graphdef, state, config, started.mesh,
                                            config.data.eval_split)
        logits = features @ np.asarray(params["w"]) + np.asarray(params["b"])
        return {"method": "supervised", "step": step, "train_s": round(train_s, 2),
                "linear_probe": probes["linear_probe"], "knn": probes["knn"],
                "classifier": float(np.mean(np.argmax(logits, 1) == labels))}

    rows, key, train_s, start = [], jax.random.key(config.seed), 0.0, None
    for step in range(1, steps + 1):
        data = next(started.stream)
        params, rest, opt_state, loss = step_fn(params, rest, opt_state, data["image"],
                                                data["label"], jax.random.fold_in(key, step))
        if step == 1:  # the compiling step is not training time, as in the trainer
            jax.block_until_ready(loss)
            start = time.perf_counter()
        if step % every == 0 or step == steps:
            jax.block_until_ready(loss)
            train_s += time.perf_counter() - start
            if not np.isfinite(float(loss)):
                raise FloatingPointError(f"supervised baseline: loss {float(loss)} at step {step}")
            rows.append(scores(step, train_s))
            start = time.perf_counter()
    return rows


def plot(rows: Sequence[dict[str, Any]]) -> plt.Figure:
    """Linear probe and kNN against steps, one line per method; the random encoder and chance
    as horizontal lines."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    methods = [m for m in (*RUNS, "random") if any(r["method"] == m for r in rows)]
    for ax, metric in zip(axes, ("linear_probe", "knn"), strict=True):
        for method in methods:
            mine = [r for r in rows if r["method"] == method]
            if method == "random":
                ax.axhline(mine[0][metric], color="grey", ls="--", lw=1.2, label=LABELS[method])
                continue
            ax.plot([r["step"] for r in mine], [r[metric] for r in mine], marker="o",
                    label=LABELS[method])
        ax.axhline(0.1, color="black", ls=":", lw=0.8, label="chance (10 classes)")
        ax.set_xlabel("training step")
        ax.set_title({"linear_probe": "linear probe (test accuracy)",
                      "knn": "kNN, k = 20 (test accuracy)"}[metric])
        ax.grid(alpha=0.3)
        ax.set_ylim(0, 1)
    axes[0].set_ylabel("shapes test accuracy")
    axes[0].legend(fontsize=8)
    return fig


def tables(rows: Sequence[dict[str, Any]],
           pretext: dict[str, dict[str, float]]) -> list[str]:
    """The final accuracies per method (and the last step's pretext top-1 of the contrastive
    runs), then every evaluation."""
    final = {}
    for row in rows:
        final[row["method"]] = row  # the last evaluation of each method

    def cell(value) -> str:
        return "–" if value is None else f"{value:.4f}"

    summary = markdown_table(
        ["method", "steps", "linear probe", "kNN", "own classifier", "pretext top-1", "train s"],
        [[LABELS[m], r["step"], cell(r["linear_probe"]), cell(r["knn"]), cell(r["classifier"]),
          cell(pretext[m]["top1"] if m in pretext else None), f"{r['train_s']:.0f}"]
         for m, r in final.items()])
    every = markdown_table(
        ["method", "step", "train s", "linear probe", "kNN", "own classifier"],
        [[r["method"], r["step"], f"{r['train_s']:.1f}", cell(r["linear_probe"]),
          cell(r["knn"]), cell(r["classifier"])] for r in rows])
    return ["## Final accuracy\n" + summary, "## Every evaluation\n" + every]


def main(argv: list[str] | None = None) -> int:
    parser = reporting.parser(__doc__, "ssl_recipes",
                              quick="tiny sizes (256/64 images, batch 16, 4 steps), the tests'")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--moco_steps", type=int, default=None,
                        help="MoCo v2's steps (default: twice --steps, about SimCLR's compute: "
                             "a MoCo step encodes one view with gradients, SimCLR's two)")
    parser.add_argument("--every", type=int, default=150)
    parser.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS))
    args = parser.parse_args(argv)
    steps, every = (4, 2) if args.quick else (args.steps, args.every)
    moco_steps = steps if args.quick else args.moco_steps or 2 * steps
    rows, pretext = random_encoder(steps, args.quick), {}
    for run in args.runs:
        started = time.perf_counter()
        if run == "supervised":
            rows += train_supervised(steps, every, args.quick)
        else:
            mine, pretext[run] = train_ssl(run, moco_steps if run == "moco_v2" else steps,
                                           every, args.quick)
            rows += mine
        print(f"{run}: {time.perf_counter() - started:.0f} s", flush=True)
    out = pathlib.Path(args.out)
    sizes = "256 / 64 (quick)" if args.quick else "20,000 / 2,000"
    batch = make_config("simclr", steps, every, quick=args.quick).data.batch_size
    produced = (
        f"{command(__file__, argv)}: `shapes` (32 x 32 RGB, 10 shapes, colours drawn "
        "independently of the class, so that two crops of an image can be matched by colour "
        f"unless colour jitter and grayscale hide it; {sizes} train / test images), {steps} "
        f"steps of batch {batch} ({moco_steps} for MoCo v2, whose step costs about half of "
        f"SimCLR's), evaluation every {every} steps: linear probe and weighted "
        "20-NN on the encoder's features; SimCLR and MoCo v2 = the templates' `small` "
        "variants, supervised = the same encoder + a linear classifier on one crop + flip, "
        "random = the untrained encoder.")
    record = reporting.provenance()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(
        {"provenance": record, "command": command(__file__, argv).strip("`"), "steps": steps,
         "moco_steps": moco_steps, "every": every, "quick": args.quick,
         "columns": list(COLUMNS), "rows": rows, "pretext": pretext},
        indent=1) + "\n")
    report(out, rows, title="SimCLR and MoCo v2 on shapes: accuracy against steps",
           produced=produced, tables=tables(rows, pretext), figure=plot(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
