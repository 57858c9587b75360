"""The shipped task table and class names agree with the TFDS datasets they name (offline).

Each entry's feature keys exist in the TFDS builder's features (read from TFDS's code, no
download), each recorded class list has one name per ClassLabel class and, where TFDS's own
label names are readable words, names the same class at each index (OpenAI's renames recorded
below), and every shipped task resolves. Splits need the prepared data and are not checked here.
"""

import json
import re
import types
from unittest import mock

import numpy as np
import pytest
import tensorflow_datasets as tfds

from contrastive_jax.training.evaluation import task_table

TABLE = task_table.read_table()
NAMES = task_table.read_class_names()
# OpenAI's class names that are not TFDS's words (openai/CLIP data/prompts.md): index -> name.
OPENAI_RENAMES = {
    "caltech101": {"airplanes": "airplane", "background_google": "background",
                   "car_side": "side of a car", "cougar_body": "body of a cougar cat",
                   "cougar_face": "face of a cougar cat",
                   "crocodile_head": "head of a  crocodile", "faces": "off-center face",
                   "faces_easy": "centered face", "flamingo_head": "head of a flamingo",
                   "leopards": "leopard", "motorbikes": "motorbike",
                   "snoopy": "snoopy (cartoon beagle)", "yin_yang": "yin and yang symbol"},
    "oxford_flowers102": {"pink-yellow dahlia?": "pink and yellow dahlia",
                          "ball moss": "air plant"},
}
# TFDS label names that are not words offline (ids, or numbers until the data is downloaded).
OPAQUE_LABELS = {"imagenet2012", "cifar10", "cifar100"}


def words(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", name.lower()).strip()


def features(dataset: str, data_dir) -> tfds.features.FeaturesDict:
    if dataset == "coco_captions":  # its features name tf.int64; TensorFlow is not a dependency
        from tensorflow_datasets.object_detection import coco
        with mock.patch.object(coco, "tf", types.SimpleNamespace(int64=np.int64)):
            return tfds.builder(dataset, data_dir=data_dir).info.features
    return tfds.builder(dataset, data_dir=data_dir).info.features


def feature_at(feats, key: str):
    """The feature at ``key`` ("captions/text": the text inside the captions sequence)."""
    for part in key.split("/"):
        if isinstance(feats, tfds.features.Sequence):
            feats = feats.feature
        assert part in feats, f"no {part!r} in {list(feats)}"
        feats = feats[part]
    return feats


@pytest.mark.parametrize("dataset", sorted(d for d in TABLE if "note" not in TABLE[d]))
def test_each_entry_names_features_its_tfds_dataset_has(dataset, tmp_path):
    entry, feats = TABLE[dataset], features(dataset, tmp_path)
    assert isinstance(feature_at(feats, entry["image_key"]), tfds.features.Image)
    if "retrieval" in entry["kinds"]:
        caption = feature_at(feats, entry["caption_key"])  # a string tensor (coco_captions)
        assert isinstance(caption, tfds.features.Text) or caption.np_dtype == np.object_
    else:
        label = feature_at(feats, entry["label_key"])
        assert isinstance(label, tfds.features.ClassLabel)
        assert len(NAMES[dataset]["class_names"]) == label.num_classes
    assert entry["main_metric"] in {"acc1", "mean_per_class_recall", "mean_r1"}


def test_an_entry_outside_the_tfds_catalogue_says_how_to_build_it(tmp_path):
    outside = sorted(d for d in TABLE if "note" in TABLE[d])
    assert outside == ["flickr30k"]
    with pytest.raises(tfds.core.registered.DatasetNotFoundError):
        tfds.builder("flickr30k", data_dir=tmp_path)
    assert "coco_captions' layout" in TABLE["flickr30k"]["note"]


@pytest.mark.parametrize("dataset", sorted(set(NAMES) - OPAQUE_LABELS))
def test_recorded_class_names_are_tfds_label_order(dataset, tmp_path):
    tfds_names = features(dataset, tmp_path)[TABLE[dataset]["label_key"]].names
    ours = NAMES[dataset]["class_names"]
    renames = OPENAI_RENAMES.get(dataset, {})
    differ = {theirs: mine for theirs, mine in zip(tfds_names, ours, strict=True)
              if words(theirs) != words(mine) and not words(theirs).endswith(words(mine))}
    assert differ == renames  # sun397's "/a/abbey" is "abbey": the end of the path


def test_opaque_label_datasets_have_their_class_counts_and_known_first_names(tmp_path):
    first = {name: NAMES[name]["class_names"][:2] for name in OPAQUE_LABELS}
    assert first == {"imagenet2012": ["tench", "goldfish"],  # n01440764, n01443537
                     "cifar10": ["airplane", "automobile"], "cifar100": ["apple", "aquarium fish"]}
    assert features("imagenet2012", tmp_path)["label"].names[:2] == ["n01440764", "n01443537"]


def test_every_shipped_task_resolves_with_templates_that_format():
    names = [f"{kind}/{dataset}" for dataset, entry in TABLE.items() for kind in entry["kinds"]]
    tasks = task_table.resolve_tasks(names)
    assert [t.name for t in tasks] == names
    for task in tasks:
        if task.kind == "zeroshot":
            assert task.templates and all(t.count("{}") == 1 for t in task.templates)
            assert len({t.format("x") for t in task.templates}) == len(task.templates)
            assert task.class_names == tuple(NAMES[task.dataset]["class_names"])
    with open(task_table.CLASS_NAMES) as f:
        assert "openai/CLIP" in json.load(f)["_source"]


def test_training_runs_name_tasks_in_their_config_and_bad_names_stop_the_start(tmp_path):
    from test_train import load_config

    from contrastive_jax.errors import ConfigError
    from contrastive_jax.training import train
    from contrastive_jax.training.config import base_config
    from contrastive_jax.training.evaluation.training_tasks import TASK_FIELDS, check_tasks
    from contrastive_jax.training.run.workdir.config_record import ADDED_FIELDS

    ev = base_config().evaluation
    assert set(ev.task_overrides) == set(task_table.OVERRIDES)
    for field in (*TASK_FIELDS, "task_overrides"):  # old records read as "no tasks"
        assert ADDED_FIELDS[("evaluation", field)] == (
            ev[field].to_dict() if field == "task_overrides" else ev[field])
    config = load_config("clip_mnist1d.py")
    assert check_tasks(config) == []
    config.evaluation.tasks = ("zeroshot/cifar10", "linear/my_set")
    config.evaluation.task_overrides.test_split = "test"
    assert [(t.name, t.test_split) for t in check_tasks(config)] == [
        ("zeroshot/cifar10", "test"), ("linear/my_set", "test")]
    config.evaluation.task_overrides.test_split = ""
    with pytest.raises(ConfigError, match=r"evaluation.tasks: dataset 'my_set'.*not in the task"):
        train.prepare_run(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    simclr = load_config("simclr_mnist1d.py")
    simclr.evaluation.tasks = ("linear/cifar10", "zeroshot/cifar10")
    with pytest.raises(ConfigError, match=r"\['zeroshot/cifar10'\] need a text tower"):
        train.prepare_run(simclr, tmp_path / "simclr")
    simclr.evaluation.tasks = ("linear/cifar10", "fewshot/cifar10")
    assert [t.kind for t in check_tasks(simclr)] == ["linear", "fewshot"]
    config.evaluation.tasks = ("zeroshort/cifar10",)
    with pytest.raises(ConfigError, match=r"evaluation.tasks: task 'zeroshort/cifar10' is not"):
        check_tasks(config)
