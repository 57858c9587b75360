"""InfoNCE as a mutual-information estimator: [Poole] Fig. 2's staircase on correlated Gaussians.

    python experiments/mi_bound.py [--out experiments/results/mi_bound] [--seed 0] [--quick]

x ~ N(0, I_20), y = rho x + sqrt(1 - rho^2) eps, I(X; Y) = -(20 / 2) log(1 - rho^2) nats
(:mod:`contrastive_jax.training.data.datasets.correlated_gaussians`). One run per (critic,
batch size N) steps the true MI through 2, 4, 6, 8, 10 nats, 4000 steps per stage (critic and
Adam state carried over), a fresh batch every step. The estimate is ``log N - L`` of InfoNCE
x -> y on the scores ``S_ij = f(x_i, y_j)`` (``mi_lower_bound``, docs/derivations.md §15.1):
never above log N, below I in expectation (docs/derivations.md §15.3). Critics ([Poole],
:mod:`contrastive_jax.training.models.critics`): ``separable`` (dot product of two MLPs) and
``concat`` (one MLP on every pair [x_i, y_j]; by default trained at the first N only, 2000 steps
per stage, and only timed at the others); the optimal critic log p(y|x) / p(y) on the same
fresh batches is the best the bound can do (docs/derivations.md §15.4).

Writes ``OUT.csv`` (one row per critic, N and stage), ``OUT.md``, ``OUT.png`` (estimate vs
step per N and critic) and ``OUT_trace.csv`` (the training estimate every ``--trace-every``
steps).
"""

# No ``from __future__ import annotations``: with string annotations ``dataclasses`` looks the
# module up in ``sys.modules``, which fails when a test loads this file with importlib.
import dataclasses
import math
import pathlib
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from common import reporting
from common.reporting import command, markdown_table, mean_std, report, write_csv
from contrastive_jax.losses import info_nce, mi_lower_bound
from contrastive_jax.training.data.datasets.correlated_gaussians import (
    correlation_for,
    log_density_ratio,
    mutual_information,
    sample,
)
from contrastive_jax.training.models.critics import ConcatCritic, SeparableCritic

CRITICS = ("separable", "concat")
EMA_ALPHA = 0.01  # smoothing of the per-step training estimate (about 100 steps)


@dataclasses.dataclass(frozen=True)
class Setup:
    """Everything a staircase run depends on except the critic, N and the seed."""

    dim: int = 20
    mis: tuple[float, ...] = (2.0, 4.0, 6.0, 8.0, 10.0)
    steps_per_stage: int = 4000
    concat_steps_per_stage: int = 2000
    learning_rate: float = 5e-4
    hidden: int = 256
    depth: int = 2
    features: int = 32
    eval_batches: int = 20
    chunk: int = 1000  # steps per compiled scan (and per progress line)


# The smoke test: 2 stages x 30 steps, 16-wide MLPs, a larger step so that something is learnt.
QUICK = Setup(mis=(2.0, 4.0), steps_per_stage=30, concat_steps_per_stage=30, learning_rate=5e-3,
              hidden=16, features=8, eval_batches=15, chunk=15)  # one batch shape


@dataclasses.dataclass
class Run:
    """One staircase: per-step training estimates, per-stage fresh-batch estimates, timings."""

    critic: str
    batch: int
    steps_per_stage: int
    estimates: np.ndarray  # (stages * steps_per_stage,) log N - L on each training batch
    evals: list[np.ndarray]  # per stage, (eval_batches,) log N - L on fresh batches
    ms_per_step: float
    compile_s: float
    train_s: float


def make_critic(kind: str, setup: Setup, seed: int) -> nnx.Module:
    """A fresh critic (:mod:`contrastive_jax.training.models.critics`) of the given kind."""
    rngs = nnx.Rngs(seed)
    if kind == "separable":
        return SeparableCritic(in_x=setup.dim, in_y=setup.dim, hidden=setup.hidden,
                               depth=setup.depth, features=setup.features, rngs=rngs)
    if kind == "concat":
        return ConcatCritic(in_x=setup.dim, in_y=setup.dim, hidden=setup.hidden,
                            depth=setup.depth, rngs=rngs)
    raise ValueError(f"unknown critic {kind!r}; valid: {CRITICS}")


def infonce_loss(scores: jax.Array) -> jax.Array:
    """x -> y InfoNCE, positives on the diagonal (docs/derivations.md §15.1)."""
    return info_nce(scores, jnp.arange(scores.shape[0]))


