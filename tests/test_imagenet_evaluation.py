"""ImageNet evaluation as the self-supervised papers report it, offline: the mock
``imagenet2012`` (``prepare --mock imagenet2012``: the real builder's name, version, features
and splits), the ``knn`` task kind against a slow NumPy vote, and a SimCLR workdir's
``linear/imagenet2012`` and ``knn/imagenet2012`` inside training (``evaluation.tasks``) and
through ``python -m contrastive_jax.evaluate``, both equal to the probes on the encoder's
representations computed here by hand.
"""

import collections
import json

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds
from test_benchmark_metrics import reference_classification
from test_train import load_config

from contrastive_jax import evaluate
from contrastive_jax.errors import ConfigError
from contrastive_jax.training import augmentations, train
from contrastive_jax.training.data.image_crops import evaluation_image
from contrastive_jax.training.data.mock_datasets import (
    IMAGENET_CLASSES,
    IMAGENET_SIDES,
    IMAGENET_SPLITS,
    imagenet_example,
)
from contrastive_jax.training.data.sources import open_split, prepared_dir
from contrastive_jax.training.evaluation.probes import knn_votes, linear_probe_logits
from contrastive_jax.training.evaluation.task_runner import (
    LINEAR_L2_GRID,
    TaskModel,
    run_task,
)
from contrastive_jax.training.evaluation.task_table import read_table, resolve_tasks

IMAGE_SIZE = 16  # the tiny run's crops
RESNET = {"name": "resnet", "in_channels": 3, "widths": (4, 8), "features": 16}


def reference_knn_votes(train_x, train_y, test_x, k, temperature, classes):
    """Float64, one test row at a time: cosines, the k most similar training rows (ties to the
    lower index: a stable sort), and each class's sum of exp(cos / T) over them."""
    votes = np.zeros((len(test_x), classes))
    for i, x in enumerate(np.asarray(test_x, np.float64)):
        cos = [float(x @ t) / (np.linalg.norm(x) * np.linalg.norm(t))
               for t in np.asarray(train_x, np.float64)]
        for j in sorted(range(len(cos)), key=lambda j: (-cos[j], j))[:k]:
            votes[i, train_y[j]] += np.exp(cos[j] / temperature)
    return votes



def test_mock_imagenet2012_has_the_real_builders_features_and_splits(mock_imagenet):
    """Name, version, features (JPEG image, 1,000-class label named by WordNet ids,
    file_name) and splits of the real builder; every class of IMAGENET_CLASSES 16 times in
    train and 8 in validation; images JPEG, each side in [64, 160]; the examples are those of
    imagenet_example."""
    from tensorflow_datasets.datasets.imagenet2012 import imagenet2012_dataset_builder as real
    from tensorflow_datasets.datasets.imagenet2012 import imagenet_common

    folder = prepared_dir("imagenet2012", mock_imagenet)
    assert folder.parts[-2:] == ("imagenet2012", str(real.Builder.VERSION)) == (
        "imagenet2012", "5.1.0")
    builder = tfds.builder_from_directory(folder)
    assert builder.name == "imagenet2012"
    assert {s: i.num_examples for s, i in builder.info.splits.items()} == IMAGENET_SPLITS == {
        "train": 64, "validation": 32}
    features = builder.info.features
    assert set(features.keys()) == {"image", "label", "file_name"}
    assert features["image"].shape == (None, None, 3) and features["image"].np_dtype == np.uint8
    assert features["image"].encoding_format == "jpeg"
    with open(imagenet_common.label_names_file()) as f:
        assert features["label"].names == f.read().split()
    assert features["label"].num_classes == 1000
    for split, per_class in (("train", 16), ("validation", 8)):
        source = open_split("imagenet2012", split, mock_imagenet)
        encoded = open_split("imagenet2012", split, mock_imagenet, encoded_images=("image",))
        assert len(source) == len(encoded) == IMAGENET_SPLITS[split]
        labels = collections.Counter()
        for i in range(len(source)):
            example = source[i]
            assert encoded[i]["image"][:3] == b"\xff\xd8\xff"  # a JPEG
            h, w, c = example["image"].shape
            assert c == 3 and example["image"].dtype == np.uint8
            assert IMAGENET_SIDES[0] <= min(h, w) and max(h, w) <= IMAGENET_SIDES[1] == 160
            name = example["file_name"].decode()
            index = int(name.split("_")[-1].split(".")[0]) - (split == "validation")
            want = imagenet_example(split, index)
            assert want["file_name"] == name and want["label"] == example["label"]
            assert want["image"].size == (w, h)
            labels[int(example["label"])] += 1
        assert labels == {c: per_class for c in IMAGENET_CLASSES}
    assert name.startswith("ILSVRC2012_val_0000")


