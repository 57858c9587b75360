"""experiments/cheaper_clip.py: every arm spends the same FLOPs, a two-phase arm runs its
second phase from the first's workdir at the tuning settings, and the report holds the final
accuracies of every arm."""

import importlib.util
import pathlib
import sys

import pytest

from common.reporting import read_csv, read_report

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cheaper():
    module = "experiments_cheaper_clip"
    spec = importlib.util.spec_from_file_location(module, ROOT / "experiments" /
                                                  "cheaper_clip.py")
    script = importlib.util.module_from_spec(spec)
    sys.modules[module] = script
    spec.loader.exec_module(script)
    return script


@pytest.fixture(scope="module")
def steps(cheaper):
    return cheaper.phase_steps(100, quick=True)


def test_every_arm_spends_the_budget_of_unmasked_steps(cheaper, steps):
    """sum over phases of steps x FLOPs a step = budget x FLOPs of an unmasked 32 x 32 step,
    to within a step's rounding; masking and the lower resolution buy more steps."""
    unit = steps[0.0, 32, 1.0][1]
    for arm, phases in cheaper.ARMS.items():
        spent = sum(steps[p][0] * steps[p][1] for p in phases)
        rounding = sum(steps[p][1] for p in phases)
        assert abs(spent - 100 * unit) <= rounding, arm
    assert steps[0.0, 32, 1.0][0] == 100
    assert steps[0.5, 32, 1.0][0] > 150 and steps[0.75, 32, 1.0][0] > steps[0.5, 32, 1.0][0]
    assert steps[0.0, 16, 0.9][0] > 2 * 90  # 16 patches instead of 64


def test_a_two_phase_arm_tunes_from_its_first_phase_s_workdir(cheaper, steps, monkeypatch):
    """res=16 + tuning with the trainer recorded, not run (the move itself, 16 -> 32 with the
    position table resampled, runs in tests/test_pod_template.py's CLIPA recipe): phase 0 at
    16 with patch dropout 0, phase 1 at 32 from phase 0's workdir at the tuning learning rate;
    examples and FLOPs add up over the phases."""
    runs = []

    def recorded(config, workdir):
        runs.append((config, workdir))
        count = config.total_steps
        return {"evaluations": [{"step": count, "zero_shot": 0.5, "x_to_y_r1": 0.4,
                                 "train_s": 1.0}]}

    import contrastive_jax.training.train as train

    monkeypatch.setattr(train, "train_and_evaluate", recorded)
    steps = {key: (3 if key[2] < 1 else 6, flops) for key, (_, flops) in steps.items()}
    rows = cheaper.run_arm("res=16 + tuning", 0, steps, quick=True)
    (first, first_dir), (second, _) = runs
    assert first.data.preprocess.image_size == first.model.sample_encoder.image_size == 16
    assert second.data.preprocess.image_size == second.model.sample_encoder.image_size == 32
    assert first.model.sample_encoder.patch_dropout == 0.0 and "init_from" not in first.model
    assert second.model.init_from.path == first_dir
    assert second.optimizer.learning_rate == cheaper.TUNING_LR
    assert [(r["phase"], r["image_size"]) for r in rows] == [(0, 16), (1, 32)]
    assert rows[-1]["examples"] == 6 * 64  # 3 steps + 3 steps of the quick batch
    assert rows[-1]["pflop"] == pytest.approx(
        (3 * steps[0.0, 16, 0.9][1] + 3 * steps[0.0, 32, 0.1][1]) / 1e15)


def test_the_report_has_a_row_per_arm(cheaper, steps, tmp_path, monkeypatch):
    """main() on recorded evaluations (no training): the table's final accuracies are the
    mean and std of each arm's last evaluation over the seeds."""
    def fake_arm(arm, seed, steps, quick):
        return [{"arm": arm, "seed": seed, "phase": 0, "patch_dropout": 0.0, "image_size": 32,
                 "step": 6, "examples": 384, "pflop": 1e-6, "zero_shot": 0.5 + 0.1 * seed,
                 "image_to_text_r1": 0.25, "train_s": 1.0}]

    monkeypatch.setattr(cheaper, "run_arm", fake_arm)
    monkeypatch.setattr(cheaper, "phase_steps", lambda budget, quick: steps)
    out = tmp_path / "cheaper"
    assert cheaper.main(["--quick", "--seeds", "0", "1", "--out", str(out)]) == 0
    title, produced, tables = read_report(out.with_suffix(".md"))
    assert title == "Patch dropout and low resolution at equal FLOPs"
    assert "a budget of 6 unmasked 32 x 32 steps" in produced
    assert [r["arm"] for r in tables[0]] == list(cheaper.QUICK_ARMS)
    assert {r["zero-shot"] for r in tables[0]} == {"0.550 ± 0.071"}
    assert len(read_csv(out.with_suffix(".csv"))) == 2 * len(cheaper.QUICK_ARMS)