def sample_batches(key: jax.Array, count: int, n: int, dim: int,
                   rho: float) -> tuple[jax.Array, jax.Array]:
    """``count`` independent batches ``(x, y)``, each (count, n, dim): fresh pairs every step."""
    return jax.vmap(lambda k: sample(k, n, dim, rho))(jax.random.split(key, count))


def compile_critic(kind: str, n: int, setup: Setup, seed: int):
    """``(params, opt_state, train, evaluate)`` for a fresh critic at batch ``n``, jitted.

    ``train(params, opt_state, xs, ys)`` scans one Adam step per batch of ``xs, ys`` ((T, n,
    dim) each) and returns the new parameters and state and each batch's ``log N - L``
    (before that step's update); ``evaluate(params, xs, ys)``: ``log N - L`` on each batch.
    """
    graphdef, params = nnx.split(make_critic(kind, setup, seed))
    optimizer = optax.adam(setup.learning_rate)

    def loss_fn(params, x, y):
        return infonce_loss(nnx.merge(graphdef, params)(x, y))

    def step(carry, batch):
        params, opt_state = carry
        loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), mi_lower_bound(loss, n)

    def train(params, opt_state, xs, ys):
        (params, opt_state), estimates = jax.lax.scan(step, (params, opt_state), (xs, ys))
        return params, opt_state, estimates

    def evaluate(params, xs, ys):
        return jax.vmap(lambda x, y: mi_lower_bound(loss_fn(params, x, y), n))(xs, ys)

    return params, optimizer.init(params), jax.jit(train), jax.jit(evaluate)


def ema(values: np.ndarray, alpha: float = EMA_ALPHA) -> np.ndarray:
    """Bias-corrected exponential moving average: m_t = (1-a) m_{t-1} + a v_t, / (1-(1-a)^t)."""
    out, acc = np.empty(len(values)), 0.0
    for t, v in enumerate(values):
        acc = (1.0 - alpha) * acc + alpha * float(v)
        out[t] = acc / (1.0 - (1.0 - alpha) ** (t + 1))
    return out


def chunk_size(steps: int, target: int) -> int:
    """The largest divisor of ``steps`` not above ``target`` (one compiled scan length)."""
    return max(c for c in range(1, min(steps, target) + 1) if steps % c == 0)


def data_key(seed: int, n: int, stage: int, evaluation: bool = False) -> jax.Array:
    """The key of a stage's training (or evaluation) batches at batch size ``n``: the same for
    every critic."""
    keys = jax.random.split(jax.random.fold_in(jax.random.key(seed), n))
    return jax.random.fold_in(keys[int(evaluation)], stage)


def fresh_batches(seed: int, n: int, stage: int, setup: Setup) -> tuple[jax.Array, jax.Array]:
    """The ``setup.eval_batches`` evaluation batches of ``stage`` at batch size ``n``."""
    rho = correlation_for(setup.mis[stage], setup.dim)
    return sample_batches(data_key(seed, n, stage, True), setup.eval_batches, n, setup.dim, rho)


def optimal_estimates(seed: int, n: int, setup: Setup) -> list[np.ndarray]:
    """Per stage, ``log N - L`` of the optimal critic log p(y|x)/p(y) on the fresh batches
    (docs/derivations.md §15.2, §15.4)."""
    @jax.jit
    def estimate(xs, ys, rho):  # rho traced: one compilation for all stages
        return jax.vmap(lambda x, y: mi_lower_bound(
            infonce_loss(log_density_ratio(x, y, rho)), n))(xs, ys)

    return [np.asarray(estimate(*fresh_batches(seed, n, stage, setup),
                                jnp.float32(correlation_for(mi, setup.dim))))
            for stage, mi in enumerate(setup.mis)]