def test_knn_task_equals_the_slow_vote_by_hand():
    """The knn task on synthetic features (repeated rows: exact ties in similarity; 7 classes,
    class 6 without test rows) equals the float64 vote of reference_knn_votes ranked by the
    slow sort of test_benchmark_metrics, at DINO's k = 20, T = 0.07, at k = 3, T = 1 and at a
    k above the 40 training rows (all of them); the votes themselves equal it up to each row's
    factor exp(-max cos / T), in any chunking, and stay finite at T = 0.001."""
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((7, 6))
    train_y = np.concatenate([np.arange(7), rng.integers(0, 7, 33)])
    train_x = centres[train_y] + 0.9 * rng.standard_normal((40, 6))
    train_x[20:25] = train_x[:5]  # duplicates with other labels: ties broken by index
    train_y[20:25] = (train_y[:5] + 1) % 7
    test_y = rng.integers(0, 6, 25)
    test_x = centres[test_y] + 0.9 * rng.standard_normal((25, 6))
    splits = {"train": (train_x, train_y), "test": (test_x, test_y)}
    cache = {("synthetic", split, "image", "label"): {
        "features": x.astype(np.float32), "label": y, "num_classes": 7, "label_names": ()}
        for split, (x, y) in splits.items()}
    model = TaskModel("no model: the features are in the cache", crop=None, embed_images=None,
                      embed_texts=None, batch_size=8)
    seen = []
    for k, temperature in ((20, 0.07), (3, 1.0), (100, 0.07)):
        (task,) = resolve_tasks(["knn/synthetic"], overrides={"test_split": "test"},
                                knn_k=k, knn_temperature=temperature)
        assert (task.knn_k, task.knn_temperature, task.main_metric) == (k, temperature, "acc1")
        result = run_task(task, model, data_dir=None, cache=cache)
        want = reference_knn_votes(train_x, train_y, test_x, k, temperature, 7)
        metrics, _ = reference_classification(want, test_y, (1, 5))
        assert result["metrics"] == pytest.approx(metrics, abs=1e-12)
        assert (result["examples"], result["train_examples"], result["classes"],
                result["k"], result["temperature"]) == (25, 40, 7, min(k, 40), temperature)
        got = knn_votes(train_x, train_y, test_x, k=k, temperature=temperature, num_classes=7)
        top = np.max(unit(test_x) @ unit(train_x).T, axis=1, keepdims=True)
        np.testing.assert_allclose(got, want * np.exp(-top / temperature), rtol=2e-5,
                                   atol=1e-30)
        np.testing.assert_allclose(knn_votes(train_x, train_y, test_x, k=k, num_classes=7,
                                             temperature=temperature, chunk=7), got, rtol=1e-6)
        seen.append(tuple(result["metrics"].values()))
    assert seen[0] != seen[1] and 0.3 < min(m[0] for m in seen) < 1.0  # the settings matter
    # T = 0.001: exp(1 / T) is inf in float32; the votes, scaled by the nearest, stay finite
    tiny = knn_votes(train_x, train_y, test_x, temperature=1e-3, num_classes=7)
    assert np.isfinite(tiny).all() and np.all(tiny.max(axis=1) >= 1.0)


def unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_knn_settings_are_checked_before_anything_runs(capsys):
    for k, temperature, words in ((0, 0.07, "k must be a positive integer; got 0"),
                                  (2.5, 0.07, "k must be a positive integer; got 2.5"),
                                  (20, 0.0, "temperature must be a positive number; got 0.0")):
        with pytest.raises(ConfigError, match=words):
            resolve_tasks(["knn/imagenet2012"], knn_k=k, knn_temperature=temperature)
    with pytest.raises(ConfigError, match=r"coco_captions serves \['retrieval'\], not knn"):
        resolve_tasks(["knn/coco_captions"])
    status = evaluate.main(["--model=missing", "--tasks=knn/imagenet2012", "--knn_k=0",
                            "--output=unused"])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "k must be a positive integer" in err
    # every classification dataset of the table with a probes' split serves knn, as linear
    table = read_table()
    assert [d for d, e in table.items() if "linear" in e["kinds"]] == [
        d for d, e in table.items() if "knn" in e["kinds"]]
    assert all(e.get("train_split") for e in table.values() if "knn" in e["kinds"])
    assert len([d for d, e in table.items() if "knn" in e["kinds"]]) == 10


def test_a_workdir_without_an_image_size_reads_its_images_as_stored(tmp_path):
    """The encoder path's pixels from a workdir's config.json: the recorded crop and
    normalisation, the run's preprocessing's defaults where none is recorded, or no crop (the
    standard preprocessing: images as stored, [0, 1] pixels)."""
    from contrastive_jax.evaluate.encoder_model import workdir_pixels

    (tmp_path / "config.json").write_text(json.dumps({"data": {"preprocess": {
        "name": "standard"}}}))
    assert workdir_pixels(str(tmp_path)) == {"image_size": None, "resize": "bicubic",
                                             "resize_mode": "shortest", "mean": None,
                                             "std": None}
    (tmp_path / "config.json").write_text(json.dumps({"data": {"preprocess": {
        "name": "image_text"}}}))  # image_text_preprocess's defaults, as the run had them
    assert workdir_pixels(str(tmp_path)) == {"image_size": 224, "resize": "bicubic",
                                             "resize_mode": "shortest", "mean": None,
                                             "std": None}
    (tmp_path / "config.json").write_text(json.dumps({"data": {"preprocess": {
        "name": "image_text", "image_size": 24, "resize": "bilinear", "resize_mode": "squash",
        "mean": [0.5] * 3, "std": [0.25] * 3}}}))
    assert workdir_pixels(str(tmp_path)) == {"image_size": 24, "resize": "bilinear",
                                             "resize_mode": "squash", "mean": [0.5] * 3,
                                             "std": [0.25] * 3}


def simclr_imagenet_config(data_dir: str):
    """SimCLR's quick run with a tiny ResNet on the mock's 16-pixel crops (random resized
    crops in training, the centre crop in evaluation), 2 steps, and the ImageNet tasks."""
    config = load_config("simclr_mnist1d.py:quick")
    config.data.update({"name": "imagenet2012", "data_dir": data_dir, "eval_split":
                        "validation", "batch_size": 16, "eval_batch_size": 16})
    config.data.preprocess = {"name": "image", "image_size": IMAGE_SIZE, "crop": "random",
                              "crop_scale": (0.25, 1.0), "extra_features": ("label",)}
    config.input_key = "image"
    config.augment = augmentations.default_augment_config("image")
    config.model.encoder = dict(RESNET)
    config.total_steps = config.checkpoint_every = 2
    config.evaluation.evaluators = ("tasks",)
    config.evaluation.tasks = ("linear/imagenet2012", "knn/imagenet2012")
    return config


