"""The temperature and batch-size ablation scripts: their pure parts, and each end to end in its
quick mode (the config's quick variant, a few tiny runs)."""

import importlib.util
import math
import pathlib
import sys

import pytest

from common.reporting import load_config, read_csv, read_report, summarise
from contrastive_jax.training.methods import LossSettings
from contrastive_jax.training.run_spec import total_steps

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _script(name):
    module = f"experiments_{name}"
    spec = importlib.util.spec_from_file_location(module, ROOT / "experiments" / f"{name}.py")
    script = importlib.util.module_from_spec(spec)
    sys.modules[module] = script  # dataclasses look their module up while the class is made
    spec.loader.exec_module(script)
    return script


@pytest.fixture(scope="module")
def temperature():
    return _script("temperature_ablation")


@pytest.fixture(scope="module")
def batch_size():
    return _script("batch_size_ablation")


def _rows(path: pathlib.Path) -> list[dict[str, str]]:
    return read_csv(path)  # past the provenance line (read_report checks the .md's)


def _accuracy(text: str) -> float:
    value = float(text)
    assert 0.0 <= value <= 1.0, text
    return value


# --- temperature_ablation ---------------------------------------------------------------------

def test_temperature_grid_has_table5_rows(temperature):
    settings = temperature.grid()
    labels = [s.label for s in settings]
    assert len(labels) == len(set(labels)) == 14  # l2: 5 fixed + learned; no l2: 7 + learned
    no_norm = {s.temperature for s in settings if not s.normalize and not s.learned}
    assert no_norm == {0.05, 0.1, 0.2, 0.5, 1.0, 10.0, 100.0}
    assert sum(s.learned for s in settings) == 2


def test_temperature_configs(temperature):
    s = temperature.Setting(normalize=False, temperature=10.0)
    config = temperature.make_config(s, seed=3, epochs=5.0)
    loss = LossSettings.from_config(config.loss)  # the no-norm combination is a valid one
    assert (loss.normalize, loss.impl, loss.temperature) == (False, "autodiff", 10.0)
    assert config.seed == 3 and config.num_epochs == 5.0
    assert total_steps(config, 4000) == 157 and config.optimizer.warmup_steps == 8
    learned = temperature.make_config(temperature.Setting(True, 0.2, learned=True), 0, epochs=5.0)
    assert learned.model.learn_temperature and learned.model.init_temperature == 0.2
    assert learned.loss.get("normalize", True) is True
    # the main job's own warmup is 31 of its 625 steps: the fraction reproduces it
    assert temperature.warmup_steps(625) == 31 and temperature.warmup_steps(2) == 1


def test_temperature_diverged_row_is_nan(temperature):
    row = temperature.row_from_result(None)
    assert row["status"] == "diverged" and math.isnan(row["linear_probe"])
    nan_loss = {"final_train_metrics": {"loss": math.nan, "top1": 0.5, "temperature": 0.1,
                                        "embedding_norm": 1.0, "mi_bound": 1.0,
                                        "skipped": 3.0},
                "linear_probe": 0.9, "knn": 0.8, "steps": 10, "train_time_s": 1.0}
    row = temperature.row_from_result(nan_loss)
    assert row["status"] == "diverged" and math.isnan(row["knn"]) and row["skipped_steps"] == 3


