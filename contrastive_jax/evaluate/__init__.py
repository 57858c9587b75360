"""Evaluate a model on benchmark tasks, the way papers report them.

    python -m contrastive_jax.evaluate --model=SOURCE --tasks=KIND/DATASET,... --output=DIR \\
        [--data_dir=DIR] [--step=N] [--pretrained=TAG] [--tokenizer=PATH] [--batch_size=64]

SOURCE is anything ``load_pretrained`` takes: a converted directory, a trainer workdir (its
latest usable checkpoint, or ``--step``), a big_vision SigLIP ``.npz`` (``--tokenizer`` its
``spiece.model``), an open_clip hub directory, cache or model name (``--pretrained`` a release
tag). The model's own evaluation resize, mean and std and its own tokenizer (context length,
padding, lowercasing or SigLIP's canonicalisation) prepare every image and text. A SimCLR or
MoCo workdir (``projected_encoder``) is evaluated on its encoder's representations ``h``, the
projection head dropped, with the run's evaluation crop and pixels
(:mod:`contrastive_jax.evaluate.encoder_model`); it has no text tower.

Tasks (the datasets' splits and keys: ``contrastive_jax/training/evaluation/task_table.json``;
class names and templates: ``class_names.json``; docs/evaluation.md):

- ``zeroshot/D``: class names x templates (CLIP's prompt ensemble); acc1, acc5,
  mean_per_class_recall;
- ``retrieval/D``: image -> text and text -> image Recall@1/5/10 with every caption of an image
  counted, and their means (``mean_r1``);
- ``linear/D``: logistic regression on frozen image embeddings, the L2 strength chosen on a
  held-out fifth of the training split; acc1, acc5, mean_per_class_recall;
- ``fewshot/D``: big_vision's closed-form probe at 1/5/10/25 shots, 3 seeds, l2 = 2^10;
- ``knn/D``: weighted k-NN on L2-normalised image features, the votes ``sum exp(cos / T)`` of the
  ``--knn_k`` (20) nearest training images per class, ``T = --knn_temperature`` (0.07), as DINO
  reports it; acc1, acc5, mean_per_class_recall.

Datasets are TFDS datasets prepared in ``--data_dir`` (local or ``gs://``; nothing is
downloaded). Another TFDS dataset than the table's: ``--split`` (its test split) and the keys
where they differ (``--image_key``, ``--label_key``, ``--caption_key``, ``--train_split``);
other class names or templates: ``--class_names=FILE`` in ``class_names.json``'s format.

Each task prints a progress line per pass; the end prints one table. ``DIR/results.json``,
``results.csv`` and ``results.md`` are rewritten as each task finishes, atomically
(:mod:`contrastive_jax.evaluate.results_files`). A trainer workdir is read as a resume reads
it: a newer checkpoint that cannot be read, does not match the checksums saved with it or
holds non-finite numbers is passed over with a ``warning:`` line naming it and why, and
``results.json``'s ``source`` records the step evaluated and those passed over.

Mistakes stop before any work with one ``error:`` line and exit 2: an unknown task or
dataset, a malformed ``--class_names`` file, a ``--batch_size`` below 1, an ``--output`` that
is empty, remote, a file, under a file or not writable, or in use by another evaluation (the
folder is locked while a command writes it; the other's pid is named). A ``--batch_size``
larger than a split is capped at the split (the pass says so). A task that fails (a missing
or empty split, class names of the wrong count, a text task without a tokenizer) is recorded
with its error, the others run, and the command exits 2 naming it. A write the system refuses
later (a full disk, a file-size limit) prints the results so far and exits 2 naming the file;
the files keep the last complete write.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from absl import flags

from contrastive_jax import command_line
from contrastive_jax.errors import ConfigError, ContrastiveJaxError

FLAGS = flags.FlagValues()  # this command's own (contrastive_jax.command_line)
_MODEL = flags.DEFINE_string("model", None, "the model: a converted directory, a trainer "
                             "workdir, a big_vision .npz, an open_clip directory or name",
                             flag_values=FLAGS)
_TASKS = flags.DEFINE_list("tasks", None, "KIND/DATASET,... (kinds: zeroshot, retrieval, "
                           "linear, fewshot, knn)", flag_values=FLAGS)
_OUTPUT = flags.DEFINE_string("output", None, "directory for results.json, .csv, .md",
                              flag_values=FLAGS)
_DATA_DIR = flags.DEFINE_string("data_dir", None, "where the TFDS datasets are prepared "
                                "(default: TFDS's own, $TFDS_DATA_DIR)", flag_values=FLAGS)
_STEP = flags.DEFINE_integer("step", None, "with a workdir: this checkpoint step",
                             flag_values=FLAGS)
_PRETRAINED = flags.DEFINE_string("pretrained", None, "with an open_clip model name: the "
                                  "release tag", flag_values=FLAGS)
_TOKENIZER = flags.DEFINE_string("tokenizer", None, "the tokenizer file when the source has "
                                 "none (CLIP's BPE merges, SigLIP's spiece.model)",
                                 flag_values=FLAGS)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 64, "images per forward pass",
                                   flag_values=FLAGS)
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "compute dtype",
                           flag_values=FLAGS)
_SPLIT = flags.DEFINE_string("split", None, "the test split of every task (default: the "
                             "table's)", flag_values=FLAGS)
_TRAIN_SPLIT = flags.DEFINE_string("train_split", None, "the probes' training split (default: "
                                   "the table's)", flag_values=FLAGS)
_IMAGE_KEY = flags.DEFINE_string("image_key", None, "the image feature (default: the "
                                 "table's, else image)", flag_values=FLAGS)
_LABEL_KEY = flags.DEFINE_string("label_key", None, "the label feature (default: the "
                                 "table's, else label)", flag_values=FLAGS)
_CAPTION_KEY = flags.DEFINE_string("caption_key", None, "the captions (a/b: field b of the "
                                   "sequence a; default: the table's, else captions/text)",
                                   flag_values=FLAGS)
_KNN_K = flags.DEFINE_integer("knn_k", 20, "knn tasks: the neighbours that vote",
                              flag_values=FLAGS)
_KNN_TEMPERATURE = flags.DEFINE_float("knn_temperature", 0.07, "knn tasks: the vote "
                                      "temperature T (weights exp(cos / T))", flag_values=FLAGS)
_CLASS_NAMES = flags.DEFINE_string("class_names", None, "a JSON file of class names and "
                                   "templates per dataset, replacing the shipped ones",
                                   flag_values=FLAGS)
COMMAND = command_line.Command(program="python -m contrastive_jax.evaluate", doc=__doc__,
                               flag_values=FLAGS, required=("model", "tasks", "output"))


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (module docstring; ``argv``: its arguments, ``sys.argv[1:]`` when
    None): 0 when every task ran; an error a user can fix prints ``error: ...`` and returns 2
    (:func:`contrastive_jax.command_line.run_command`)."""
    return command_line.run_command(COMMAND, _evaluate, argv)


