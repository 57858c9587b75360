"""InfoNCE as a mutual-information estimator: Poole et al. 2019's staircase on correlated Gaussians.

    python experiments/mi_bound.py [--out experiments/results/mi_bound] [--seed 0] [--quick]

Setup (Poole et al. 2019, Fig. 2). x ~ N(0, I_20), y = rho x + sqrt(1 - rho^2) eps, so
I(X; Y) = -(20 / 2) log(1 - rho^2) nats
(:mod:`contrastive_jax.training.data.correlated_gaussians`). One
training run per (critic, batch size N) steps the true MI through 2, 4, 6, 8, 10 nats, 4000 steps
per stage (a staircase; the critic and the Adam state carry over between stages), a fresh batch
of N pairs every step, Adam at 5e-4. The loss is one-directional InfoNCE (x -> y) on the (N, N)
score matrix ``S_ij = f(x_i, y_j)`` with the positives on the diagonal, ``L = info_nce(S,
arange(N))``, and the estimate is the bound of 002 A.12.5 (Theorem A.12.1, A.12.10)

    I(X; Y) >= log N - L_N(f),

``mi_lower_bound(L, N)``. Two caps follow (002 A.12.5, limits 1-2): since L >= 0 the estimate
never exceeds log N (log 64 = 4.16, log 512 = 6.24), so it saturates once I > log N; and the
bound holds for the expected loss, so a single batch's log N - L may exceed the true MI.

Critics (:mod:`contrastive_jax.training.models.critics`), as in Poole et al.:

* separable: ``S = g(x) h(y)^T``, two MLPs of 2 x 256 ReLU with 32-d outputs. We use Poole's
  plain dot product, not the cosine x learnable scale of ``configs/mi_gaussian.py``: it is the
  critic of the figure we reproduce, and it needs no scale parameter or cap, while the optimal
  critic, log p(y | x) / p(y) = rho x.y / (1 - rho^2) - rho^2 |y|^2 / (2 (1 - rho^2)) + c(x)
  (c(x) cancels in the row softmax), is exactly an inner product of lifted features, with logits
  that grow with I (cosine logits are bounded by the scale, capped at 100 in ``clip_loss``).
* concat: one MLP on [x_i, y_j] (2 x 256 ReLU, scalar), evaluated on all N x N pairs.

Cost per step on this machine (2 CPU cores shared with other jobs, data included; the run
measures and reports its own numbers): separable 1.2-1.8 ms at N = 64 and 11-13 ms at N = 512;
concat 34-40 ms at N = 64 and 3-4 s at N = 512 (N^2 evaluations of the 256 x 256 layer, 64 times
those at N = 64). The concat critic's full staircase at N = 512 (20,000 steps) would take about a
day, so it is not trained: the script only measures its step time (``--concat-batches`` chooses
where it trains). At N = 64 its 20,000 steps would take 11-13 minutes, more than the rest of the
run together, so by default it trains 2000 steps per stage (its estimate has levelled off well
before; ``--concat-steps-per-stage 4000`` gives the full protocol); the table and the figure say
so. The default run takes about 12 minutes with the machine shared (8 minutes of CPU time).

A reference line (:func:`optimal_estimates`): the optimal critic log p(y | x) / p(y)
(:func:`~contrastive_jax.training.data.correlated_gaussians.log_density_ratio`) on the same fresh
batches,
the best the bound can do at each N: what separates it from min(I, log N) is the bound's own gap,
what separates a trained critic from it is training.

Output (:func:`common.reporting.report`): ``OUT.csv`` one row per (critic, N, stage):
the EMA of the training estimate at the end of the stage, the estimate on 20 fresh batches after
the stage (mean, std, max; how many exceed the true MI) and the optimal critic's on the same
batches, how many training batches of the stage exceeded the true MI, the measured time per
step; ``OUT.md`` the table, the bound check and the timings; ``OUT.png`` estimate vs step, one
panel per (N, critic), with the true MI staircase, the log N ceiling and the optimal critic;
``OUT_trace.csv`` the training estimate and its EMA every ``--trace-every`` steps.
"""

