"""What every training config shares (:func:`base_config`) and big_vision-style variants.

``--config=configs/x.py:batch=256,quick``: the text after ``:`` reaches ``get_config(arg)``;
:func:`parse` turns it into a ConfigDict of the variant's knobs: ``key=value`` pairs (values
parsed as Python literals when they are, else kept as strings) and bare words (``quick`` ->
``quick=True``). Only keys with a default are accepted; an unknown one is a ValueError naming
the closest valid key.

A ``--config.a.b=value`` flag can set only a field the config file writes, so every shipped
config writes the model-wide settings (:func:`model_wide`); an override of a field it does not
write is a ConfigError saying what works instead (:func:`contrastive_jax.main.
parse_trainer_flags`).
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Mapping
from typing import Any

import ml_collections
from ml_collections.config_dict import placeholder

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.step import state_sharding


def parse(arg: str | None, **defaults) -> ml_collections.ConfigDict:
    """The variant knobs: ``defaults`` updated by ``arg`` (``"a=1,b=x,flag"``)."""
    values = dict(defaults)
    for item in filter(None, (arg or "").split(",")):
        key, sep, raw = item.partition("=")
        key = key.strip()
        if key not in defaults:
            close = difflib.get_close_matches(key, list(defaults), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"unknown config variant {key!r}{hint} valid: {sorted(defaults)}")
        if not sep:
            values[key] = True
            continue
        values[key] = _literal(raw)
    return ml_collections.ConfigDict(values)


def _literal(raw: str):
    """A Python literal (``256``, ``0.2``, ``True``, ``(1, 2)``), ``nan`` / ``inf`` as floats,
    else the string itself (``loss=siglip``)."""
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        pass
    try:
        return float(raw)  # nan, inf, -inf
    except ValueError:
        return raw


def base_config() -> ml_collections.ConfigDict:
    """The run-level fields of every training config (each config sets data, model, loss...).

    ``total_steps`` (0: from ``num_epochs``), ``log_every``, ``checkpoint_every``,
    ``keep_checkpoints``, ``checkpoint_timeout_s`` (the longest a save may take),
    ``evaluation`` (its ``evaluators``: linear probe, kNN, alignment/uniformity, and for
    dual encoders retrieval and zero-shot, at the end and every ``every`` steps if > 0;
    :mod:`contrastive_jax.training.evaluation.evaluators`), ``mesh`` (axis sizes;
    ``-1`` takes the rest of the devices), ``sharding`` (the train state replicated or FSDP,
:mod:`contrastive_jax.training.step.state_sharding`), ``launch`` (multi-process settings,
    :func:`contrastive_jax.training.run.launch.distributed.launch_settings`; empty: from the
    environment, else a single process), ``profile`` (a ``jax.profiler`` trace of chosen steps in
    ``workdir/profile``, :mod:`contrastive_jax.training.run.profiling`; off by default),
    ``transfer_guard`` (the loop between its sync points, :func:`contrastive_jax.training.
    train.train_and_evaluate`), ``log_model_flops`` (TFLOP/s and MFU on the progress line,
    :mod:`contrastive_jax.training.step.model_flops`).
    """
    return ml_collections.ConfigDict({
        "seed": 0,
        # the method (contrastive_jax.training.methods): "simclr" | "moco" | "moco_v3" | "clip" |
        # "siglip" | "mi_critic"; "" follows loss.name
        "method": "",
        "num_epochs": 100.0,
        "total_steps": 0,
        "log_every": 50,
        "checkpoint_every": 500,
        "keep_checkpoints": 3,
        # the longest a checkpoint save may take (orbax's own default); with several processes
        # a process whose write fails or stalls makes the others stop after it (their wait at
        # the save's barrier; docs/reliability.md "Multi-host faults")
        "checkpoint_timeout_s": 1200,
        # K micro-batches per global batch, gradient unchanged (exact accumulation,
        # contrastive_jax.training.step.accumulation); the micro-batch B/K must divide over the
        # data devices
        "accumulation_steps": 1,
        # non-finite steps in a row before the run stops, and a run whose last update was
        # skipped stops too (0: neither)
        "max_skipped_in_a_row": 10,
        # evaluators: the named evaluations to run ("classification", "geometry",
        # "retrieval", "zero_shot", "tasks"); () = those the fields below ask for
        # (contrastive_jax.training.evaluation.evaluators)
        "evaluation": {"enabled": True, "every": 0, "evaluators": (),
                       "knn_k": 20, "knn_temperature": 0.07,
                       "l2_grid": (1e-6, 1e-5, 1e-4, 1e-3, 1e-2),
                       "classification": True,  # linear probe + kNN (needs labels)
                       # dual encoders: class prompts of this modality ("signal" | "image",
                       # contrastive_jax/training/data/text/captions.py) for zero-shot; "" = none
                       "zero_shot_prompts": "",
                       # dual encoders: zero-shot with class names (a tuple, a file with one
                       # per line, or "tfds": the ClassLabel names; "" = none) and templates
                       # ("imagenet" | "imagenet_selected" | "simple" | a tuple with {}),
                       # tokenised by data.preprocess.tokenizer, on dataset[split] ("": the
                       # run's data and eval split); docs/pretrained.md
                       "zero_shot": {
                           "class_names": ml_collections.FieldReference("", field_type=object),
                           "templates": ml_collections.FieldReference("imagenet",
                                                                      field_type=object),
                           "dataset": "", "split": "", "input_key": "",  # "": input_key
                           "label_key": "label", "batch_size": 0},  # 0: data.eval_batch_size
                       # dual encoders: retrieval counts a candidate as correct when this batch
                       # feature equals the query's ("caption_id", "label"); "" = its own pair
                       "retrieval_match": "",
                       # benchmark tasks ("zeroshot/cifar10", "retrieval/coco_captions", ...:
                       # docs/evaluation.md) at each evaluation, on TFDS sets in tasks_data_dir
                       # ("": data.data_dir), batches of tasks_batch_size (0:
                       # data.eval_batch_size), class names from tasks_class_names ("": shipped),
                       # task_overrides for every task ("": the task table's value)
                       "tasks": (), "tasks_data_dir": "", "tasks_batch_size": 0,
                       "tasks_class_names": "", "task_overrides": {
                           "test_split": "", "train_split": "", "image_key": "",
                           "label_key": "", "caption_key": ""}},
        "mesh": {"data": -1},
        # where the train state lives: "replicated" | "fsdp" (split over fsdp_axis), with
        # exceptions by regex (contrastive_jax.training.step.state_sharding)
        "sharding": state_sharding.default_sharding_config(),
        # unset (None): from CONTRASTIVE_JAX_* environment variables, else one process
        "launch": {"mode": placeholder(str), "coordinator_address": placeholder(str),
                   "num_processes": placeholder(int), "process_id": placeholder(int),
                   "initialization_timeout_s": 300, "heartbeat_timeout_s": 100},
        # a jax.profiler trace of steps start_step .. start_step + num_steps - 1 (1-based, as
        # the progress lines count; step 1 includes the compilation) in
        # workdir/profile/process_<i>, process 0's or, with all_hosts, every process's
        # (contrastive_jax.training.run.profiling; docs/training.md "Profiling"); 0 steps: off
        "profile": {"start_step": 0, "num_steps": 0, "all_hosts": False},
        # the training loop's steps between its sync points (logging, checkpoints,
        # evaluation, the one-step-delayed guard read) run under
        # jax.transfer_guard_device_to_host(transfer_guard): "allow" | "log" | "disallow"
        # ("disallow": any other device read is an error, to find a host stall)
        "transfer_guard": "allow",
        # model TFLOP/s per chip and MFU on the progress line: the step's model FLOPs
        # counted once by XLA (contrastive_jax.training.step.model_flops), while the first
        # step compiles
        "log_model_flops": True,
    })


TINY_SIGNAL_CNN = {"channels": (8, 8, 8), "features": 16}


def make_quick(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The run-level part of every config's ``quick`` variant (a smoke test in seconds):
    global batch 64, 6 steps, logs every 2, checkpoints every 3, one warmup step, the dense
    loss (fastest to compile at this size), one probe regulariser. Each config then shrinks
    its own model."""
    config.data.batch_size = 64
    config.total_steps = 6
    config.log_every = 2
    config.checkpoint_every = 3
    config.optimizer.warmup_steps = 1
    config.loss.impl = "autodiff"
    config.evaluation.l2_grid = (1e-4,)
    return config