def test_temperature_logit_scale_and_table5_column(temperature):
    def entry(normalize, tau, learned=False, final=None, norm=2.0):
        s = temperature.Setting(normalize, tau, learned)
        return {"setting": s.label, "normalize": normalize, "learned": learned,
                "temperature": tau, "final_temperature": final or tau,
                "final_temperature_std": 0.0, "seeds": 3, "diverged": 0,
                "linear_probe": 0.9, "linear_probe_std": 0.01, "knn": 0.8, "knn_std": 0.01,
                "contrastive_top1": 0.5, "contrastive_top1_std": 0.02, "embedding_norm": norm,
                "embedding_norm_std": 0.1}

    # cosine logits: the scale is 1 / tau; dot products: about norm^2 / tau (derivations §12.4)
    assert temperature.effective_scale(entry(True, 0.1)) == pytest.approx(10.0)
    assert temperature.effective_scale(entry(False, 10.0, norm=3.0)) == pytest.approx(0.9)
    # the learned tau's scale is at its final value
    assert temperature.effective_scale(entry(True, 0.2, True, final=0.25)) == pytest.approx(4.0)
    summary = [entry(True, 0.05), entry(True, 0.2), entry(True, 0.2, True, final=0.25),
               entry(False, 100.0, norm=10.0)]
    lines = temperature.results_table(summary).splitlines()
    assert len(lines) == 2 + len(summary)
    assert lines[2] == ("| l2, tau=0.05 | 3 (0) | 90.0 ± 1.0 | 80.0 ± 1.0 | 50.0 ± 2.0 | "
                        "0.050 ± 0.000 | 2.00 ± 0.10 | 20.0 | 59.7 / 90.5 |")
    assert lines[3].endswith("| 5.0 |  |")  # tau 0.2 is not a Table 5 row
    assert lines[4].startswith("| l2, learned (init 0.2) |") and lines[4].endswith("| 4.0 |  |")
    assert lines[5].endswith("| 1.0 | 57.0 / 92.1 |")  # 10^2 / 100; Table 5's no-l2 tau 100


def test_temperature_figure_and_table(temperature, tmp_path):
    # every kind of point: fixed lines, a learned star, a diverged setting (a red cross)
    rows = []
    for normalize, tau, learned, probe in ((True, 0.1, False, 0.9), (True, 1.0, False, 0.8),
                                           (True, 0.2, True, 0.85), (False, 10.0, False, 0.7),
                                           (False, 0.05, False, math.nan)):
        s = temperature.Setting(normalize, tau, learned)
        for seed in (0, 1):
            ok = math.isfinite(probe)
            rows.append({"setting": s.label, "normalize": normalize, "learned": learned,
                         "temperature": tau, "seed": seed,
                         "status": "ok" if ok else "diverged", "linear_probe": probe + seed / 100,
                         "knn": probe, "contrastive_top1": probe / 2,
                         "final_temperature": tau * 0.8 if learned else tau,
                         "embedding_norm": 3.0})
    summary = summarise(rows, temperature.SETTING_KEYS, temperature.SUMMARY_METRICS)
    assert [s["diverged"] for s in summary] == [0, 0, 0, 0, 2]
    assert summary[0]["linear_probe"] == pytest.approx(0.905)
    assert summary[0]["linear_probe_std"] == pytest.approx(0.01 / math.sqrt(2))
    table = temperature.results_table(summary)
    assert "| l2, tau=0.1 | 2 (0) | 90.5 ± 0.7 |" in table and "| diverged |" in table
    assert "| 0.9 | 57.2 / 91.7 |" in table  # no l2 at tau 10: scale 3^2 / 10; Table 5 row
    fig = temperature.figure(summary)
    fig.savefig(tmp_path / "figure.png")
    assert (tmp_path / "figure.png").stat().st_size > 10_000