# No ``from __future__ import annotations``: with string annotations ``dataclasses`` looks the
# module up in ``sys.modules``, which fails when a test loads this file with importlib.
import argparse
import dataclasses
import math
import pathlib
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from common.reporting import RESULTS, markdown_table, mean_std, report, write_csv
from contrastive_jax.losses import info_nce, mi_lower_bound
from contrastive_jax.training.data.correlated_gaussians import (
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
    """L_N = mean_i -log softmax(S_i)_i: x -> y InfoNCE, positives on the diagonal (A.12.9)."""
    return info_nce(scores, jnp.arange(scores.shape[0]))


def sample_batches(key: jax.Array, count: int, n: int, dim: int,
                   rho: float) -> tuple[jax.Array, jax.Array]:
    """``count`` independent batches ``(x, y)``, each (count, n, dim): fresh pairs every step."""
    return jax.vmap(lambda k: sample(k, n, dim, rho))(jax.random.split(key, count))


def make_functions(graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation,
                   n: int) -> tuple[Callable, Callable]:
    """``(train_chunk, evaluate)``, pure functions of the critic's parameters, to jit.

    ``train_chunk(params, opt_state, xs, ys)`` scans one Adam step per batch of ``xs, ys``
    ((T, n, dim) each) and returns the new parameters and state and the T training estimates
    ``log N - L`` (each on its batch, before that step's update). ``evaluate(params, xs, ys)``
    returns ``log N - L`` on each of the given batches, no update.
    """

    def loss_fn(params, x, y):
        return infonce_loss(nnx.merge(graphdef, params)(x, y))

    def step(carry, batch):
        params, opt_state = carry
        loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), mi_lower_bound(loss, n)

    def train_chunk(params, opt_state, xs, ys):
        (params, opt_state), estimates = jax.lax.scan(step, (params, opt_state), (xs, ys))
        return params, opt_state, estimates

    def evaluate(params, xs, ys):
        return jax.vmap(lambda x, y: mi_lower_bound(loss_fn(params, x, y), n))(xs, ys)

    return train_chunk, evaluate


def ema(values: np.ndarray, alpha: float = EMA_ALPHA) -> np.ndarray:
    """Bias-corrected exponential moving average: m_t = (1-a) m_{t-1} + a v_t, / (1-(1-a)^t)."""
    out = np.empty(len(values))
    acc = 0.0
    for t, v in enumerate(values):
        acc = (1.0 - alpha) * acc + alpha * float(v)
        out[t] = acc / (1.0 - (1.0 - alpha) ** (t + 1))
    return out


def chunk_size(steps: int, target: int) -> int:
    """The largest divisor of ``steps`` not above ``target`` (one compiled scan length)."""
    return max(c for c in range(1, min(steps, target) + 1) if steps % c == 0)


def data_keys(seed: int, n: int) -> tuple[jax.Array, jax.Array]:
    """(training, evaluation) keys for batch size ``n``: the same for every critic."""
    return tuple(jax.random.split(jax.random.fold_in(jax.random.key(seed), n)))


def fresh_batches(seed: int, n: int, stage: int, setup: Setup) -> tuple[jax.Array, jax.Array]:
    """The ``setup.eval_batches`` evaluation batches of ``stage`` at batch size ``n``."""
    rho = correlation_for(setup.mis[stage], setup.dim)
    key = jax.random.fold_in(data_keys(seed, n)[1], stage)
    return sample_batches(key, setup.eval_batches, n, setup.dim, rho)


def optimal_estimates(seed: int, n: int, setup: Setup) -> list[np.ndarray]:
    """Per stage, ``log N - L`` of the optimal critic log p(y|x)/p(y) on the fresh batches.

    The best the InfoNCE bound can do at this N (002 A.12.5, A.12.13), on the very batches the
    trained critics are evaluated on: the gap between it and min(I, log N) belongs to the bound,
    the gap between it and a trained critic to the training.
    """
    @jax.jit
    def estimate(xs, ys, rho):  # rho traced: one compilation for all stages
        return jax.vmap(lambda x, y: mi_lower_bound(
            infonce_loss(log_density_ratio(x, y, rho)), n))(xs, ys)

    return [np.asarray(estimate(*fresh_batches(seed, n, stage, setup),
                                jnp.float32(correlation_for(mi, setup.dim))))
            for stage, mi in enumerate(setup.mis)]