class AnySetting(ml_collections.FieldReference):
    """A config field that takes a value of any type (``model.remat``: a bool, a policy name
    or one entry per tower), from Python or the command line; a mapping becomes a
    ConfigDict, as a plain field's would, so the config still freezes
    (``ml_collections.FrozenConfigDict`` refuses a dict)."""

    def __init__(self, default: Any):
        super().__init__(self._converted(default), field_type=object)

    def set(self, value: Any, type_safe: bool = True) -> None:
        super().set(self._converted(value), type_safe)

    @staticmethod
    def _converted(value: Any) -> Any:
        if isinstance(value, Mapping) and not isinstance(value, ml_collections.ConfigDict):
            return ml_collections.ConfigDict(value)
        return value


def model_wide(dtype: str = "float32", remat: Any = False, attention: str | None = None
               ) -> dict[str, Any]:
    """The model-wide settings a config's ``model`` block writes out so that the command line
    can set them (:mod:`contrastive_jax.training.models`): ``dtype``, ``remat`` (an
    :class:`AnySetting`: ``--config.model.remat=True``, a policy name such as
    ``dots_saveable``, or one entry per tower, ``"{'sample_encoder': 'dots_saveable'}"``) and,
    for a model with Transformer towers, ``attention`` (``None``: not written). The defaults
    are the values a block without them runs with."""
    block = {"dtype": dtype, "remat": AnySetting(remat)}
    if attention is not None:
        block["attention"] = attention
    return block