def test_temperature_script_quick(temperature, tmp_path):
    out = tmp_path / "temperature"
    assert temperature.main(["--quick", "--out", str(out)]) == 0
    rows = _rows(out.with_suffix(".csv"))
    assert [r["setting"] for r in rows] == ["no l2, learned (init 0.2)"]
    assert list(rows[0]) == ["setting", "normalize", "learned", "temperature", "seed", "status",
                             "linear_probe", "knn", "contrastive_top1", "final_temperature",
                             "embedding_norm", "mi_bound", "loss", "skipped_steps", "steps",
                             "train_s"]
    for row in rows:
        assert row["status"] == "ok" and row["steps"] == "6" and row["seed"] == "0"
        for key in ("linear_probe", "knn", "contrastive_top1"):
            _accuracy(row[key])
        assert float(row["loss"]) > 0
        # the bound is log(2B - 1) - L at the quick variant's batch 64 (docs/derivations.md §15.4)
        assert float(row["mi_bound"]) == pytest.approx(math.log(127) - float(row["loss"]),
                                                       abs=1e-4)
    tau = float(rows[0]["final_temperature"])
    assert tau != pytest.approx(0.2, abs=1e-7) and 0.01 <= tau < 1  # learned: it moved
    assert out.with_suffix(".png").stat().st_size > 10_000
    title, produced, tables = read_report(out.with_suffix(".md"))  # measurements only
    assert title == "Temperature and L2 normalisation (SimCLR, MNIST-1D)"
    assert produced.startswith("`python experiments/temperature_ablation.py --quick --out ")
    assert "1 settings × seeds 0 = 1 runs of the quick variant (6 steps of batch 64" in produced
    [table] = tables
    assert [r["setting"] for r in table] == ["no l2, learned (init 0.2)"]
    assert table[0]["seeds (diverged)"] == "1 (0)"
    # percentages of the CSV's numbers; one seed: std 0
    assert table[0]["linear probe %"] == f"{100 * float(rows[0]['linear_probe']):.1f} ± 0.0"
    assert table[0]["final tau"] == f"{tau:.3f} ± 0.000"
    norm = float(rows[0]["embedding_norm"])
    assert table[0]["logit scale"] == f"{norm ** 2 / tau:.1f}"  # no l2: about norm^2 / tau


# --- batch_size_ablation ----------------------------------------------------------------------

def test_sqrt_learning_rate_and_ceiling(batch_size):
    lrs = [batch_size.sqrt_scaled_lr(b) for b in batch_size.BATCHES]
    assert lrs == pytest.approx([1e-3, 2e-3 / math.sqrt(2), 2e-3, 2e-3 * math.sqrt(2), 4e-3,
                                 4e-3 * math.sqrt(2), 8e-3], rel=1e-12)
    assert batch_size.sqrt_scaled_lr(128) == 2e-3
    assert batch_size.log_n_ceiling(1) == 0.0  # one candidate: nothing to learn
    assert batch_size.log_n_ceiling(128) == math.log(255)


