"""Progress of a run: console lines, TensorBoard scalars and ``metrics.jsonl`` in the workdir.

Only process 0 writes. A console line looks like::

    step   200/1560 | loss 5.012 | top1 0.613 | mi 1.91 | temp 0.200 | 6,820 ex/s | ETA 0:00:41

with ``| skipped N`` before the rate once the run has skipped N updates as non-finite
(:func:`contrastive_jax.training.step.train_step.train_step`).

The metrics of a line (and of its TensorBoard scalars and JSON record) are means over the steps
since the previous line (:class:`MetricWindow`), not one noisy step; the step counters
(``skipped``, ``skipped_in_a_row``) and ``learning_rate`` are the last step's. ``examples/s``
counts global examples over the wall time since the previous line (so it includes data loading
and logging), and the ETA extrapolates it to the remaining steps.

On a remote workdir (``gs://``, :mod:`~contrastive_jax.training.run.workdir.workdir_path`)
both files go through :class:`etils.epath.Path`; an object cannot be appended to, so each is
kept in memory and uploaded whole: ``metrics.jsonl`` at every line (a resumed run first reads
the lines before it), the TensorBoard event file whenever tensorboardX flushes (every 120 s and
at the end).

The trainer's status lines name a config's non-default scale settings (:func:`scale_settings`)
and what an evaluation computes (:func:`evaluation_names`).
"""

from __future__ import annotations

import datetime
import io
import os
import sys
import time
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

from contrastive_jax.training.run.workdir import json_output
from contrastive_jax.training.run.workdir.workdir_path import is_remote

CONSOLE_KEYS = (("loss", "loss", "{:.4f}"), ("top1", "top1", "{:.3f}"),
                ("mi_bound", "mi", "{:.2f}"), ("logit_scale", "scale", "{:.2f}"),
                ("bias", "bias", "{:+.2f}"), ("temperature", "temp", "{:.3f}"))
LAST_VALUE = ("skipped", "skipped_in_a_row", "learning_rate")  # not averaged over a window


@jax.jit
def _as_float(metrics):
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), metrics)


@jax.jit
def _add(total, metrics):
    return jax.tree.map(lambda a, b: a + b.astype(a.dtype), total, metrics)


class MetricWindow:
    """The running sum of each step's metrics on the device (one small jitted add per step,
    nothing copied to the host), read as means at a logging step."""

    def __init__(self):
        self._sum, self._last, self.count = None, None, 0

    def add(self, metrics: Mapping[str, jax.Array]) -> None:
        self._sum = _as_float(metrics) if self._sum is None else _add(self._sum, metrics)
        self._last, self.count = metrics, self.count + 1

    def mean(self) -> dict[str, float]:
        """The mean of each metric over the steps added since the last call (the last step's
        value for :data:`LAST_VALUE`), and a new, empty window."""
        total, last = jax.device_get((self._sum, self._last))
        out = {k: float(last[k]) if k in LAST_VALUE else float(v) / self.count
               for k, v in total.items()}
        self._sum, self._last, self.count = None, None, 0
        return out


class RemoteTextLog:
    """A text file on remote storage written like one opened with ``"a"``: the object's
    existing text (read at open) and every write kept in memory, the whole uploaded at each
    :meth:`flush` (an object store has no append)."""

    def __init__(self, path: epath.Path):
        self.path = epath.Path(path)
        self._parts = [self.path.read_text()] if self.path.exists() else []
        self._dirty = False

    def write(self, text: str) -> None:
        self._parts.append(text)
        self._dirty = True

    def flush(self) -> None:
        if self._dirty:
            self.path.write_text("".join(self._parts))
            self._dirty = False

    def close(self) -> None:
        self.flush()


class RemoteRecordFile:
    """A TensorBoard event file on remote storage for tensorboardX's record writer: the bytes
    kept in memory, uploaded whole through :class:`etils.epath.Path` at each :meth:`flush`."""

    def __init__(self, path: str):
        self.path = epath.Path(path)
        self._buffer, self._uploaded = io.BytesIO(), -1

    def write(self, data: bytes) -> None:
        self._buffer.write(data)

    def flush(self) -> None:
        if self._buffer.tell() != self._uploaded:
            self.path.write_bytes(self._buffer.getvalue())
            self._uploaded = self._buffer.tell()

    def close(self) -> None:
        self.flush()


class RemoteRecordFiles:
    """tensorboardX's writer factory for ``gs://`` (:func:`use_epath_for_tensorboard`)."""

    def open(self, path: str) -> RemoteRecordFile:
        return RemoteRecordFile(path)

    def directory_check(self, path: str) -> None:
        """Nothing to create: an object store has no directories."""


