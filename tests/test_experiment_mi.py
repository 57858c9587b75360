"""The InfoNCE MI-bound experiment (experiments/mi_bound.py) and its critics (models/critics.py).

The bound checked is docs/derivations.md §15.1: log N - L_N <= I(X; Y) in expectation, and
log N - L <= log N for every batch (L >= 0).
"""

import importlib.util
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from common.reporting import csv_provenance, read_csv, read_report
from contrastive_jax.losses import info_nce
from contrastive_jax.training.data.datasets.correlated_gaussians import (
    correlation_for,
    log_density_ratio,
    sample,
)
from contrastive_jax.training.models.critics import ConcatCritic, SeparableCritic

ROOT = pathlib.Path(__file__).resolve().parents[1]


def normal(shape):
    return np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)


def load_script():
    spec = importlib.util.spec_from_file_location("mi_bound", ROOT / "experiments" / "mi_bound.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_concat_critic_scores_every_pair_like_the_mlp_on_the_concatenation():
    critic = ConcatCritic(in_x=5, in_y=3, hidden=16, depth=2, rngs=nnx.Rngs(0))
    x, y = normal((4, 5)), normal((6, 3))
    scores = critic(x, y)
    assert scores.shape == (4, 6) and scores.dtype == jnp.float32
    # S_ij = MLP([x_i, y_j]), the MLP applied literally to each of the 24 concatenated pairs
    xi, yj = np.repeat(x, 6, axis=0), np.tile(y, (4, 1))
    pairwise = critic.pairs(xi, yj).reshape(4, 6)
    np.testing.assert_allclose(scores, pairwise, rtol=1e-5, atol=1e-6)
    # ... and by hand: relu(W [x; y] + b) -> relu(W2 h + b2) -> w3 h + b3
    w = [(np.asarray(layer.kernel[...]), np.asarray(layer.bias[...]))
         for layer in (critic.first, critic.layers[0], critic.out)]
    h = np.maximum(np.concatenate([x[2], y[5]]) @ w[0][0] + w[0][1], 0)
    h = np.maximum(h @ w[1][0] + w[1][1], 0)
    by_hand = h @ w[2][0][:, 0] + w[2][1][0]
    np.testing.assert_allclose(scores[2, 5], by_hand, rtol=1e-5, atol=1e-6)
    assert len(set(np.round(np.asarray(scores).ravel(), 5))) == 24  # not constant
    with pytest.raises(ValueError, match="expects"):
        critic(y, x)
    with pytest.raises(ValueError, match="as many"):
        critic.pairs(x, y[:3])


def test_separable_critic_is_a_dot_product_of_two_mlps():
    critic = SeparableCritic(in_x=5, in_y=3, hidden=8, depth=2, features=4, rngs=nnx.Rngs(0))
    x, y = normal((4, 5)), normal((6, 3))
    scores = critic(x, y)
    assert scores.shape == (4, 6)
    gx, hy = critic.g(x, train=False), critic.h(y, train=False)
    assert gx.shape == (4, 4) and hy.shape == (6, 4)
    np.testing.assert_allclose(scores, np.asarray(gx) @ np.asarray(hy).T, rtol=1e-5, atol=1e-6)


def test_optimal_critic_is_the_log_density_ratio():
    # S_ij = log p(y_j | x_i) / p(y_j); under the joint its mean is I(X; Y) (a KL divergence),
    # and InfoNCE with it stays below min(I, log N) (docs/derivations.md §15.3-15.4)
    dim, mi, n = 4, 1.0, 256
    rho = correlation_for(mi, dim)
    x, y = sample(jax.random.key(0), n, dim, rho)
    scores = log_density_ratio(x, y, rho)
    assert scores.shape == (n, n)
    xn, yn = np.asarray(x, np.float64), np.asarray(y, np.float64)
    s = 1 - rho**2
    by_hand = (-0.5 * dim * math.log(s) - np.sum((yn[7] - rho * xn[3]) ** 2) / (2 * s)
               + 0.5 * np.sum(yn[7] ** 2))
    assert float(scores[3, 7]) == pytest.approx(by_hand, rel=1e-5, abs=1e-5)
    assert float(jnp.mean(jnp.diag(scores))) == pytest.approx(mi, abs=0.15)  # 256 samples
    estimate = math.log(n) - float(info_nce(scores, jnp.arange(n)))
    assert 0.6 < estimate < mi


def test_mi_bound_quick_writes_a_table_below_the_bounds(tmp_path):
    script = load_script()
    out = tmp_path / "mi"
    assert script.main(["--quick", "--out", str(out)]) == 0
    rows = read_csv(out.with_suffix(".csv"))
    assert [(r["critic"], r["batch"], r["stage"]) for r in rows] == [
        ("separable", "16", "1"), ("separable", "16", "2"),
        ("concat", "16", "1"), ("concat", "16", "2")]
    for row in rows:
        true_mi, log_n = float(row["true_mi"]), float(row["log_n"])
        mean, top = float(row["eval_mean"]), float(row["eval_max"])
        assert true_mi == pytest.approx({"1": 2.0, "2": 4.0}[row["stage"]])
        assert log_n == pytest.approx(math.log(16))
        assert all(math.isfinite(float(row[k])) for k in
                   ("train_ema", "eval_mean", "eval_std", "train_max", "ms_per_step"))
        # derivations §15.3: below log N always, below the true MI in expectation (30 steps: far
        # below)
        assert mean < min(true_mi, log_n) and top < log_n and float(row["train_max"]) < log_n
        assert int(row["eval_batches"]) == 15 and int(row["steps_per_stage"]) == 30
    # the critics learn: every critic's estimate rises from stage 1 to stage 2
    for kind in ("separable", "concat"):
        first, second = (float(r["eval_mean"]) for r in rows if r["critic"] == kind)
        assert second > first + 0.1
    _, produced, (stages, check, timing) = read_report(out.with_suffix(".md"))
    assert "true MI 2, 4 nats, 30 steps per stage" in produced
    assert [(r["critic"], r["N"], r["true I"], r["log N"]) for r in stages] == [
        (r["critic"], "16", f"{float(r['true_mi']):g}", "2.77") for r in rows]
    assert [r["fresh > I"] for r in stages] == [f"{r['eval_above_true']}/15" for r in rows]
    check = {r["bound check (docs/derivations.md §15.3)"]: r["value"] for r in check}
    assert check["stages with fresh mean <= min(I, log N)"] == "4 of 4"
    assert check["stages with a single batch above log N"] == "0 of 4"
    assert float(check["largest fresh mean - min(I, log N)"].split()[0]) < 0
    assert [(r["critic"], r["steps"]) for r in timing] == [("separable", "60"), ("concat", "60")]
    for row in rows:  # the optimal critic on the same batches: the bound's own gap only
        assert float(row["eval_mean"]) < float(row["optimal_mean"]) < min(
            float(row["true_mi"]), float(row["log_n"]))
    assert out.with_suffix(".png").stat().st_size > 10_000
    trace = out.parent / "mi_trace.csv"
    assert len(read_csv(trace)) == 2 * 60 // 5  # every 5th of 60 steps, x2
    assert csv_provenance(trace)["jax"] == jax.__version__  # written apart: its own record


def test_mi_bound_report_of_a_critic_too_costly_to_train(tmp_path):
    # the "measured, not trained" path of the default run (concat at N = 512), without training
    script = load_script()
    setup = script.QUICK
    estimates = np.linspace(-0.1, 3.0, 60, dtype=np.float32)
    run = script.Run("separable", 16, 30, estimates, [np.array([0.5, 0.7]), np.array([2.6, 2.7])],
                     ms_per_step=1.0, compile_s=2.0, train_s=0.06)
    skipped = [{"critic": "concat", "batch": 16, "ms_per_step": 3000.0, "compile_s": 9.0,
                "projected_s": 3.0 * 20_000, "steps": 20_000}]
    optimal = [np.array([1.8, 1.9]), np.array([2.7, 2.7])]
    rows = script.stage_rows(run, setup, optimal)
    assert [r["train_above_true"] for r in rows] == [int(np.sum(estimates[:30] > 2.0)), 0]
    assert [r["eval_mean"] for r in rows] == pytest.approx([0.6, 2.65])
    assert [r["optimal_mean"] for r in rows] == pytest.approx([1.85, 2.7])
    bound = script.bound_summary(rows)
    assert bound["max_optimal_minus_mean"] == pytest.approx(1.25)  # stage 1: 1.85 - 0.6
    assert bound["max_mean_minus_cap"] == pytest.approx(2.65 - math.log(16))  # stage 2
    # the made-up training estimates reach 3.0 > log 16 in stage 2: the check counts it
    assert (bound["mean_below_cap"], bound["stages_above_log_n"]) == (2, 1)
    timing = script.tables(rows, [run], skipped, setup.eval_batches)[2].splitlines()
    assert timing[2:] == ["| separable | 16 | 60 | 1.00 | 0.1 | 2.0 |",
                          "| concat | 16 | not run (20,000 would take 16.7 h) | 3000 | - | 9.0 |"]
    fig = script.figure([run], skipped, setup, {16: optimal})
    assert "not run: 3,000 ms/step measured" in fig.axes[1].texts[0].get_text()
