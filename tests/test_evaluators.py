"""The evaluations of a run by name (contrastive_jax.training.evaluation.evaluators) and the
run's resolve step (contrastive_jax.training.run_spec).

The defaults are today's evaluations of each config; ``evaluation.evaluators`` names them;
a bad name or an evaluator the model cannot run stops the start. An evaluator registered in
``EVALUATORS`` and nothing else reaches the status lines, ``metrics.jsonl`` and
``results.json`` of a run, computed on the state being evaluated.
"""

import json
import math

import jax
import ml_collections
import numpy as np
import pytest
from test_train import load_config

from contrastive_jax.errors import ConfigError
from contrastive_jax.pretrained import read_source, with_weights
from contrastive_jax.training.evaluation import evaluators
from contrastive_jax.training.run.progress import read_metrics_lines
from contrastive_jax.training.run.workdir.config_record import plain
from contrastive_jax.training.run_spec import resolve
from contrastive_jax.training.train import train_and_evaluate


def names(config) -> list[str]:
    return [e.name for e in evaluators.selected(config)]


def test_the_default_evaluators_are_what_each_config_asks_for():
    simclr = load_config("simclr_mnist1d.py:quick")
    assert names(simclr) == ["classification", "geometry"]
    clip = load_config("clip_mnist1d.py:quick")
    assert clip.evaluation.zero_shot_prompts  # the digit prompts
    assert names(clip) == ["classification", "geometry", "retrieval", "zero_shot"]
    pod = load_config("clip_vit_b16_pod.py:tiny")
    assert names(pod) == ["geometry", "retrieval"]  # no labels: no classification
    pod.evaluation.tasks = ("retrieval/coco_captions",)
    assert names(pod) == ["geometry", "retrieval", "tasks"]
    assert evaluators.titles(evaluators.selected(pod), pod) == (
        "alignment and uniformity, retrieval, tasks retrieval/coco_captions")
    simclr.evaluation.classification = False
    assert names(simclr) == ["geometry"]


def test_named_evaluators_run_in_the_registry_order_and_bad_names_stop_the_start():
    clip = load_config("clip_mnist1d.py:quick")
    clip.evaluation.evaluators = ("retrieval", "geometry")
    assert names(clip) == ["geometry", "retrieval"]
    clip.evaluation.evaluators = ("retrieval", "recall")
    with pytest.raises(ConfigError, match=r"unknown evaluation.evaluators \['recall'\]; valid: "
                                          r"\['classification', 'geometry'"):
        evaluators.selected(clip)
    with pytest.raises(TypeError):  # a tuple field: ml_collections refuses a string
        clip.evaluation.evaluators = "retrieval"
    simclr = load_config("simclr_mnist1d.py:quick")
    simclr.evaluation.evaluators = ("geometry", "zero_shot")
    with pytest.raises(ConfigError, match=r"\['zero_shot'\] need a text tower"):
        evaluators.selected(simclr)
    clip.evaluation.evaluators = ()
    clip.evaluation.zero_shot.class_names = ("zero", "one")
    with pytest.raises(ConfigError, match=r"zero_shot_prompts .* or .*class_names, not both"):
        evaluators.selected(clip)


def test_the_console_line_shows_each_evaluators_own_metrics():
    """The probe's regulariser is logged, not shown; of a task only its main metric; a score
    no selected evaluator owns is not shown."""
    pod = load_config("clip_vit_b16_pod.py:tiny")
    pod.evaluation.tasks = ("retrieval/coco_captions",)
    pod.evaluation.evaluators = ("classification", "geometry", "tasks")
    chosen = [evaluators.EVALUATORS[n] for n in ("classification", "geometry", "tasks")]
    line = evaluators.summary_line(chosen, {
        "linear_probe": 0.5, "linear_probe_l2": 1e-4, "knn": 0.25, "alignment": 1.0,
        "uniformity": -2.0, "retrieval/coco_captions/mean_r1": 0.125,
        "retrieval/coco_captions/image_r1": 0.0625, "x_to_y_r1": 0.75}, pod)
    assert line == ("linear_probe 0.5000, knn 0.2500, alignment 1.0000, uniformity -2.0000, "
                    "retrieval/coco_captions/mean_r1 0.1250")


def squared_norm(tree) -> float:
    """The sum of squares of every number in ``tree``, in float64, summed exactly (the same
    value whatever the order of the leaves)."""
    squares = np.concatenate([np.ravel(np.asarray(x, np.float64)) ** 2
                              for x in jax.tree.leaves(tree)])
    return math.fsum(np.sort(squares))


def test_a_new_evaluator_reaches_the_status_lines_the_logs_and_results(tmp_path, monkeypatch,
                                                                      capsys):
    """``param_norm`` added to EVALUATORS only (the trainer, the progress lines and
    results.json are not edited) and named in ``evaluation.evaluators``: its title on the
    status lines, its metric at the periodic evaluation (step 1) and the final one (step 2) in
    results.json, in metrics.jsonl as ``eval`` lines and on the console; the final value is
    the squared norm of the parameters the run saved at its last step. The run is given as a
    resolved RunSpec, whose config is frozen and is what config.json records."""
    def squares(ctx):
        return {"params_sq": squared_norm(ctx.state.params)}

    monkeypatch.setitem(evaluators.EVALUATORS, "param_norm", evaluators.Evaluator(
        "param_norm", lambda config: "the squared parameter norm",
        lambda config: ("params_sq",), squares, default=lambda config: False))
    config = load_config("simclr_mnist1d.py:quick")
    config.total_steps, config.evaluation.every = 2, 1
    config.evaluation.evaluators = ("param_norm",)
    workdir = tmp_path / "run"
    spec = resolve(config, str(workdir))
    assert isinstance(spec.config, ml_collections.FrozenConfigDict)
    with pytest.raises(AttributeError):
        spec.config.total_steps = 3
    assert [e.name for e in spec.evaluators] == ["param_norm"] and spec.steps == 2
    results = train_and_evaluate(spec)
    out = capsys.readouterr().out
    assert "evaluating at step 1: the squared parameter norm..." in out
    assert "final evaluation: the squared parameter norm..." in out
    assert [e["step"] for e in results["evaluations"]] == [1, 2]
    assert all(set(e) == {"step", "wall_s", "train_s", "params_sq"}
               for e in results["evaluations"])
    saved = with_weights(read_source(workdir)).params
    assert results["params_sq"] == results["evaluations"][-1]["params_sq"] == \
        squared_norm(saved)
    assert results["evaluations"][0]["params_sq"] != results["params_sq"]
    assert f"params_sq {results['params_sq']:.4f}" in out.splitlines()[-1]
    logged = [json.loads(line) for line in read_metrics_lines(workdir)]
    assert [r["step"] for r in logged if r.get("prefix") == "eval"] == [1, 2]
    assert json.loads((workdir / "config.json").read_text()) == plain(spec.config)


def test_an_evaluator_returning_a_name_it_does_not_own_is_a_bug(monkeypatch):
    evaluator = evaluators.Evaluator("odd", lambda config: "odd", lambda config: ("a",),
                                     lambda ctx: {"a": 1.0, "b": 2.0},
                                     default=lambda config: False)
    config = load_config("simclr_mnist1d.py:quick")
    with pytest.raises(AssertionError, match=r"'odd' returned \['b'\], which it does not "
                                             "declare"):
        evaluators.evaluate(None, None, config, None, [evaluator])
