"""experiments/ssl_recipes.py in its quick mode (SimCLR, MoCo v2, SimCLR without colour
distortion, the supervised and random-encoder baselines on a slice of ``shapes``), and the
templates' ``small`` variants it runs."""

import importlib.util
import json
import math
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from common.reporting import load_config, read_csv, read_report
from contrastive_jax.errors import ConfigError
from contrastive_jax.training import evaluation
from contrastive_jax.training.data.sources import open_split
from contrastive_jax.training.methods import method_for
from contrastive_jax.training.models import architecture_block, build_model

ROOT = pathlib.Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


def _script():
    spec = importlib.util.spec_from_file_location("experiments_ssl_recipes",
                                                  ROOT / "experiments" / "ssl_recipes.py")
    script = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = script
    spec.loader.exec_module(script)
    return script


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    script = _script()
    out = tmp_path_factory.mktemp("ssl") / "ssl_recipes"
    assert script.main(["--quick", "--out", str(out)]) == 0
    return script, out


def test_small_variants_are_the_recipes_at_cpu_size():
    simclr = load_config("configs/simclr_resnet50_imagenet.py:small")
    moco = load_config("configs/moco_v2_resnet50_imagenet.py:small,steps=40")
    for config, recipe in ((simclr, "simclr"), (moco, "moco_v2")):
        assert config.data.name == "shapes"
        assert (config.data.train_split, config.data.eval_split) == ("train", "test")
        assert config.data.batch_size == 256
        assert config.augment.recipe == recipe and config.augment.size == 32
        assert config.augment.blur_kernel == 3  # 10% of 32 px, odd
        assert config.data.preprocess.image_size == 32 and config.data.preprocess.views == 2
        assert tuple(config.data.preprocess.crop_scale) == tuple(config.augment.crop_scale)
        assert config.model.dtype == "float32"
        groups = {"bn_groups": 8} if recipe == "moco_v2" else {}  # MoCo's 32 a BatchNorm
        assert config.model.encoder.to_dict() == {
            "name": "resnet", "in_channels": 3, "widths": (16, 32, 64), "blocks_per_stage": 1,
            "features": 0, **groups}
        assert config.evaluation.classification and config.evaluation.tasks == ()
        assert config.evaluation.every == 75
    assert simclr.total_steps == 300 and moco.total_steps == 40
    assert simclr.optimizer.name == "lars"
    assert simclr.optimizer.learning_rate == pytest.approx(0.075 * math.sqrt(256))
    assert simclr.optimizer.warmup_steps == 30
    assert simclr.data.preprocess.mean is None  # [0, 1] pixels, as SimCLR's code
    assert simclr.loss.temperature == 0.1 and simclr.model.head.hidden == 64
    assert moco.optimizer.name == "sgd" and moco.optimizer.learning_rate == pytest.approx(0.03)
    assert (moco.moco.queue_size, moco.moco.momentum) == (4096, 0.99)
    assert method_for(moco).shuffle_keys  # [MoCo] §3.3's shuffled BatchNorm
    moco.model.encoder.bn_groups = 1  # one BatchNorm over the batch: nothing to shuffle
    assert not method_for(moco).shuffle_keys
    assert tuple(moco.data.preprocess.mean) == (0.485, 0.456, 0.406)
    # the model the small encoder builds: the pooled 64 features, no final layer
    model = build_model(architecture_block(simclr.model), nnx.Rngs(0))
    assert model.encoder.features == 64 and model.encoder.out is None
    h = model.representations(jnp.zeros((2, 32, 32, 3)))
    assert h.shape == (2, 64)
    with pytest.raises(ConfigError, match=r"sets \['batch', 'depth'\] itself"):
        load_config("configs/simclr_resnet50_imagenet.py:small,batch=512,depth=18")
    with pytest.raises(ConfigError, match=r"sets \['momentum', 'queue'\] itself"):
        load_config("configs/moco_v2_resnet50_imagenet.py:small,queue=8,momentum=0.9")


def test_quick_outputs_rows_per_method_and_step(quick_run):
    script, out = quick_run
    record = json.loads(out.with_suffix(".json").read_text())
    rows = record["rows"]
    assert record["steps"] == 4 and record["every"] == 2 and record["quick"] is True
    assert record["provenance"]["jax"] == jax.__version__
    assert [(r["method"], r["step"]) for r in rows] == [("random", 0)] + [
        (m, s) for m in script.RUNS for s in (2, 4)]
    for row in rows:
        assert list(row) == list(script.COLUMNS)
        for key in ("linear_probe", "knn"):
            assert 0.0 <= row[key] <= 1.0 and row[key] * 64 == round(row[key] * 64)  # of 64
        assert (row["classifier"] is None) == (row["method"] != "supervised")
        assert row["train_s"] >= 0.0
    supervised = [r for r in rows if r["method"] == "supervised"]
    assert all(0.0 <= r["classifier"] <= 1.0 for r in supervised)
    assert supervised[0]["train_s"] <= supervised[1]["train_s"]
    csv = read_csv(out.with_suffix(".csv"))
    assert [(c["method"], int(c["step"])) for c in csv] == [(r["method"], r["step"])
                                                           for r in rows]
    for c, r in zip(csv, rows, strict=True):
        assert float(c["linear_probe"]) == r["linear_probe"] and float(c["knn"]) == r["knn"]
    title, produced, tables = read_report(out.with_suffix(".md"))
    assert "shapes" in title and "--quick" in produced
    assert [t["method"] for t in tables[0]] == [script.LABELS[m] for m in
                                                ("random", *script.RUNS)]
    assert len(tables[1]) == len(rows)
    data = out.with_suffix(".png").read_bytes()
    assert data[:8] == PNG and len(data) > 10_000


def test_random_encoder_row_is_the_probe_of_the_untrained_encoder(quick_run):
    """The ``random`` row equals the linear probe and 20-NN computed here on the untrained
    model's representations of the same images (decoded, [0, 1], no normalisation)."""
    script, out = quick_run
    row = json.loads(out.with_suffix(".json").read_text())["rows"][0]
    config = script.make_config("random", 4, 0, quick=True)
    model = build_model(architecture_block(config.model), nnx.Rngs(config.seed))

    def features(split):
        source = open_split("shapes", split)
        images = np.stack([source[i]["image"] for i in range(len(source))])
        labels = np.array([source[i]["label"] for i in range(len(source))])
        return np.asarray(model.representations(jnp.asarray(images / 255.0, jnp.float32))), \
            labels

    train_x, train_y = features(config.data.train_split)
    test_x, test_y = features(config.data.eval_split)
    assert train_x.shape == (256, 16) and test_x.shape == (64, 16)
    probe = evaluation.linear_probe(train_x, train_y, test_x, test_y, l2_grid=(1e-4,))
    knn = evaluation.knn_accuracy(train_x, train_y, test_x, test_y, k=20, temperature=0.07)
    assert row["method"] == "random" and row["step"] == 0
    assert row["linear_probe"] == probe["accuracy"] and row["knn"] == knn


def test_no_colour_run_drops_colour_jitter_and_grayscale_only():
    script = _script()
    plain = script.make_config("simclr", 100, 20)
    ablated = script.make_config("simclr_no_colour", 100, 20)
    assert (ablated.augment.jitter_p, ablated.augment.grayscale) == (0.0, 0.0)
    differs = {k for k in plain.augment if plain.augment[k] != ablated.augment[k]}
    assert differs == {"jitter_p", "grayscale"}
    assert plain.evaluation.evaluators == ("classification",) and plain.evaluation.every == 20
    assert script.make_config("moco_v2", 100, 20).method == "moco"