def run_staircase(kind: str, n: int, setup: Setup, seed: int,
                  log: Callable[[str], None] = print) -> Run:
    """Train one critic through all stages at batch ``n``; see the module docstring.

    Keys: the critic's initialisation from ``(seed, kind)``; the training batches from
    ``(seed, n, stage, chunk)``, the fresh evaluation batches from ``(seed, n, stage)`` (another
    stream, :func:`fresh_batches`), so both critics at one N see the same data (the training
    data only while their stages are equally long).
    """
    steps = setup.concat_steps_per_stage if kind == "concat" else setup.steps_per_stage
    chunk = chunk_size(steps, setup.chunk)
    critic = make_critic(kind, setup, seed * len(CRITICS) + CRITICS.index(kind))
    graphdef, params = nnx.split(critic)
    optimizer = optax.adam(setup.learning_rate)
    opt_state = optimizer.init(params)
    train_chunk, evaluate = make_functions(graphdef, optimizer, n)
    start = time.perf_counter()
    xs, ys = sample_batches(data_keys(seed, n)[0], chunk, n, setup.dim, 0.5)  # shapes only
    train_chunk = jax.jit(train_chunk).lower(params, opt_state, xs, ys).compile()
    evaluate = jax.jit(evaluate).lower(params, *fresh_batches(seed, n, 0, setup)).compile()
    compile_s = time.perf_counter() - start

    estimates, evals, train_s = [], [], 0.0
    total = steps * len(setup.mis)
    for stage, mi in enumerate(setup.mis):
        rho = correlation_for(mi, setup.dim)
        stage_key = jax.random.fold_in(data_keys(seed, n)[0], stage)
        for c in range(steps // chunk):
            tick = time.perf_counter()
            xs, ys = sample_batches(jax.random.fold_in(stage_key, c), chunk, n, setup.dim, rho)
            params, opt_state, est = train_chunk(params, opt_state, xs, ys)
            estimates.append(np.asarray(est))
            elapsed = time.perf_counter() - tick
            train_s += elapsed
            done = stage * steps + (c + 1) * chunk
            smooth = ema(np.concatenate(estimates))[-1]
            log(f"{kind:>9} N={n:<4} stage {stage + 1}/{len(setup.mis)} (I = {mi:g}, "
                f"log N = {math.log(n):.2f}) step {done:>6}/{total} | estimate {smooth:6.3f}"
                f" | {chunk / elapsed:8,.0f} steps/s")
        fresh = np.asarray(evaluate(params, *fresh_batches(seed, n, stage, setup)))
        mean, std = mean_std(fresh)
        log(f"{kind:>9} N={n:<4} stage {stage + 1} done: {setup.eval_batches} fresh batches "
            f"{mean:.3f} ± {std:.3f} (true {mi:g}, log N {math.log(n):.2f})")
        evals.append(fresh)
    return Run(kind, n, steps, np.concatenate(estimates), evals,
               1000.0 * train_s / total, compile_s, train_s)


def measure_step(kind: str, n: int, setup: Setup, seed: int, steps: int = 2) -> dict:
    """Compile the training scan for ``steps`` steps at batch ``n`` and time one call.

    For critic/N pairs too expensive to train: returns compile seconds, milliseconds per step
    (data included) and the projected time of the full staircase (``steps_per_stage`` steps per
    stage).
    """
    critic = make_critic(kind, setup, seed)
    graphdef, params = nnx.split(critic)
    optimizer = optax.adam(setup.learning_rate)
    opt_state = optimizer.init(params)
    train_chunk, _ = make_functions(graphdef, optimizer, n)
    key = jax.random.key(seed)
    rho = correlation_for(setup.mis[0], setup.dim)
    start = time.perf_counter()
    xs, ys = sample_batches(key, steps, n, setup.dim, rho)
    compiled = jax.jit(train_chunk).lower(params, opt_state, xs, ys).compile()
    compile_s = time.perf_counter() - start
    tick = time.perf_counter()
    xs, ys = sample_batches(jax.random.fold_in(key, 1), steps, n, setup.dim, rho)
    jax.block_until_ready(compiled(params, opt_state, xs, ys))
    ms = 1000.0 * (time.perf_counter() - tick) / steps
    full = setup.steps_per_stage * len(setup.mis)  # the full protocol
    return {"critic": kind, "batch": n, "ms_per_step": ms, "compile_s": compile_s,
            "projected_s": ms / 1000.0 * full, "steps": full}


def stage_rows(run: Run, setup: Setup, optimal: Sequence[np.ndarray]) -> list[dict]:
    """One CSV row per stage of ``run``; ``optimal`` from :func:`optimal_estimates`."""
    smooth = ema(run.estimates)
    rows = []
    for stage, target in enumerate(setup.mis):
        rho = correlation_for(target, setup.dim)
        mi = mutual_information(setup.dim, rho)  # of the distribution sampled (= target)
        end = (stage + 1) * run.steps_per_stage
        train = run.estimates[end - run.steps_per_stage:end]
        fresh = run.evals[stage]
        mean, std = mean_std(fresh)
        best, best_std = mean_std(optimal[stage])
        rows.append({
            "critic": run.critic, "batch": run.batch, "stage": stage + 1, "true_mi": mi,
            "rho": rho, "log_n": math.log(run.batch), "steps_per_stage": run.steps_per_stage,
            "train_ema": float(smooth[end - 1]), "eval_mean": mean, "eval_std": std,
            "eval_max": float(np.max(fresh)), "eval_batches": len(fresh),
            "eval_above_true": int(np.sum(fresh > mi)), "optimal_mean": best,
            "optimal_std": best_std, "train_above_true": int(np.sum(train > mi)),
            "train_max": float(np.max(train)), "ms_per_step": run.ms_per_step,
        })
    return rows


def bound_check(rows: Sequence[dict]) -> str:
    """What the rows say about 002 A.12.5: estimates below min(I, log N) in expectation."""
    below = [r for r in rows if r["eval_mean"] <= min(r["true_mi"], r["log_n"])]
    over_log_n = [r for r in rows if max(r["train_max"], r["eval_max"]) > r["log_n"]]
    eval_above = sum(r["eval_above_true"] for r in rows)
    eval_total = sum(r["eval_batches"] for r in rows)
    train_above = [r for r in rows if r["train_above_true"]]
    gap = max(r["eval_mean"] - min(r["true_mi"], r["log_n"]) for r in rows)
    optimal_gap = max(r["optimal_mean"] - min(r["true_mi"], r["log_n"]) for r in rows)
    behind = max(r["optimal_mean"] - r["eval_mean"] for r in rows)
    lines = [
        f"- Fresh-batch mean below min(I, log N) in {len(below)} of {len(rows)} stages "
        f"(largest mean minus min(I, log N): {gap:+.3f} nats). The optimal critic "
        f"log p(y|x)/p(y) on the same batches: largest mean minus min(I, log N) "
        f"{optimal_gap:+.3f} nats; the trained critics stay at most {behind:.3f} nats below it.",
        f"- No single batch, training or fresh, above log N: "
        f"{'holds' if not over_log_n else 'VIOLATED in ' + str(len(over_log_n)) + ' stages'}"
        " (L >= 0, so this is exact).",
        f"- Single fresh batches above the true MI: {eval_above} of {eval_total}; training "
        f"batches above it in {len(train_above)} of {len(rows)} stages"
        + (": " + ", ".join(f"{r['critic']} N={r['batch']} I={r['true_mi']:g}: "
                            f"{r['train_above_true']}/{r['steps_per_stage']}"
                            for r in train_above) if train_above else "")
        + " (the bound is on the expected loss, 002 A.12.5 limit 2).",
    ]
    return "\n".join(lines)


def figure(runs: Sequence[Run], skipped: Sequence[dict], setup: Setup, batches: Sequence[int],
           optimal: dict[int, list[np.ndarray]] | None = None):
    """Estimate vs step, one panel per (N, critic): raw, EMA, fresh-batch mean ± std, I, log N.

    ``optimal[N]``: per stage, the optimal critic's estimates (:func:`optimal_estimates`).
    """
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(batches), len(CRITICS), figsize=(6 * len(CRITICS),
                             3.6 * len(batches)), squeeze=False, sharey=True)
    low = min([0.0] + [float(r.estimates.min()) for r in runs]) - 0.2
    top = max(setup.mis) + 0.5
    for row, n in enumerate(batches):
        for col, kind in enumerate(CRITICS):
            ax = axes[row][col]
            ax.set_ylim(low, top)
            run = next((r for r in runs if (r.critic, r.batch) == (kind, n)), None)
            if run is None:
                cost = next((s for s in skipped if (s["critic"], s["batch"]) == (kind, n)), None)
                text = "not run" if cost is None else (
                    f"not run: {cost['ms_per_step']:,.0f} ms/step measured\n"
                    f"{cost['steps']:,} steps would take {duration(cost['projected_s'])}")
                ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
                ax.set_title(f"{kind} critic, N = {n}")
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
            means = [e.mean() for e in run.evals]
            stds = [e.std(ddof=1) if len(e) > 1 else 0.0 for e in run.evals]
            if optimal is not None:
                ax.stairs([o.mean() for o in optimal[n]], edges, baseline=None, color="C2",
                          lw=1.2, label="optimal critic (fresh batches)")
            ax.errorbar(edges[1:], means, yerr=stds, fmt="o", color="C1", ms=4, capsize=3,
                        label=f"{setup.eval_batches} fresh batches, mean ± std")
            ax.set_title(f"{kind} critic, N = {n}" + (
                f" ({run.steps_per_stage} steps per stage)"
                if run.steps_per_stage != setup.steps_per_stage else ""))
            ax.set_xlabel("training step")
            if col == 0:
                ax.set_ylabel("nats")
            ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("InfoNCE estimate log N - L vs the true MI (Poole et al. 2019 staircase)")
    fig.tight_layout()
    return fig