def pretrained_task_model(model, preprocess, tokenizer, *, batch_size: int,
                          description: str):
    """The :class:`~contrastive_jax.training.evaluation.task_runner.TaskModel` of
    ``load_pretrained``'s three: ``preprocess.crop`` per image, then ``(x / 255 - mean) / std``
    on the host (exactly ``preprocess``'s arithmetic) and ``model.embed_samples`` jitted on
    batches of ``batch_size``; ``tokenizer``'s ids (``None``: no text tasks) and
    ``model.embed_texts`` on chunks of a fixed size (one compilation)."""
    import jax
    from flax import nnx

    from contrastive_jax.training.evaluation.task_runner import TEXT_CHUNK, TaskModel

    graphdef, state = nnx.split(model)
    mean = np.asarray(preprocess.mean, np.float32)
    std = np.asarray(preprocess.std, np.float32)
    images = jax.jit(lambda s, x: nnx.merge(graphdef, s).embed_samples(x))
    texts = jax.jit(lambda s, ids: nnx.merge(graphdef, s).embed_texts(ids))

    def embed_images(batch) -> dict[str, np.ndarray]:
        x = (np.asarray(batch["image"]).astype(np.float32) / 255.0 - mean) / std
        keep = np.asarray(batch["mask"], bool)
        out = {k: np.asarray(v)[keep] for k, v in batch.items() if k not in ("image", "mask")}
        return {"features": np.asarray(images(state, x))[keep], **out}

    def embed_texts(strings) -> np.ndarray:
        ids = tokenizer(list(strings))
        n = len(ids)
        pad = -n % TEXT_CHUNK
        ids = np.concatenate([ids, np.repeat(ids[:1], pad, axis=0)]) if pad else ids
        return np.concatenate([np.asarray(texts(state, ids[i:i + TEXT_CHUNK]))
                               for i in range(0, len(ids), TEXT_CHUNK)])[:n]

    has_texts = tokenizer is not None and hasattr(model, "embed_texts")
    return TaskModel(description=description, crop=preprocess.crop,
                     embed_images=embed_images, embed_texts=embed_texts if has_texts else None,
                     batch_size=batch_size)


def _evaluate(positional: list[str]) -> None:
    from contrastive_jax.evaluate.results_files import output_folder
    from contrastive_jax.training.evaluation.task_table import resolve_tasks

    if _BATCH_SIZE.value < 1:
        raise ConfigError(f"--batch_size must be a positive integer; got {_BATCH_SIZE.value}")
    tasks = resolve_tasks(_TASKS.value, class_names_file=_CLASS_NAMES.value, overrides={
        "test_split": _SPLIT.value, "train_split": _TRAIN_SPLIT.value,
        "image_key": _IMAGE_KEY.value, "label_key": _LABEL_KEY.value,
        "caption_key": _CAPTION_KEY.value}, knn_k=_KNN_K.value,
        knn_temperature=_KNN_TEMPERATURE.value)
    with output_folder(_OUTPUT.value) as output:  # checked and locked before any work
        _run_tasks(tasks, str(output))


