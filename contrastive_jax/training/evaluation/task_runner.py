"""Running a benchmark task (:mod:`~contrastive_jax.training.evaluation.task_table`) with a model:
its features computed in batches, then the metrics of its kind (docs/evaluation.md).

A model enters as a :class:`TaskModel`: the evaluation crop of one image, a batched image
embedder and a text embedder. The evaluation command builds one from ``load_pretrained``
(the source's own preprocessing and tokenizer), or for a SimCLR / MoCo workdir from its
encoder's representations (:mod:`contrastive_jax.evaluate.encoder_model`); a training run from
its state and config.

Memory: features come back to the host batch by batch (the device holds one batch); retrieval
scores are reduced in chunks on the device
(:func:`~contrastive_jax.training.evaluation.retrieval.caption_retrieval_recall`). The host
keeps the features of a split (``n x d`` float32).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

import numpy as np

from contrastive_jax.errors import ConfigError, ContrastiveJaxError
from contrastive_jax.training.data import eval_dataset, open_split
from contrastive_jax.training.data.example_preprocessing import standard_preprocess
from contrastive_jax.training.data.text.prompt_templates import prompt_texts
from contrastive_jax.training.evaluation.classification_metrics import classification_metrics
from contrastive_jax.training.evaluation.probes import (
    fewshot_probe,
    knn_votes,
    linear_probe_logits,
)
from contrastive_jax.training.evaluation.retrieval import caption_retrieval_recall
from contrastive_jax.training.evaluation.task_table import Task
from contrastive_jax.training.evaluation.zero_shot import zero_shot_weights

TEXT_CHUNK = 256  # texts per text-tower call (one compilation for any count)
LINEAR_L2_GRID = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1)


@dataclasses.dataclass(frozen=True)
class TaskModel:
    """What a task needs of a model.

    ``crop(image) -> (S, S, 3) uint8``: the model's evaluation resize of one image (encoded
    bytes or an ``(H, W, 3)`` uint8 array); ``embed_images(batch) -> dict``: a batch of
    ``batch_size`` rows (this process's share: ``"image"`` ``(b, S, S, 3)`` uint8, ``"mask"``
    and other columns) to ``{"features": (n, d), column: (n,)}`` of every process's rows with
    ``mask`` set (the model's normalisation and sample tower inside); ``embed_texts(texts) ->
    (n, d)`` the text tower on the model's own tokenizer (``None``: no text tower).
    ``batch_size`` larger than a split is capped at it (:meth:`batch_for`; the pass says so).
    """

    description: str
    crop: Callable[[Any], np.ndarray]
    embed_images: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]
    embed_texts: Callable[[Sequence[str]], np.ndarray] | None
    batch_size: int
    batch_multiple: int = 1  # a batch's size must be a multiple of it (the data devices)

    def batch_for(self, examples: int) -> int:
        """The batch of a pass over ``examples``: ``batch_size``, or, when that is larger than
        the split, the split rounded up to ``batch_multiple`` (one batch, no padding beyond
        it: a ``batch_size`` of 10^8 on 12 images pads to 12, not 10^8)."""
        whole = -(-max(examples, 1) // self.batch_multiple) * self.batch_multiple
        return min(self.batch_size, whole)


class TaskProgress:
    """A progress line for one pass of a task: ``zeroshot/cifar10 test images  5,120/10,000
    (51%)  812/s  ETA 6 s``, rewritten in place on a terminal, else a line every
    ``every_s`` seconds and one at the end."""

    def __init__(self, label: str, total: int, stream: TextIO | None = None,
                 every_s: float = 10.0):
        self.label, self.total, self.stream = label, total, stream or sys.stderr
        self.every_s, self.done = every_s, 0
        self.start = self.last = time.perf_counter()
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def update(self, count: int) -> None:
        self.done += count
        now = time.perf_counter()
        finished = self.done >= self.total
        if finished or (self.tty and now - self.last > 0.2) or now - self.last > self.every_s:
            self.last = now
            rate = self.done / max(now - self.start, 1e-9)
            eta = (self.total - self.done) / rate if rate else 0.0
            line = (f"{self.label}  {self.done:,}/{self.total:,} "
                    f"({100 * self.done / max(self.total, 1):.0f}%)  {rate:,.0f}/s  "
                    + (f"{now - self.start:.1f} s" if finished else f"ETA {eta:.0f} s"))
            end = "\n" if finished or not self.tty else ""
            print(("\r" if self.tty else "") + line, end=end, file=self.stream, flush=True)


def run_task(task: Task, model: TaskModel, *, data_dir: str | None,
             cache: dict | None = None, stream: TextIO | None = None) -> dict[str, Any]:
    """``{"metrics": {...}, "examples": n, ...}`` of ``task`` on ``model`` (docs/evaluation.md).

    ``cache``: features of a (dataset, split) already computed in this run (a linear, a
    few-shot and a kNN task on one dataset read it once). ConfigError for a split or key the
    dataset lacks, class names of the wrong count, a text task on a model without a text
    tower.
    """
    cache = {} if cache is None else cache
    if task.kind in ("zeroshot", "retrieval") and model.embed_texts is None:
        raise ConfigError(f"{task.name}: the task needs a text tower, and {model.description} "
                          "has none; evaluate it with linear/, fewshot/ or knn/ tasks")
    if task.kind == "retrieval":
        return _retrieval(task, model, data_dir, stream)
    test = _split_features(task, task.test_split, model, data_dir, cache, stream)
    classes = test["num_classes"]
    if task.kind == "zeroshot":
        names = _class_names(task, test)
        prompts = [t for row in prompt_texts(names, task.templates) for t in row]
        embedded = _embed_texts(model, prompts, f"{task.name} prompts", stream)
        weights = zero_shot_weights(embedded.reshape(len(names), len(task.templates), -1))
        x = test["features"] / np.maximum(np.linalg.norm(test["features"], axis=1,
                                                         keepdims=True), 1e-12)
        metrics = classification_metrics(x @ weights.T.astype(x.dtype), test["label"])
        return {"metrics": metrics, "examples": len(x), "classes": len(names),
                "templates": len(task.templates)}
    train = _split_features(task, task.train_split, model, data_dir, cache, stream)
    classes = max(classes, train["num_classes"])
    if task.kind == "linear":
        logits, l2, held = linear_probe_logits(train["features"], train["label"],
                                               test["features"], test["label"],
                                               num_classes=classes, l2_grid=LINEAR_L2_GRID)
        metrics = {**classification_metrics(logits, test["label"]), "l2": l2}
        return {"metrics": metrics, "examples": len(logits),
                "train_examples": len(train["label"]), "classes": classes,
                "holdout_accuracy": {str(k): v for k, v in held.items()}}
    if task.kind == "knn":  # the votes as class scores: acc1, acc5, mean per-class recall
        votes = knn_votes(train["features"], train["label"], test["features"], k=task.knn_k,
                          temperature=task.knn_temperature, num_classes=classes)
        return {"metrics": classification_metrics(votes, test["label"]),
                "examples": len(votes), "train_examples": len(train["label"]),
                "classes": classes, "k": min(task.knn_k, len(train["label"])),
                "temperature": task.knn_temperature}
    metrics = fewshot_probe(train["features"], train["label"], test["features"],
                            test["label"], num_classes=classes)
    return {"metrics": metrics, "examples": len(test["label"]),
            "train_examples": len(train["label"]), "classes": classes}


def _class_names(task: Task, test: dict) -> tuple[str, ...]:
    names = task.class_names
    if names is None:
        names = test["label_names"]
        if not names:
            raise ConfigError(f"{task.name}: no class names recorded for {task.dataset} and its "
                              f"{task.label_key!r} feature has none; give them in a "
                              "--class_names file")
    count = test["num_classes"]
    if count and len(names) != count:
        raise ConfigError(f"{task.name}: {len(names)} class names for the {count} classes of "
                          f"{task.dataset}'s {task.label_key!r}; give one name per class in "
                          "label order (--class_names file)")
    if test["label"].size and test["label"].max() >= len(names):
        raise ConfigError(f"{task.name}: labels up to {test['label'].max()} but "
                          f"{len(names)} class names; give one name per class")
    return tuple(names)


def _open(task: Task, split: str, data_dir: str | None):
    try:
        return open_split(task.dataset, split, data_dir, encoded_images=(task.image_key,))
    except ContrastiveJaxError:
        raise
    except ValueError as err:  # TFDS's word for an unknown dataset
        raise ConfigError(f"{task.name}: {err}") from None


def _label_feature(source, task: Task):
    info = getattr(source, "dataset_info", None)
    features = info.features if info is not None else {}
    feature = features[task.label_key] if task.label_key in features.keys() else None
    names = tuple(getattr(feature, "names", ()) or ())
    if names and all(n.isdigit() for n in names):  # TFDS's placeholders when it has none
        names = ()
    return int(getattr(feature, "num_classes", 0) or 0), names


def _split_features(task: Task, split: str, model: TaskModel, data_dir, cache: dict,
                    stream) -> dict[str, Any]:
    """``{"features" (n, d), "label" (n,), "num_classes", "label_names"}`` of ``split``."""
    key = (task.dataset, split, task.image_key, task.label_key)
    if key in cache:
        return cache[key]
    source = _open(task, split, data_dir)
    num_classes, names = _label_feature(source, task)
    label_of = standard_preprocess((task.label_key,))

    def preprocess(example, epoch: int = 0):
        del epoch
        missing = [k for k in (task.image_key, task.label_key) if k not in example]
        if missing:
            raise ConfigError(f"{task.name}: {task.dataset}[{split}] has no {missing} (its "
                              f"features: {sorted(example)}); give --image_key / --label_key")
        return {"image": model.crop(example[task.image_key]),
                "label": np.asarray(label_of(example)[task.label_key], np.int64)}

    rows = _image_pass(model, source, preprocess, f"{task.name} {split} images", stream)
    out = {"features": rows["features"], "label": rows["label"].astype(np.int64),
           "num_classes": num_classes or int(rows["label"].max(initial=-1) + 1),
           "label_names": names}
    cache[key] = out
    return out


def _image_pass(model: TaskModel, source, preprocess, label: str, stream) -> dict:
    if not len(source):
        raise ConfigError(f"{label}: the split holds no examples; give a split with some "
                          "(--split, --train_split)")
    size = model.batch_for(len(source))
    if size < model.batch_size:
        print(f"{label}: batches of {size:,} (the batch size {model.batch_size:,} is larger "
              f"than the split's {len(source):,} examples)", file=stream or sys.stderr,
              flush=True)
    progress = TaskProgress(label, len(source), stream)
    columns: dict[str, list] = {}
    for batch in eval_dataset(source, global_batch_size=size, preprocess=preprocess):
        rows = model.embed_images(batch)
        for name, value in rows.items():
            columns.setdefault(name, []).append(np.asarray(value))
        progress.update(len(rows["features"]))
    if not columns:
        raise ConfigError(f"{label}: the split is empty")
    return {name: np.concatenate(parts) for name, parts in columns.items()}


def _embed_texts(model: TaskModel, texts: Sequence[str], label: str, stream) -> np.ndarray:
    progress = TaskProgress(label, len(texts), stream)
    out = []
    for start in range(0, len(texts), TEXT_CHUNK):
        chunk = list(texts[start:start + TEXT_CHUNK])
        out.append(np.asarray(model.embed_texts(chunk)))
        progress.update(len(chunk))
    return np.concatenate(out)


def _captions(example, key: str) -> list[str]:
    """The captions of one example under ``key`` (``"captions/text"``: a sequence's field)."""
    value = example
    for part in key.split("/"):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    values = [value] if np.ndim(value) == 0 else list(value)
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values]


def _retrieval(task: Task, model: TaskModel, data_dir, stream) -> dict[str, Any]:
    source = _open(task, task.test_split, data_dir)
    texts, owner = [], []
    progress = TaskProgress(f"{task.name} {task.test_split} captions", len(source), stream)
    for i in range(len(source)):
        captions = _captions(source[i], task.caption_key)
        if captions is None:
            raise ConfigError(f"{task.name}: {task.dataset}[{task.test_split}] has no "
                              f"{task.caption_key!r} (its features: {sorted(source[i])}); give "
                              "--caption_key (a/b for field b of sequence a)")
        texts += captions
        owner += [i] * len(captions)
        progress.update(1)

    def preprocess(example, epoch: int = 0):
        del epoch
        if task.image_key not in example:
            raise ConfigError(f"{task.name}: no {task.image_key!r} in {task.dataset} (its "
                              f"features: {sorted(example)}); give --image_key")
        return {"image": model.crop(example[task.image_key])}

    images = _image_pass(model, source, preprocess,
                         f"{task.name} {task.test_split} images", stream)["features"]
    text_features = _embed_texts(model, texts, f"{task.name} captions", stream)
    metrics = caption_retrieval_recall(images, text_features, np.asarray(owner, np.int64))
    return {"metrics": metrics, "examples": len(images), "captions": len(texts)}