def markdown(rows: Sequence[dict], runs: Sequence[Run], skipped: Sequence[dict],
             setup: Setup, seed: int, wall_s: float) -> str:
    """The report's body: setup, results table, bound check, timings."""
    table = markdown_table(
        ["critic", "N", "true I", "log N", "steps/stage", "EMA train est.",
         f"fresh ({setup.eval_batches} batches) mean ± std", "optimal critic, same batches",
         "max single fresh", "fresh > I", "train batches > I"],
        [[r["critic"], r["batch"], f"{r['true_mi']:g}", f"{r['log_n']:.2f}",
          r["steps_per_stage"], f"{r['train_ema']:.3f}",
          f"{r['eval_mean']:.3f} ± {r['eval_std']:.3f}",
          f"{r['optimal_mean']:.3f} ± {r['optimal_std']:.3f}", f"{r['eval_max']:.3f}",
          f"{r['eval_above_true']}/{r['eval_batches']}",
          f"{r['train_above_true']}/{r['steps_per_stage']}"] for r in rows])
    timing = markdown_table(
        ["critic", "N", "steps", "ms/step", "train s", "compile s"],
        [[r.critic, r.batch, len(r.estimates), f"{r.ms_per_step:.2f}", f"{r.train_s:.1f}",
          f"{r.compile_s:.1f}"] for r in runs]
        + [[s["critic"], s["batch"], f"not run ({s['steps']:,} would take "
            f"{duration(s['projected_s'])})", f"{s['ms_per_step']:.0f}", "-",
            f"{s['compile_s']:.1f}"] for s in skipped])
    short = [f"{r.critic} at N = {r.batch}" for r in runs
             if r.steps_per_stage != setup.steps_per_stage]
    shortened = (f" ({', '.join(short)}: {setup.concat_steps_per_stage} steps per stage, to fit "
                 "the time budget)") if short else ""
    skipped_text = "".join(
        f" The {s['critic']} critic at N = {s['batch']} is not trained: "
        f"{s['ms_per_step']:,.0f} ms/step measured, {duration(s['projected_s'])} for "
        f"{s['steps']:,} steps." for s in skipped)
    setup_text = (
        f"x ~ N(0, I_{setup.dim}), y = rho x + sqrt(1 - rho^2) eps; the true MI steps through "
        f"{', '.join(f'{m:g}' for m in setup.mis)} nats, {setup.steps_per_stage} steps per "
        f"stage, in one run per (critic, N){shortened}; a fresh batch every step; Adam "
        f"{setup.learning_rate:g}. Critics {setup.depth} x {setup.hidden} ReLU: separable = plain "
        f"dot product of {setup.features}-d embeddings, concat = one MLP on [x, y] over all "
        "N x N pairs. Estimate: log N - L, one-directional InfoNCE x -> y (002 A.12.10). "
        f"\"EMA train est.\": exponential moving average (alpha = {EMA_ALPHA}) of the training "
        f"batches' estimates at the stage's last step; \"fresh\": {setup.eval_batches} new "
        f"batches after it; \"optimal critic\": the true log p(y|x)/p(y) as the critic on the "
        "same fresh batches, the best this bound can do at this N."
        f"{skipped_text} Seed {seed}; wall time {duration(wall_s)}.")
    return f"""
{setup_text}

{table}

Bound check (002 A.12.5: E[log N - L] <= I(X; Y), and log N - L <= log N always):

{bound_check(rows)}

Time per training step on this machine (2 CPU cores shared with other jobs; data included):

{timing}
"""