def _read_model(text_tasks: list[str]):
    """``(source, model, preprocess, tokenizer)`` of ``--model``: the source read once
    (:func:`~contrastive_jax.pretrained.read_source`), each checkpoint of a workdir passed over
    said on stderr, then ``load_pretrained``'s three; ``(source, None, None, None)`` for a
    projected encoder's workdir (:mod:`~contrastive_jax.evaluate.encoder_model`)."""
    from contrastive_jax.pretrained import load_pretrained, read_source, with_weights

    choice: Any = _TOKENIZER.value if _TOKENIZER.value else (None if text_tasks else False)
    source = with_weights(read_source(_MODEL.value, pretrained=_PRETRAINED.value,
                                      step=_STEP.value))
    for why in source.skipped:
        print(f"warning: {_MODEL.value}: {why}; evaluating step {source.step}, the newest "
              "usable checkpoint", file=sys.stderr, flush=True)
    from contrastive_jax.evaluate.encoder_model import ENCODER_MODELS

    if source.kind == "workdir" and source.model.get("name") in ENCODER_MODELS:
        return source, None, None, None
    try:
        model, preprocess, tokenizer = load_pretrained(source, tokenizer=choice,
                                                       dtype=_DTYPE.value)
    except ConfigError as err:
        if text_tasks and "tokenizer" in str(err):
            raise ConfigError(f"{err} (the tasks {text_tasks} embed texts; without them the "
                              "image tasks run with no tokenizer)") from None
        raise
    if preprocess is None:
        raise ConfigError(f"{_MODEL.value} records no image preprocessing (size, mean, std); "
                          "convert it with its preprocess.json, or train with "
                          "data.preprocess.name = 'image_text'")
    return source, model, preprocess, tokenizer


def _run_tasks(tasks: list, output: str) -> None:
    """Every task on ``--model``, ``results.*`` in ``output`` rewritten after each (module
    docstring)."""
    from contrastive_jax.errors import WorkdirError
    from contrastive_jax.evaluate.results_files import results_table, write_results
    from contrastive_jax.training.evaluation.task_runner import run_task
    from contrastive_jax.training.run.provenance import provenance

    text_tasks = [t.name for t in tasks if t.kind in ("zeroshot", "retrieval")]
    source, model, preprocess, tokenizer = _read_model(text_tasks)
    description = _MODEL.value + (f" (step {source.step})" if source.step is not None else "")
    if model is None:  # a SimCLR / MoCo workdir: the encoder's representations
        from contrastive_jax.evaluate.encoder_model import encoder_task_model

        task_model, pixels = encoder_task_model(source, batch_size=_BATCH_SIZE.value,
                                                dtype=_DTYPE.value, description=description)
    else:
        task_model = pretrained_task_model(model, preprocess, tokenizer,
                                           batch_size=_BATCH_SIZE.value,
                                           description=description)
        pixels = {"image_size": preprocess.image_size, "mean": list(preprocess.mean),
                  "std": list(preprocess.std), "interpolation": preprocess.interpolation,
                  "resize_mode": preprocess.resize_mode}
    record: dict[str, Any] = {
        "model": description,
        "source": {"kind": source.kind, "location": source.location, "step": source.step,
                   "skipped": list(source.skipped)},
        "command": {name: FLAGS[name].value for name in (
            "model", "tasks", "data_dir", "step", "pretrained", "tokenizer", "batch_size",
            "dtype", "split", "train_split", "image_key", "label_key", "caption_key",
            "class_names", "knn_k", "knn_temperature")},
        "preprocess": pixels,
        "provenance": provenance(), "tasks": {}}
    cache: dict = {}
    failed = []
    for task in tasks:
        start = time.perf_counter()
        entry = {"kind": task.kind, "dataset": task.dataset, "split": task.test_split}
        try:
            result = run_task(task, task_model, data_dir=_DATA_DIR.value, cache=cache)
        except ContrastiveJaxError as err:
            message = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
            if not message.startswith(f"{task.name}: "):  # task_runner's errors name the task
                message = f"{task.name}: {message}"
            print(f"error: {message}", file=sys.stderr, flush=True)
            entry.update(status="failed", error=message)
            failed.append(task.name)
        else:
            entry.update(status="ok", main_metric=task.main_metric, **result,
                         seconds=round(time.perf_counter() - start, 2))
            if task.kind in ("linear", "fewshot", "knn"):
                entry["train_split"] = task.train_split
            print(f"{task.name}: {task.main_metric} "
                  f"{result['metrics'][task.main_metric]:.4f}", flush=True)
        record["tasks"][task.name] = entry
        try:
            write_results(output, record)
        except WorkdirError as err:  # a full disk, a size limit: the numbers on the console
            print(results_table(record), end="", flush=True)
            raise WorkdirError(f"{err}; the results of the {len(record['tasks'])} tasks run so "
                               "far are printed above, the folder keeps those of the last "
                               "write that succeeded") from None
    print(results_table(record), end="")
    print(f"wrote {output}/results.json, results.csv, results.md")
    if failed:
        ran = len(tasks) - len(failed)
        raise ConfigError(f"{len(failed)} of {len(tasks)} tasks failed ({', '.join(failed)}: "
                          f"their errors are above and in {output}/results.json); "
                          + (f"the other {ran} tasks' results are written" if ran else
                             "no task has a result"))
