"""The benchmark tasks of ``evaluation.tasks`` (the evaluation command's tasks,
docs/evaluation.md) on the model of a training run: :func:`check_tasks` when the run starts,
:func:`run_task_model` (the run's model as a
:class:`~contrastive_jax.training.evaluation.task_runner.TaskModel`, on the run's mesh) and
:func:`benchmark_tasks` at each evaluation, with the inference functions of
:mod:`~contrastive_jax.training.evaluation.run_evaluation`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from contrastive_jax.errors import ConfigError
from contrastive_jax.mesh import DATA_AXIS, global_batch
from contrastive_jax.training.augmentations.pixels import pixel_normalization
from contrastive_jax.training.data.example_preprocessing import decodes_images, evaluation_resize
from contrastive_jax.training.data.image_crops import evaluation_image, open_image
from contrastive_jax.training.evaluation.run_evaluation import (
    gathered,
    inference_functions,
    run_tokenizer,
    sample_embedder,
)
from contrastive_jax.training.evaluation.task_runner import TEXT_CHUNK, TaskModel, run_task
from contrastive_jax.training.evaluation.task_table import resolve_tasks

TASK_FIELDS = ("tasks", "tasks_data_dir", "tasks_batch_size", "tasks_class_names")


def run_task_model(graphdef, state, config, mesh) -> TaskModel:
    """The run's model as a benchmark-task model
    (:class:`~contrastive_jax.training.evaluation.task_runner.TaskModel`).

    Images: with the ``image_text`` or ``image`` preprocessing, the evaluation crop of
    ``data.preprocess`` (``image_size``, ``resize``, ``resize_mode``; decoded in full, as in
    :func:`zero_shot_samples`), otherwise the image as stored (the standard preprocessing: the
    dataset's images must have the model's input size); then on the device the run's own
    normalisation and, for a dual encoder, ``embed_samples`` (the embedding its loss
    compares), else the encoder features (as the run's linear probe). Batches of
    ``evaluation.tasks_batch_size`` (0: ``data.eval_batch_size``), split over the mesh's data
    axis, every process's rows gathered. Texts: the run's tokenizer (:func:`run_tokenizer`)
    and ``embed_texts``, ``TEXT_CHUNK`` a call; ``None`` without a text tower.
    """
    ev, pre = config.evaluation, config.data.get("preprocess", {})
    size = ev.get("tasks_batch_size", 0) or config.data.eval_batch_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"evaluation.tasks_batch_size must be a positive integer (0: "
                          f"data.eval_batch_size); got {size!r}")
    if decodes_images(pre):
        crop = functools.partial(evaluation_image, size=pre.get("image_size", 224),
                                 resize=evaluation_resize(pre),
                                 resize_mode=pre.get("resize_mode", "shortest"),
                                 reduced_decode=False)
    else:
        def crop(image):
            return np.asarray(open_image(image)) if isinstance(image, bytes | np.bytes_) \
                else np.asarray(image)
    model = nnx.merge(graphdef, state.params, state.rest)
    dual = hasattr(model, "embed_texts")
    embed = sample_embedder(graphdef, pixel_normalization(pre), mesh) if dual else \
        inference_functions(graphdef, config, mesh)[0]

    def embed_images(batch) -> dict[str, np.ndarray]:
        batch = global_batch(dict(batch), mesh)
        names = [k for k in batch if k not in ("image", "mask")]
        rows = gathered((embed(state.params, state.rest, batch["image"]),
                          *(batch[k] for k in names)), batch["mask"])
        return dict(zip(["features", *names], rows, strict=True))

    embed_texts = None
    if dual:
        tokenizer, max_tokens = run_tokenizer(config)
        texts = inference_functions(graphdef, config)[2]

        def embed_texts(strings) -> np.ndarray:
            ids = tokenizer.encode(list(strings), max_tokens)
            n = len(ids)
            ids = np.concatenate([ids, np.repeat(ids[:1], -n % TEXT_CHUNK, axis=0)])
            return np.concatenate([np.asarray(texts(state.params, state.rest,
                                                    jnp.asarray(ids[i:i + TEXT_CHUNK])))
                                   for i in range(0, len(ids), TEXT_CHUNK)])[:n]

    return TaskModel(description=f"the {config.model.get('name', 'model')} of this run",
                     crop=crop, embed_images=embed_images, embed_texts=embed_texts,
                     batch_size=size, batch_multiple=int(mesh.shape[DATA_AXIS]) if mesh
                     is not None and DATA_AXIS in mesh.shape else 1)


def benchmark_tasks(graphdef, state, config, mesh) -> dict[str, float]:
    """``{"KIND/DATASET/METRIC": value}`` of every task of ``evaluation.tasks`` (each task's
    main metric first), on ``evaluation.tasks_data_dir`` (``""``: ``data.data_dir``), with
    ``evaluation.tasks_class_names`` (a class-names file, ``""``: the shipped ones) and
    ``evaluation.task_overrides`` (the task table's splits and keys, for every task); the
    evaluation command's tasks and metrics (docs/evaluation.md) on :func:`run_task_model`.
    Progress lines on process 0's stderr. A task that fails stops the evaluation with its
    ConfigError (the tasks are resolved when the run starts: :func:`check_tasks`)."""
    ev = config.evaluation
    tasks = check_tasks(config)
    if not tasks:
        return {}
    model = run_task_model(graphdef, state, config, mesh)
    data_dir = ev.get("tasks_data_dir") or config.data.get("data_dir") or None
    out: dict[str, float] = {}
    cache: dict = {}
    with open(os.devnull, "w") if jax.process_index() else contextlib.nullcontext(
            sys.stderr) as stream:
        for task in tasks:
            metrics = run_task(task, model, data_dir=data_dir, cache=cache,
                               stream=stream)["metrics"]
            for name in [task.main_metric, *(m for m in metrics if m != task.main_metric)]:
                out[f"{task.name}/{name}"] = float(metrics[name])
    return out


def check_tasks(config) -> list:
    """The :class:`~contrastive_jax.training.evaluation.task_table.Task` of each name in
    ``evaluation.tasks`` (ConfigError for an unknown kind, dataset or field, or a text task on
    a model without a text tower: checked when the run starts, not at its first
    evaluation)."""
    ev = config.evaluation
    names = ev.get("tasks") or ()
    if isinstance(names, str):
        raise ConfigError(f"evaluation.tasks must be a tuple of task names; got the string "
                          f"{names!r} (on the command line: "
                          "--config.evaluation.tasks=\"('zeroshot/cifar10', 'linear/cifar10')\")")
    if not names:
        return []
    try:
        overrides = ev.get("task_overrides") or {}
        tasks = resolve_tasks(list(names), class_names_file=ev.get("tasks_class_names") or None,
                              overrides=dict(overrides), knn_k=ev.get("knn_k", 20),
                              knn_temperature=ev.get("knn_temperature", 0.07))
    except ConfigError as err:
        raise ConfigError(f"evaluation.tasks: {err}") from None
    text = [t.name for t in tasks if t.kind in ("zeroshot", "retrieval")]
    if text and config.model.get("name") != "dual_encoder":
        raise ConfigError(f"evaluation.tasks: {text} need a text tower, and model.name = "
                          f"{config.model.get('name')!r} has none; keep the linear/, "
                          "fewshot/ and knn/ tasks")
    return tasks
