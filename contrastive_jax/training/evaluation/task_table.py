"""The benchmark tasks: ``KIND/DATASET`` names resolved to a dataset's splits, feature keys,
class names and templates, from two data files beside this module.

- ``task_table.json``: per TFDS dataset, its test split (and the training split of the probes),
  its image, label or caption keys, the task kinds it serves and its main metric;
- ``class_names.json``: per classification dataset, the class names in TFDS label order and the
  prompt templates of OpenAI's CLIP evaluation, with their source.

Kinds (docs/evaluation.md): ``zeroshot`` (class names x templates, top-1/top-5, mean per-class
recall), ``retrieval`` (image <-> text Recall@1/5/10, every caption of an image counted),
``linear`` (logistic regression on frozen features), ``fewshot`` (big_vision's closed-form probe),
``knn`` (weighted k-nearest-neighbour vote on frozen, L2-normalised features; ``knn_k``,
``knn_temperature``). A dataset the table does not hold is any other TFDS dataset, given by its
keys (:func:`resolve_tasks`' ``overrides``: at least the test split).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from etils import epath

from contrastive_jax.errors import ConfigError

KINDS = ("zeroshot", "retrieval", "linear", "fewshot", "knn")
CLASSIFICATION_KINDS = ("zeroshot", "linear", "fewshot", "knn")
_HERE = pathlib.Path(__file__).resolve().parent
TASK_TABLE = _HERE / "task_table.json"
CLASS_NAMES = _HERE / "class_names.json"
OVERRIDES = ("test_split", "train_split", "image_key", "label_key", "caption_key")
DEFAULT_KEYS = {"image_key": "image", "label_key": "label", "caption_key": "captions/text"}
DEFAULT_TEMPLATES = ("a photo of a {}.",)  # a dataset without recorded templates
MAIN_METRICS = {"zeroshot": "acc1", "linear": "acc1", "fewshot": "10shot",
                "retrieval": "mean_r1", "knn": "acc1"}
KNN_K, KNN_TEMPERATURE = 20, 0.07  # [DINO]'s weighted k-NN (the defaults of probes.knn_votes)


@dataclasses.dataclass(frozen=True)
class Task:
    """One benchmark task: ``kind`` on TFDS ``dataset`` (``name`` = ``"kind/dataset"``).

    ``class_names`` / ``templates``: ``None`` where the kind needs none, or where the names come
    from the dataset's ClassLabel feature when it is read (``class_names_from_tfds``).
    ``main_metric``: the score the results table shows first. ``knn_k`` / ``knn_temperature``:
    a ``knn`` task's neighbours and vote temperature (other kinds ignore them).
    """

    kind: str
    dataset: str
    test_split: str
    train_split: str
    image_key: str
    label_key: str
    caption_key: str
    main_metric: str
    class_names: tuple[str, ...] | None = None
    templates: tuple[str, ...] | None = None
    knn_k: int = KNN_K
    knn_temperature: float = KNN_TEMPERATURE

    @property
    def name(self) -> str:
        return f"{self.kind}/{self.dataset}"

    @property
    def class_names_from_tfds(self) -> bool:
        return self.kind == "zeroshot" and self.class_names is None


def read_table(path: str | pathlib.Path = TASK_TABLE) -> dict[str, dict[str, Any]]:
    """The task table: ``{dataset: entry}`` (keys starting with ``_`` are its notes)."""
    with open(path) as f:
        return {k: v for k, v in json.load(f).items() if not k.startswith("_")}


def read_class_names(path: str | pathlib.Path | epath.Path = CLASS_NAMES
                     ) -> dict[str, dict[str, Any]]:
    """``{dataset: {"class_names": [...], "templates": [...], ...}}`` of a class-names file
    (the shipped one, or a user's in its format); a :class:`ConfigError` saying what to change
    for a file that is not: missing, a folder, unreadable, not JSON, not an object of
    datasets, an entry that is not an object with ``class_names`` and/or ``templates``, class
    names or templates that are not a list of strings (a string would be read as its
    characters), a template without exactly one ``{}``."""
    path = epath.Path(path)
    if not path.exists():
        raise ConfigError(f"class names file {path} does not exist")
    if path.is_dir():
        raise ConfigError(f"class names file {path} is a folder; give the JSON file")
    shape = '{"DATASET": {"class_names": ["NAME", ...], "templates": ["a photo of a {}.", ...]}}'
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"class names file {path} is not JSON ({err}); it maps each dataset "
                          'to {"class_names": [...], "templates": [...]}') from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"class names file {path} cannot be read ({err})") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"class names file {path} holds a JSON {type(data).__name__}, not an "
                          f"object of datasets: {shape}")
    out = {}
    for dataset, entry in data.items():
        if dataset.startswith("_"):
            continue
        if not isinstance(entry, Mapping) or not set(entry) & {"class_names", "templates"}:
            raise ConfigError(f"{path}: {dataset!r} must map to an object with class_names "
                              "and/or templates")
        for key in ("class_names", "templates"):
            values = entry.get(key, [])
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise ConfigError(f"{path}: {key} of {dataset!r} must be a list of strings; got "
                                  f"{json.dumps(values)[:80]} (e.g. {shape})")
        for t in entry.get("templates", ()):
            if t.count("{}") != 1:
                raise ConfigError(f"{path}: template {t!r} of {dataset!r} needs exactly one {{}}"
                                  " (the class name)")
        out[dataset] = dict(entry)
    return out


def resolve_tasks(names: Sequence[str], *, overrides: Mapping[str, str] | None = None,
                  class_names_file: str | None = None, knn_k: int = KNN_K,
                  knn_temperature: float = KNN_TEMPERATURE) -> list[Task]:
    """The :class:`Task` of each ``"kind/dataset"`` in ``names``, in order.

    ``overrides``: values of :data:`OVERRIDES` for every task (``test_split``, ``train_split``,
    ``image_key``, ``label_key``, ``caption_key``); a dataset that the table does not hold needs
    at least ``test_split`` (the other keys default to ``image``, ``label``, ``captions/text``
    and ``train``). ``class_names_file``: a file in ``class_names.json``'s format whose entries
    replace the shipped ones (names, templates or both). A zero-shot task on a dataset with no
    recorded names takes the ClassLabel names of the dataset (and the template
    ``"a photo of a {}."`` unless the file gives templates). ``knn_k`` / ``knn_temperature``:
    the ``knn`` tasks' settings (default [DINO]'s 20 and 0.07).

    ConfigError, before anything runs: an unknown kind, an unknown dataset without a test
    split, a kind the table's entry does not serve, a task named twice, an unknown override,
    a ``knn_k`` that is not a positive integer or a ``knn_temperature`` that is not positive.
    """
    overrides = {k: v for k, v in dict(overrides or {}).items() if v}
    unknown = sorted(set(overrides) - set(OVERRIDES))
    if unknown:
        raise ConfigError(f"unknown task settings {unknown}; valid: {list(OVERRIDES)}")
    if isinstance(knn_k, bool) or not isinstance(knn_k, int) or knn_k < 1:
        raise ConfigError(f"the kNN tasks' k must be a positive integer; got {knn_k!r}")
    if isinstance(knn_temperature, bool) or not isinstance(knn_temperature, int | float) or \
            not knn_temperature > 0 or knn_temperature == float("inf"):
        raise ConfigError(f"the kNN tasks' temperature must be a positive number; got "
                          f"{knn_temperature!r}")
    if not names:
        raise ConfigError(f"no tasks: give --tasks=KIND/DATASET,... (kinds: {list(KINDS)}; "
                          f"datasets: {sorted(read_table())})")
    table, recorded = read_table(), read_class_names()
    if class_names_file:
        for dataset, entry in read_class_names(class_names_file).items():
            recorded[dataset] = {**recorded.get(dataset, {}), **entry}
    tasks, seen = [], set()
    for name in names:
        kind, _, dataset = name.strip().partition("/")
        if kind not in KINDS or not dataset:
            raise ConfigError(f"task {name!r} is not KIND/DATASET with KIND one of {list(KINDS)}"
                              " (e.g. zeroshot/cifar10, retrieval/coco_captions)")
        if name in seen:
            raise ConfigError(f"task {name!r} is named twice in --tasks")
        seen.add(name)
        entry = table.get(dataset)
        if entry is None and "test_split" not in overrides:
            raise ConfigError(
                f"dataset {dataset!r} (task {name}) is not in the task table ({sorted(table)}); "
                "for another TFDS dataset give its test split (--split=...) and the keys that "
                "differ from image / label / captions/text (--image_key, --label_key, "
                "--caption_key)")
        if entry is not None and kind not in entry["kinds"]:
            raise ConfigError(f"task {name}: {dataset} serves {entry['kinds']}, not {kind}")
        fields = {**DEFAULT_KEYS, "train_split": "train", **(entry or {}), **overrides}
        names_entry = recorded.get(dataset, {})
        class_names = templates = None
        if kind == "zeroshot":
            class_names = tuple(names_entry["class_names"]) if "class_names" in names_entry \
                else None
            templates = tuple(names_entry.get("templates") or DEFAULT_TEMPLATES)
        tasks.append(Task(
            kind=kind, dataset=dataset, test_split=fields["test_split"],
            train_split=fields["train_split"], image_key=fields["image_key"],
            label_key=fields["label_key"], caption_key=fields["caption_key"],
            main_metric=MAIN_METRICS[kind] if kind == "fewshot" else
            (entry or {}).get("main_metric", MAIN_METRICS[kind]),
            class_names=class_names, templates=templates, knn_k=knn_k,
            knn_temperature=float(knn_temperature)))
    return tasks