def run_staircase(kind: str, n: int, setup: Setup, seed: int) -> Run:
    """Train one critic through all stages at batch ``n``: the critic's initialisation from
    ``(seed, kind)``, the batches from :func:`data_key` (chunk ``c`` of a stage folded in)."""
    steps = setup.concat_steps_per_stage if kind == "concat" else setup.steps_per_stage
    chunk = chunk_size(steps, setup.chunk)
    start = time.perf_counter()
    params, opt_state, train, evaluate = compile_critic(
        kind, n, setup, seed * len(CRITICS) + CRITICS.index(kind))
    xs, ys = sample_batches(data_key(seed, n, 0), chunk, n, setup.dim, 0.5)  # shapes only
    train = train.lower(params, opt_state, xs, ys).compile()
    evaluate = evaluate.lower(params, *fresh_batches(seed, n, 0, setup)).compile()
    compile_s, train_s, estimates, evals = time.perf_counter() - start, 0.0, [], []
    for stage, mi in enumerate(setup.mis):
        rho = correlation_for(mi, setup.dim)
        for c in range(steps // chunk):
            tick = time.perf_counter()
            key = jax.random.fold_in(data_key(seed, n, stage), c)
            params, opt_state, est = train(params, opt_state,
                                           *sample_batches(key, chunk, n, setup.dim, rho))
            estimates.append(np.asarray(est))
            train_s += time.perf_counter() - tick
        evals.append(np.asarray(evaluate(params, *fresh_batches(seed, n, stage, setup))))
        print(f"{kind} N={n} I={mi:g}: fresh batches {evals[-1].mean():.3f} "
              f"(log N {math.log(n):.2f})", flush=True)
    total = steps * len(setup.mis)
    return Run(kind, n, steps, np.concatenate(estimates), evals, 1000.0 * train_s / total,
               compile_s, train_s)


def measure_step(kind: str, n: int, setup: Setup, seed: int, steps: int = 2) -> dict:
    """Compile the training scan for ``steps`` steps at batch ``n`` and time one call (a
    critic too costly to train): ms per step (data included) and the full staircase's time."""
    rho = correlation_for(setup.mis[0], setup.dim)
    start = time.perf_counter()
    params, opt_state, train, _ = compile_critic(kind, n, setup, seed)
    xs, ys = sample_batches(jax.random.key(seed), steps, n, setup.dim, rho)
    train = train.lower(params, opt_state, xs, ys).compile()
    compile_s, tick = time.perf_counter() - start, time.perf_counter()
    xs, ys = sample_batches(jax.random.fold_in(jax.random.key(seed), 1), steps, n, setup.dim, rho)
    jax.block_until_ready(train(params, opt_state, xs, ys))
    ms = 1000.0 * (time.perf_counter() - tick) / steps
    full = setup.steps_per_stage * len(setup.mis)
    return {"critic": kind, "batch": n, "ms_per_step": ms, "compile_s": compile_s,
            "projected_s": ms / 1000.0 * full, "steps": full}


def stage_rows(run: Run, setup: Setup, optimal: Sequence[np.ndarray]) -> list[dict]:
    """One CSV row per stage of ``run``; ``optimal`` from :func:`optimal_estimates`."""
    smooth, rows = ema(run.estimates), []
    for stage, target in enumerate(setup.mis):
        rho = correlation_for(target, setup.dim)
        mi = mutual_information(setup.dim, rho)  # of the distribution sampled (= target)
        end = (stage + 1) * run.steps_per_stage
        train, fresh = run.estimates[end - run.steps_per_stage:end], run.evals[stage]
        (mean, std), (best, best_std) = mean_std(fresh), mean_std(optimal[stage])
        rows.append({
            "critic": run.critic, "batch": run.batch, "stage": stage + 1, "true_mi": mi,
            "rho": rho, "log_n": math.log(run.batch), "steps_per_stage": run.steps_per_stage,
            "train_ema": float(smooth[end - 1]), "eval_mean": mean, "eval_std": std,
            "eval_max": float(np.max(fresh)), "eval_batches": len(fresh),
            "eval_above_true": int(np.sum(fresh > mi)), "optimal_mean": best,
            "optimal_std": best_std, "train_above_true": int(np.sum(train > mi)),
            "train_max": float(np.max(train)), "ms_per_step": run.ms_per_step})
    return rows


def trace_rows(runs: Sequence[Run], setup: Setup, every: int) -> list[dict]:
    """Every ``every``-th step of each run: the training batch's estimate and its EMA."""
    return [{"critic": r.critic, "batch": r.batch, "step": t + 1,
             "true_mi": setup.mis[t // r.steps_per_stage], "estimate": float(r.estimates[t]),
             "ema": float(e)}
            for r in runs for t, e in enumerate(ema(r.estimates)) if (t + 1) % every == 0]


def bound_summary(rows: Sequence[dict]) -> dict:
    """The rows against docs/derivations.md §15.3 (``E[log N - L] <= min(I, log N)``; every
    batch ``<= log N``): counts and the largest gaps, in nats."""
    gap = [r["eval_mean"] - min(r["true_mi"], r["log_n"]) for r in rows]
    optimal_gap = [r["optimal_mean"] - min(r["true_mi"], r["log_n"]) for r in rows]
    return {
        "stages": len(rows), "mean_below_cap": sum(g <= 0 for g in gap),
        "max_mean_minus_cap": max(gap), "max_optimal_minus_cap": max(optimal_gap),
        "max_optimal_minus_mean": max(r["optimal_mean"] - r["eval_mean"] for r in rows),
        "stages_above_log_n": sum(max(r["train_max"], r["eval_max"]) > r["log_n"]
                                  for r in rows),
        "fresh_above_true": sum(r["eval_above_true"] for r in rows),
        "fresh_batches": sum(r["eval_batches"] for r in rows),
        "stages_train_above_true": sum(r["train_above_true"] > 0 for r in rows)}


def tables(rows: Sequence[dict], runs: Sequence[Run], skipped: Sequence[dict],
           eval_batches: int) -> list[str]:
    """The markdown tables: per stage, the bound check, the time per step."""
    stages = markdown_table(
        ["critic", "N", "true I", "log N", "steps/stage", "EMA train est.",
         f"fresh ({eval_batches} batches) mean ± std", "optimal critic, same batches",
         "max single fresh", "fresh > I", "train batches > I"],
        [[r["critic"], r["batch"], f"{r['true_mi']:g}", f"{r['log_n']:.2f}",
          r["steps_per_stage"], f"{r['train_ema']:.3f}",
          f"{r['eval_mean']:.3f} ± {r['eval_std']:.3f}",
          f"{r['optimal_mean']:.3f} ± {r['optimal_std']:.3f}", f"{r['eval_max']:.3f}",
          f"{r['eval_above_true']}/{r['eval_batches']}",
          f"{r['train_above_true']}/{r['steps_per_stage']}"] for r in rows])
    b = bound_summary(rows)
    check = markdown_table(["bound check (docs/derivations.md §15.3)", "value"], [
        ["stages with fresh mean <= min(I, log N)", f"{b['mean_below_cap']} of {b['stages']}"],
        ["largest fresh mean - min(I, log N)", f"{b['max_mean_minus_cap']:+.3f} nats"],
        ["largest optimal-critic mean - min(I, log N)", f"{b['max_optimal_minus_cap']:+.3f} nats"],
        ["largest optimal-critic mean - fresh mean", f"{b['max_optimal_minus_mean']:.3f} nats"],
        ["stages with a single batch above log N", f"{b['stages_above_log_n']} of {b['stages']}"],
        ["single fresh batches above I", f"{b['fresh_above_true']} of {b['fresh_batches']}"],
        ["stages with training batches above I",
         f"{b['stages_train_above_true']} of {b['stages']}"]])
    timing = markdown_table(
        ["critic", "N", "steps", "ms/step", "train s", "compile s"],
        [[r.critic, r.batch, len(r.estimates), f"{r.ms_per_step:.2f}", f"{r.train_s:.1f}",
          f"{r.compile_s:.1f}"] for r in runs]
        + [[s["critic"], s["batch"], f"not run ({s['steps']:,} would take "
            f"{duration(s['projected_s'])})", f"{s['ms_per_step']:.0f}", "-",
            f"{s['compile_s']:.1f}"] for s in skipped])
    return [stages, check, timing]


def figure(runs: Sequence[Run], skipped: Sequence[dict], setup: Setup,
           optimal: dict[int, list[np.ndarray]]):
    """Estimate vs step, one panel per (N, critic): raw, EMA, fresh-batch mean ± std, the
    optimal critic, I and log N; a critic only timed says so."""
    import matplotlib.pyplot as plt

    batches = sorted({r.batch for r in runs} | {s["batch"] for s in skipped})
    fig, axes = plt.subplots(len(batches), len(CRITICS), figsize=(6 * len(CRITICS),
                             3.6 * len(batches)), squeeze=False, sharey=True)
    low = min([0.0] + [float(r.estimates.min()) for r in runs]) - 0.2
    for (row, n), (col, kind) in ((a, b) for a in enumerate(batches) for b in enumerate(CRITICS)):
        ax = axes[row][col]
        ax.set(ylim=(low, max(setup.mis) + 0.5), title=f"{kind} critic, N = {n}")
        run = next((r for r in runs if (r.critic, r.batch) == (kind, n)), None)
        if run is None:
            cost = next((s for s in skipped if (s["critic"], s["batch"]) == (kind, n)), None)
            ax.text(0.5, 0.5, "not run" if cost is None else (
                f"not run: {cost['ms_per_step']:,.0f} ms/step measured\n"
                f"{cost['steps']:,} steps would take {duration(cost['projected_s'])}"),
                ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            continue
        steps = np.arange(1, len(run.estimates) + 1)
        edges = np.arange(len(setup.mis) + 1) * run.steps_per_stage
        ax.plot(steps, run.estimates, color="C0", alpha=0.15, lw=0.5,
                label="log N - L (training batch)")
        ax.plot(steps, ema(run.estimates), color="C0", lw=1.5, label="EMA")
        ax.stairs(setup.mis, edges, baseline=None, color="k", ls="--", lw=1.2,
                  label="true I(X; Y)")
        ax.axhline(math.log(n), color="C3", ls=":", lw=1.2, label=f"log N = {math.log(n):.2f}")
        ax.stairs([o.mean() for o in optimal[n]], edges, baseline=None, color="C2", lw=1.2,
                  label="optimal critic (fresh batches)")
        ax.errorbar(edges[1:], [e.mean() for e in run.evals], fmt="o", color="C1", ms=4,
                    yerr=[e.std(ddof=1) if len(e) > 1 else 0.0 for e in run.evals], capsize=3,
                    label=f"{setup.eval_batches} fresh batches, mean ± std")
        if run.steps_per_stage != setup.steps_per_stage:
            ax.set_title(f"{kind} critic, N = {n} ({run.steps_per_stage} steps per stage)")
        ax.set(xlabel="training step", ylabel="nats" if col == 0 else "")
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("InfoNCE estimate log N - L vs the true MI (Poole et al. 2019 staircase)")
    fig.tight_layout()
    return fig


def duration(seconds: float) -> str:
    """``12 s``, ``3.4 min`` or ``5.6 h``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def main(argv: Sequence[str] | None = None) -> int:
    parser = reporting.parser(__doc__, "mi_bound", quick="tiny smoke test: 2 stages x 30 "
                              "steps, 16-wide MLPs, N = 16, both critics trained")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batches", type=int, nargs="+", default=None,
                        help="batch sizes at which the separable critic trains (default 64 512)")
    parser.add_argument("--concat-batches", type=int, nargs="*", default=None,
                        help="batch sizes at which the concat critic trains (default: the first)")
    parser.add_argument("--measure-batches", type=int, nargs="*", default=None,
                        help="batch sizes at which the concat critic's step is only timed "
                             "(default: the --batches where it does not train)")
    parser.add_argument("--steps-per-stage", type=int, default=None)
    parser.add_argument("--concat-steps-per-stage", type=int, default=None)
    parser.add_argument("--trace-every", type=int, default=None,
                        help="steps between rows of OUT_trace.csv (default 100; quick 5)")
    args = parser.parse_args(argv)
    setup = QUICK if args.quick else Setup()
    if args.steps_per_stage is not None:
        setup = dataclasses.replace(setup, steps_per_stage=args.steps_per_stage)
    if args.concat_steps_per_stage is not None:
        setup = dataclasses.replace(setup, concat_steps_per_stage=args.concat_steps_per_stage)
    batches = args.batches or ([16] if args.quick else [64, 512])
    concat = batches[:1] if args.concat_batches is None else args.concat_batches
    measure = args.measure_batches
    if measure is None:
        measure = [n for n in batches if n not in concat]
    runs, skipped = [], []
    for n in sorted(set(batches) | set(concat) | set(measure)):
        if n in batches:
            runs.append(run_staircase("separable", n, setup, args.seed))
        if n in concat:
            runs.append(run_staircase("concat", n, setup, args.seed))
        elif n in measure:
            skipped.append(measure_step("concat", n, setup, args.seed))
    optimal = {n: optimal_estimates(args.seed, n, setup) for n in {r.batch for r in runs}}
    rows = [row for run in runs for row in stage_rows(run, setup, optimal[run.batch])]
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    every = args.trace_every or (5 if args.quick else 100)
    write_csv(out.with_name(out.name + "_trace.csv"), trace_rows(runs, setup, every))
    concat_steps = (f" (concat: {setup.concat_steps_per_stage})"
                    if setup.concat_steps_per_stage != setup.steps_per_stage else "")
    produced = (
        f"{command(__file__, argv)}: seed {args.seed}; x ~ N(0, I_{setup.dim}), true MI "
        f"{', '.join(f'{m:g}' for m in setup.mis)} nats, {setup.steps_per_stage} steps per "
        f"stage{concat_steps}, Adam {setup.learning_rate:g}; critics {setup.depth} x "
        f"{setup.hidden} ReLU (separable: {setup.features}-d dot product); EMA alpha "
        f"{EMA_ALPHA}; {setup.eval_batches} fresh batches after each stage; time per step "
        "includes the data.")
    report(out, rows, title="InfoNCE mutual-information bound on correlated Gaussians",
           produced=produced, tables=tables(rows, runs, skipped, setup.eval_batches),
           figure=figure(runs, skipped, setup, optimal))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