def duration(seconds: float) -> str:
    """``12 s``, ``3.4 min`` or ``5.6 h``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(RESULTS / "mi_bound"),
                        help="output path without suffix (writes .csv, .md, .png)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true",
                        help="tiny smoke test: 2 stages x 30 steps, 16-wide MLPs, N = 16, both "
                             "critics trained, nothing only measured")
    parser.add_argument("--batches", type=int, nargs="+", default=None,
                        help="batch sizes at which the separable critic trains (default 64 512)")
    parser.add_argument("--concat-batches", type=int, nargs="*", default=None,
                        help="batch sizes at which the concat critic trains (default 64)")
    parser.add_argument("--measure-batches", type=int, nargs="*", default=None,
                        help="batch sizes at which the concat critic's step time is only "
                             "measured (default: the --batches where it does not train)")
    parser.add_argument("--steps-per-stage", type=int, default=None)
    parser.add_argument("--concat-steps-per-stage", type=int, default=None)
    parser.add_argument("--trace-every", type=int, default=None,
                        help="steps between rows of OUT_trace.csv (default 100; quick 5)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    setup = QUICK if args.quick else Setup()
    if args.steps_per_stage is not None:
        setup = dataclasses.replace(setup, steps_per_stage=args.steps_per_stage)
    if args.concat_steps_per_stage is not None:
        setup = dataclasses.replace(setup, concat_steps_per_stage=args.concat_steps_per_stage)
    batches = args.batches or ([16] if args.quick else [64, 512])
    concat = args.concat_batches if args.concat_batches is not None else batches[:1]
    measure = args.measure_batches
    if measure is None:
        measure = [n for n in batches if n not in concat]
    trace_every = args.trace_every or (5 if args.quick else 100)
    start = time.perf_counter()

    runs, skipped = [], []
    for n in sorted(set(batches) | set(concat) | set(measure)):
        if n in batches:
            runs.append(run_staircase("separable", n, setup, args.seed))
        if n in concat:
            runs.append(run_staircase("concat", n, setup, args.seed))
        elif n in measure:
            cost = measure_step("concat", n, setup, args.seed)
            print(f"   concat N={n:<4} not trained: {cost['ms_per_step']:,.0f} ms/step measured, "
                  f"{cost['steps']:,} steps would take {duration(cost['projected_s'])}")
            skipped.append(cost)
    optimal = {n: optimal_estimates(args.seed, n, setup) for n in sorted({r.batch for r in runs})}
    wall_s = time.perf_counter() - start

    rows = [row for run in runs for row in stage_rows(run, setup, optimal[run.batch])]
    out = pathlib.Path(args.out)
    trace = [{"critic": r.critic, "batch": r.batch, "step": t + 1,
              "true_mi": setup.mis[t // r.steps_per_stage], "estimate": float(r.estimates[t]),
              "ema": float(e)}
             for r in runs for t, e in enumerate(ema(r.estimates)) if (t + 1) % trace_every == 0]
    out.parent.mkdir(parents=True, exist_ok=True)
    write_csv(out.with_name(out.name + "_trace.csv"), trace)
    report(out, rows, title="InfoNCE mutual-information bound on correlated Gaussians",
           body=markdown(rows, runs, skipped, setup, args.seed, wall_s),
           figure=figure(runs, skipped, setup, sorted({r.batch for r in runs}
                                                      | {s["batch"] for s in skipped}),
                         optimal))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