def use_epath_for_tensorboard() -> None:
    """Route tensorboardX's ``gs://`` event files through :class:`RemoteRecordFile` (epath,
    gcsfs), like every other file of the workdir, instead of its own google-cloud-storage
    writer (whose ``__del__`` uploads the file once more whenever the garbage collector gets to
    it). Process-wide."""
    from tensorboardX import record_writer

    record_writer.register_writer_factory("gs", RemoteRecordFiles())


class Progress:
    """Logs every ``every`` steps and on demand; ``close()`` flushes the writers."""

    def __init__(self, workdir: str | os.PathLike, total_steps: int, global_batch: int,
                 every: int, start_step: int = 0):
        self.total, self.batch, self.every = total_steps, global_batch, max(1, every)
        self.is_writer = jax.process_index() == 0
        self._last_step, self._last_time = start_step, time.perf_counter()
        self.start_time = time.perf_counter()
        self._tb = self._jsonl = None
        if self.is_writer:
            from tensorboardX import SummaryWriter

            workdir = epath.Path(workdir)
            if is_remote(workdir):
                use_epath_for_tensorboard()
                self._jsonl = RemoteTextLog(workdir / "metrics.jsonl")
            else:
                self._jsonl = open(workdir / "metrics.jsonl", "a")
            self._tb = SummaryWriter(os.fspath(workdir / "tensorboard"))

    def restart_clock(self, step: int) -> None:
        """Measure examples/s from here (call after the first, compiling, step)."""
        self._last_step, self._last_time = step, time.perf_counter()

    def due(self, step: int) -> bool:
        """Whether ``step`` (1-based, completed steps) is a logging step."""
        return step % self.every == 0 or step == self.total

    def log_train(self, step: int, metrics: Mapping[str, float]) -> None:
        """One console line, TensorBoard scalars ``train/<name>``, one JSON line."""
        now = time.perf_counter()
        rate = (step - self._last_step) * self.batch / max(now - self._last_time, 1e-9)
        self._last_step, self._last_time = step, now
        values = {k: float(np.asarray(v)) for k, v in metrics.items()}
        values["examples_per_s"] = rate
        eta = (self.total - step) * self.batch / rate if rate > 0 else float("nan")
        if not self.is_writer:
            return
        parts = [f"step {step:>6}/{self.total}"]
        parts += [f"{label} {fmt.format(values[key])}" for key, label, fmt in CONSOLE_KEYS
                  if key in values]
        if values.get("skipped", 0) > 0:  # updates skipped as non-finite so far (the guard)
            parts.append(f"skipped {values['skipped']:.0f}")
        parts.append(f"{rate:,.0f} ex/s")
        parts.append("ETA " + (str(datetime.timedelta(seconds=round(eta)))
                               if np.isfinite(eta) else "?"))
        print(" | ".join(parts), flush=True)
        self.scalars("train", step, values)

    def scalars(self, prefix: str, step: int, values: Mapping[str, float]) -> None:
        """TensorBoard scalars ``prefix/<name>`` and a JSON line ``{"step", "prefix", ...}``."""
        if not self.is_writer:
            return
        for key, value in values.items():
            self._tb.add_scalar(f"{prefix}/{key}", float(value), step)
        record = {"step": step, "prefix": prefix,
                  "wall_s": round(time.perf_counter() - self.start_time, 3),
                  **{k: float(v) for k, v in values.items()}}
        self._jsonl.write(json_output.dumps(record) + "\n")
        self._jsonl.flush()

    def message(self, text: str) -> None:
        if self.is_writer:
            print(text, file=sys.stdout, flush=True)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
        if self._jsonl is not None:
            self._jsonl.close()


def evaluation_names(config) -> str:
    """What an evaluation of ``config``'s model computes, for its status line."""
    names = ["linear probe", "kNN", "alignment and uniformity"]
    if config.model.get("name") == "dual_encoder":
        names.append("retrieval")
        if (config.evaluation.get("zero_shot_prompts")
                or config.evaluation.get("zero_shot", {}).get("class_names")):
            names.append("zero-shot")
    return ", ".join(names)


def scale_settings(config) -> str:
    """``", state fsdp, bfloat16 compute, remat"``: the scale settings of ``config`` that are
    not the defaults, for the start line."""
    parts = []
    if config.get("sharding", {}).get("params", "replicated") != "replicated":
        parts.append(f"state {config.sharding.params}")
    if config.model.get("dtype", "float32") != "float32":
        parts.append(f"{config.model.dtype} compute")
    if config.model.get("remat", False):
        parts.append("remat")
    return "".join(f", {p}" for p in parts)