def test_rank_correlation(batch_size):
    rho = batch_size.rank_correlation
    assert rho([1, 2, 3, 4], [10, 20, 25, 40]) == pytest.approx(1.0)
    assert rho([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert rho([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    assert rho([1, 2, 3], [1, 1, 2]) == pytest.approx(math.sqrt(3) / 2)  # a tie: mean ranks
    assert math.isnan(rho([1], [2])) and math.isnan(rho([1, 2], [5, 5]))


def test_batch_trends(batch_size):
    def entry(regime, batch, acc, bound):
        return {"regime": regime, "batch": batch, "steps": 10, "linear_probe": acc,
                "linear_probe_std": 0.0, "knn": acc, "knn_std": 0.0, "mi_bound": bound,
                "log_n_ceiling": batch_size.log_n_ceiling(batch)}

    summary = [entry("equal_epochs", b, acc, 2.0) for b, acc in ((32, 0.9), (64, 0.8))]
    summary += [entry("equal_steps", b, acc, bound)
                for b, acc, bound in ((32, 0.8, 2.0), (64, 0.9, 4.5))]
    lines = batch_size.trends_table(summary).splitlines()
    # equal epochs: probe and kNN fall with B (rho -1); a constant bound has no rank correlation;
    # the bound reaches 2 / log(63) = 48% of its ceiling at B = 32
    assert lines[2] == "| equal epochs | -1.00 | -1.00 | – | 48% |"
    # equal steps: everything rises with B; 4.5 / log(127) = 93% of the ceiling at B = 64
    assert lines[3] == "| equal steps | +1.00 | +1.00 | +1.00 | 93% |"


def test_batch_plan(batch_size):
    runs = batch_size.plan(batch_size.BATCHES, 5.0, None, 4000)
    assert len(runs) == 13  # 7 + 7, batch 128 shared
    by_regime = {r: {run.batch: run.steps for run in runs if r in run.regimes}
                 for r in batch_size.REGIMES}
    assert by_regime["equal_epochs"] == {32: 625, 64: 313, 128: 157, 256: 79, 512: 40,
                                         1024: 20, 2048: 10}
    assert set(by_regime["equal_steps"].values()) == {157}
    shared = [run for run in runs if len(run.regimes) == 2]
    assert [(run.batch, run.steps) for run in shared] == [(128, 157)]
    for run in runs:
        assert 1 <= run.warmup < run.steps
        config = batch_size.make_config(run, seed=0)
        assert total_steps(config, 4000) == run.steps
        assert config.data.batch_size == run.batch
        assert config.optimizer.learning_rate == batch_size.sqrt_scaled_lr(run.batch)
    # the library computes the same equal-epoch step counts from num_epochs
    config = load_config("configs/simclr_mnist1d.py:batch=64,epochs=5.0")
    assert total_steps(config, 4000) == batch_size.steps_for_epochs(5.0, 64, 4000)
    assert len(batch_size.plan((32, 64), 5.0, 100, 4000)) == 4  # nothing shared


def test_batch_plan_accumulation(batch_size):
    runs = batch_size.plan((128, 256, 512), 5.0, None, 4000)
    ks = {128: 1, 256: 1, 512: 2}
    planned = batch_size.with_accumulation(runs, ks, (256, 4))
    assert len(planned) == len(runs) + 1
    for run in planned[:-1]:
        assert run.accumulation_steps == ks[run.batch] and not run.cross_check
        assert batch_size.make_config(run, seed=0).accumulation_steps == ks[run.batch]
    check = planned[-1]  # the equal-steps run at 256 again, with 4 micro-batches
    twin = next(r for r in planned if r.batch == 256 and "equal_steps" in r.regimes)
    assert check.cross_check and check.regimes == ("equal_steps",)
    assert (check.batch, check.accumulation_steps) == (256, 4)
    assert (check.steps, check.learning_rate, check.warmup) == (
        twin.steps, twin.learning_rate, twin.warmup)
    assert batch_size.with_accumulation(runs, ks, None) == planned[:-1]
    with pytest.raises(ValueError, match="cross-check"):  # the same K twice checks nothing
        batch_size.with_accumulation(runs, ks, (512, 2))
    with pytest.raises(ValueError, match="no equal-steps run at batch 1024"):
        batch_size.with_accumulation(runs, ks, (1024, 4))


def test_micro_batch_trials_fit_the_budget(batch_size, monkeypatch):
    """On the config of the batch script's quick memory plan at batch 128 (its K = 1 trial is
    then the same compiled program as the script's, test_batch_script_quick)."""
    from common import sweep

    # Each trial config's step is set up and compiled once: the searches below try K = 1 and 2
    # again (the same configs, the same compiled temporaries).
    measured = {}

    def step_temporaries_mb(config, measure=sweep.step_temporaries_mb):
        key = str(config)
        if key not in measured:
            measured[key] = measure(config)
        return measured[key]

    monkeypatch.setattr(sweep, "step_temporaries_mb", step_temporaries_mb)
    size = sweep.train_size(load_config(batch_size.CONFIG))
    run = next(r for r in batch_size.plan(batch_size.QUICK_BATCHES, 0.1, None, size)
               if r.batch == 128)
    config = batch_size.make_config(run, 0, quick=True)
    assert config.data.batch_size == 128
    whole = sweep.micro_batch_trials(config, math.inf)
    assert list(whole) == [1] and whole[1] > 0
    budget = 0.75 * whole[1]  # K = 1 no longer fits: the next powers of two are tried
    trials = sweep.micro_batch_trials(config, budget)
    ks = list(trials)
    assert ks[0] == 1 and ks == [2**i for i in range(len(ks))] and len(ks) >= 2
    assert trials[ks[-1]] <= budget < min(trials[k] for k in ks[:-1])
    assert trials[ks[-1]] < whole[1]  # fewer activations held with micro-batches
    with pytest.raises(ValueError, match="raise the budget"):
        sweep.micro_batch_trials(config, 0.0, most=2)  # K = 1 and 2, both compiled above


def test_batch_script_quick(batch_size, tmp_path):
    out = tmp_path / "batch"
    assert batch_size.main(["--quick", "--out", str(out)]) == 0
    rows = _rows(out.with_suffix(".csv"))
    assert list(rows[0]) == ["regime", "batch", "accumulation_steps", "cross_check", "seed",
                             "steps", "epochs", "learning_rate", "warmup_steps",
                             "log_n_ceiling", "shared_run", "status", "linear_probe", "knn",
                             "contrastive_top1", "mi_bound", "loss", "train_s"]
    assert [(r["regime"], r["batch"], r["accumulation_steps"], r["steps"]) for r in rows] == [
        ("equal_epochs", "64", "1", "7"), ("equal_epochs", "128", "1", "4"),
        ("equal_steps", "64", "1", "4"), ("equal_steps", "128", "1", "4"),
        ("equal_steps", "128", "2", "4")]  # the cross-check: batch 128 with K = 2
    assert [r["cross_check"] for r in rows] == ["False"] * 4 + ["True"]
    for row in rows:
        batch = int(row["batch"])
        assert row["status"] == "ok"
        for key in ("linear_probe", "knn", "contrastive_top1"):
            _accuracy(row[key])
        assert float(row["log_n_ceiling"]) == math.log(2 * batch - 1)  # N = 2B - 1, exactly
        assert float(row["learning_rate"]) == 2e-3 * math.sqrt(batch / 128)
        # the library's bound uses the same N: log N - L, below the ceiling (L > 0)
        assert float(row["mi_bound"]) == pytest.approx(
            float(row["log_n_ceiling"]) - float(row["loss"]), abs=1e-4)
        assert float(row["mi_bound"]) < float(row["log_n_ceiling"])
    # the shared batch-128 run appears once per regime with the same numbers
    assert rows[1]["shared_run"] == rows[3]["shared_run"] == "True"
    assert rows[1]["linear_probe"] == rows[3]["linear_probe"]
    assert out.with_suffix(".png").stat().st_size > 10_000
    _, produced, (table, trends, memory, check) = read_report(out.with_suffix(".md"))
    assert "4 training runs" in produced and "equal steps: 4 steps" in produced  # 128 shared
    assert [(r["regime"], r["batch"], r["K"], r["steps"]) for r in table] == [
        (r["regime"].replace("_", " ") + (" (cross-check)" if r["cross_check"] == "True"
                                          else ""), r["batch"], r["accumulation_steps"],
         r["steps"]) for r in rows]
    for cells, row in zip(table, rows, strict=True):
        assert cells["ceiling log(2B-1)"] == f"{float(row['log_n_ceiling']):.3f}"
        assert cells["log N - L (nats)"] == f"{float(row['mi_bound']):.2f} ± 0.00"
    assert [t["regime"] for t in trends] == ["equal epochs", "equal steps"]
    for t in trends:  # two batches: the ranks agree or disagree entirely
        assert t["Spearman rho: probe vs B"] in ("+1.00", "-1.00", "–")
        assert float(t["max (log N - L) / log(2B-1)"].rstrip("%")) < 100  # below log N
    # the memory plan: both batches fit the default budget with K = 1
    assert [(m["batch"], m["K run"]) for m in memory] == [("64", "1"), ("128", "1")]
    assert memory[1]["step temporaries, MiB (budget 128)"].startswith("K=1: ")
    # the cross-check: the same point with 2 micro-batches; the loss is a global-batch metric
    # and the gradient exact but for BatchNorm's per-micro-batch statistics, so the two runs'
    # losses agree closely (a per-micro-batch loss would be about log 2 lower)
    base, twin = rows[3], rows[4]
    assert abs(float(base["loss"]) - float(twin["loss"])) < 0.1
    by_metric = {c["metric (x100 for accuracies)"]: c for c in check}
    assert list(by_metric) == ["linear_probe", "knn", "contrastive_top1", "mi_bound", "loss"]
    assert by_metric["loss"]["B=128, K=1"] == f"{float(base['loss']):.4f} ± 0.0000"
    assert by_metric["loss"]["B=128, K=2"] == f"{float(twin['loss']):.4f} ± 0.0000"
    assert float(by_metric["loss"]["max per-seed difference"]) == pytest.approx(
        abs(float(base["loss"]) - float(twin["loss"])), abs=1e-5)