def representations(workdir, data_dir, split):
    """The workdir's encoder features h by hand: its parameters and BatchNorm statistics,
    each image's centre crop at IMAGE_SIZE (bilinear: the image preprocessing's), x / 255,
    the encoder in inference mode; and the labels."""
    from contrastive_jax.pretrained import build_pretrained_model, read_source, with_weights

    source = with_weights(read_source(str(workdir)))
    model = build_pretrained_model(source.model, source.params, rest=source.rest)
    examples = open_split("imagenet2012", split, data_dir, encoded_images=("image",))
    crops = np.stack([evaluation_image(examples[i]["image"], IMAGE_SIZE, resize="bilinear")
                      for i in range(len(examples))])
    z, h = (np.asarray(v) for v in model(jax.numpy.asarray(crops / np.float32(255.0)),
                                          train=False))
    assert h.shape == (len(crops), RESNET["features"]) and z.shape[1] == 8  # the head's
    labels = np.array([examples[i]["label"] for i in range(len(examples))])
    return h, labels


def test_simclr_workdir_imagenet_tasks_in_training_and_through_the_command(
        mock_imagenet, tmp_path, capsys):
    """A SimCLR run (ResNet) with evaluation.tasks = linear/imagenet2012, knn/imagenet2012,
    then the evaluation command on its workdir: both report the numbers of the probes on the
    encoder's representations h (the head dropped) computed here from the loaded encoder (the
    linear probe's fit, the kNN's slow float64 vote, the sorting reference's metrics)."""
    workdir = tmp_path / "run"
    results = train.train_and_evaluate(simclr_imagenet_config(mock_imagenet), str(workdir))
    out = capsys.readouterr().out
    assert "final evaluation: tasks linear/imagenet2012, knn/imagenet2012..." in out
    # a zero-shot task needs the text tower the workdir lacks: it fails, the others run
    status = evaluate.main([f"--model={workdir}", f"--data_dir={mock_imagenet}",
                            "--tasks=linear/imagenet2012,knn/imagenet2012,zeroshot/imagenet2012",
                            f"--output={tmp_path / 'out'}", "--batch_size=16"])
    record = json.loads((tmp_path / "out" / "results.json").read_text())
    assert status == 2 and record["tasks"]["zeroshot/imagenet2012"]["error"] == (
        "zeroshot/imagenet2012: the task needs a text tower, and "
        f"{workdir} (step 2) has none; evaluate it with linear/, fewshot/ or knn/ tasks")
    assert record["source"]["step"] == 2 and record["preprocess"]["image_size"] == IMAGE_SIZE
    assert record["preprocess"]["features"].startswith("representations h = f(x)")
    linear, knn = (record["tasks"][f"{kind}/imagenet2012"] for kind in ("linear", "knn"))
    assert (linear["train_split"], linear["split"]) == ("train", "validation")
    assert (knn["examples"], knn["train_examples"], knn["classes"]) == (32, 64, 1000)
    assert (knn["k"], knn["temperature"]) == (20, 0.07)

    train_x, train_y = representations(workdir, mock_imagenet, "train")
    test_x, test_y = representations(workdir, mock_imagenet, "validation")
    votes = reference_knn_votes(train_x, train_y, test_x, 20, 0.07, 1000)
    want_knn, _ = reference_classification(votes, test_y, (1, 5))
    logits, l2, _ = linear_probe_logits(train_x, train_y, test_x, test_y, num_classes=1000,
                                        l2_grid=LINEAR_L2_GRID)
    want_linear, _ = reference_classification(logits, test_y, (1, 5))
    want_linear["l2"] = l2
    assert knn["metrics"] == pytest.approx(want_knn, abs=1e-12)
    assert linear["metrics"] == pytest.approx(want_linear, abs=1e-12)
    for kind, want in (("knn", want_knn), ("linear", want_linear)):
        assert {m: results[f"{kind}/imagenet2012/{m}"] for m in want} == pytest.approx(
            want, abs=1e-12)
    # numbers a wrong feature, protocol or vote would move (neither saturated nor chance)
    assert 0.4 < want_knn["acc1"] < 1 and 0.4 < want_linear["acc1"] < 1
