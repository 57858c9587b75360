"""Progress of a run: console lines, TensorBoard scalars and ``metrics.jsonl`` in the workdir.

Only process 0 writes. A console line looks like::

    step   200/1560 | loss 5.012 | top1 0.613 | temp 0.200 | 0.150 s/step | 6,820 ex/s
        (853/chip) | 41.2 TFLOP/s/chip | MFU 41.7% | ETA 0:03:24

(one line) with ``| skipped N`` before the timing once the run has skipped N updates as
non-finite (:func:`contrastive_jax.training.step.train_step.train_step`).

The metrics of a line (and of its TensorBoard scalars and JSON record) are means over the steps
since the previous line (:class:`MetricWindow`), not one noisy step; the step counters
(``skipped``, ``skipped_in_a_row``) and ``learning_rate`` are the last step's. The timing comes
from the host's clock at the logging steps alone (no extra sync with the device), over the steps
since the previous line, so it includes data loading and logging:

* ``s/step`` = wall seconds / steps (``train/step_s``);
* ``ex/s`` = global examples / wall seconds (``train/examples_per_s``), per chip divided by the
  mesh's devices (``train/examples_per_s_per_chip``); the ETA extrapolates it;
* ``TFLOP/s/chip`` = model FLOPs per step / devices / ``s/step`` (``train/model_tflops_per_chip``),
  the model FLOPs being XLA's count of the step without remat, accumulation, scanned layers or
  tiled losses (:mod:`contrastive_jax.training.step.model_flops`);
* ``MFU`` = that / the chip's dense bf16 peak (``train/mfu``;
  :func:`contrastive_jax.accelerators.device_peak_flops`), ``n/a`` where no peak is known (the
  CPU).

On a remote workdir (``gs://``, :mod:`~contrastive_jax.training.run.workdir.workdir_path`)
both files go through :class:`etils.epath.Path`. An object cannot be appended to, and
re-uploading a whole file would cost more at every log line the longer the run, so each is
written as parts of about :data:`PART_BYTES`: only the current part is kept in memory and
uploaded (``metrics.jsonl`` at every line, :class:`RemoteTextLog`; the event file whenever
tensorboardX flushes, every 120 s and at the end, :class:`RemoteRecordFile`), and once it is
full it is finished, never written again, and the next part begins. ``metrics.jsonl`` stays the
first part's name (a short run has no other), the later ones are ``metrics.jsonl.part-00001``,
..., and :func:`read_metrics_lines` reads all of them in order; a resumed run continues the
last part. An event file's later parts, ``events.out.tfevents.<time>.<host>.part-00001``, ...,
are event files of whole records whose names sort in write order.

The trainer's start line names a config's non-default scale settings (:func:`scale_settings`);
what an evaluation computes and shows is its evaluators'
(:mod:`~contrastive_jax.training.evaluation.evaluators`).
"""

from __future__ import annotations

import datetime
import os
import struct
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


PART_BYTES = 256 * 1024
"""A remote log's part is finished, and the next one begun, once it holds this many bytes (at
a line's or a record's end): what one upload can cost, whatever the run's length."""
PART_SUFFIX = ".part-"  # part i > 0 of FILE is FILE.part-00001, ...: they sort after FILE
PART_DIGITS = 5  # sorted by name up to 99,999 parts (24 GiB at PART_BYTES)
METRICS_FILE = "metrics.jsonl"
_RECORD_HEADER = struct.Struct("<QI")  # a TFRecord: length, masked CRC of it, data, its CRC


def part_path(first: str | os.PathLike, index: int) -> epath.Path:
    """Part ``index`` of the log whose first part is ``first``: ``first`` itself for 0 (so a
    log of one part is a plain file under its usual name), else ``first.part-00001``, ...
    (zero-padded: a part's name sorts after its predecessors')."""
    first = epath.Path(first)
    if index == 0:
        return first
    return first.parent / f"{first.name}{PART_SUFFIX}{index:0{PART_DIGITS}d}"


def _part_index(name: str, first_name: str) -> int | None:
    """Which part of ``first_name``'s log ``name`` is, None if it is not one."""
    if name == first_name:
        return 0
    number = name.removeprefix(first_name + PART_SUFFIX)
    return int(number) if number != name and number.isdigit() else None


def log_parts(first: str | os.PathLike) -> list[epath.Path]:
    """The existing parts of the log whose first part is ``first``, in order (one listing of
    the folder, local or remote; empty if there are none)."""
    first = epath.Path(first)
    found = {}
    for path in first.parent.glob(first.name + "*"):
        index = _part_index(path.name, first.name)
        if index is not None:
            found[index] = path
    return [found[i] for i in sorted(found)]


def read_metrics_lines(workdir: str | os.PathLike) -> list[str]:
    """Every line of a run's ``metrics.jsonl``, in order: the one file of a local workdir, the
    parts of a remote one (:class:`RemoteTextLog`) one after another. Empty if there is none."""
    parts = log_parts(epath.Path(workdir) / METRICS_FILE)
    return b"".join(part.read_bytes() for part in parts).decode().splitlines()


class RemoteTextLog:
    """A text file on remote storage written like one opened with ``"a"``, as parts of bounded
    size (an object store has no append, and re-uploading the whole file would cost more at
    every line the longer the run).

    Each :meth:`flush` uploads the current part whole; once a flush has uploaded a part of
    ``part_bytes`` or more that ends a line, that part is finished (never written again) and the
    next write begins part ``i + 1`` (:func:`part_path`). So an upload is at most
    ``part_bytes`` plus what was written since the previous flush, each part holds whole lines,
    and a part's successor appears only after its final upload. At open, the existing parts are
    listed: the last one is continued (read into memory) unless it is finished; the others are
    left untouched. :func:`read_metrics_lines` reads the parts back in order."""

    def __init__(self, path: str | os.PathLike, part_bytes: int = PART_BYTES):
        self.path, self.part_bytes = epath.Path(path), part_bytes
        parts = log_parts(self.path)
        self._index = _part_index(parts[-1].name, self.path.name) if parts else 0
        self._chunks = [parts[-1].read_bytes()] if parts else []
        self._size = sum(map(len, self._chunks))
        self._dirty = False
        if self._finished():
            self._next_part()

    @property
    def part(self) -> epath.Path:
        """The part the next flush uploads."""
        return part_path(self.path, self._index)

    def write(self, text: str) -> None:
        data = text.encode()
        self._chunks.append(data)
        self._size += len(data)
        self._dirty = True

    def flush(self) -> None:
        if self._dirty:
            self.part.write_bytes(b"".join(self._chunks))
            self._dirty = False
            if self._finished():
                self._next_part()

    def close(self) -> None:
        self.flush()

    def _finished(self) -> bool:
        """Whether the current part is full and ends a line (then it is never written again)."""
        return self._size >= self.part_bytes and self._chunks[-1].endswith(b"\n")

    def _next_part(self) -> None:
        self._index, self._chunks, self._size = self._index + 1, [], 0


def _record_end(data: bytearray, start: int) -> int | None:
    """The end of the TFRecord that begins at ``start`` in ``data``, None if ``data`` does not
    hold all of it yet."""
    if len(data) - start < _RECORD_HEADER.size:
        return None
    length, _ = _RECORD_HEADER.unpack_from(data, start)
    end = start + _RECORD_HEADER.size + length + 4
    return end if end <= len(data) else None


class RemoteRecordFile:
    """A TensorBoard event file on remote storage for tensorboardX's record writer, as parts of
    bounded size, each one an event file of whole records.

    tensorboardX's ``RecordWriter.write`` calls :meth:`write` four times per record (length,
    its CRC, data, its CRC), so parts are cut by reading the framing, never at a call: once the
    whole records of the current part reach ``part_bytes``, they are uploaded as its final
    content and whatever follows them begins the next part, ``NAME.part-00001``, ...
    (:func:`part_path`; TensorBoard reads every file of a run directory whose name contains
    ``tfevents``, in name order, and a part's successor appears only after its final upload).
    :meth:`flush` (tensorboardX's, every 120 s and at the end) uploads the current part. So no
    upload exceeds ``part_bytes`` plus one record, and a finished part is never rewritten."""

    def __init__(self, path: str, part_bytes: int = PART_BYTES):
        self.path, self.part_bytes = epath.Path(path), part_bytes
        self._index, self._data, self._records_end, self._dirty = 0, bytearray(), 0, False

    @property
    def part(self) -> epath.Path:
        """The part the next upload writes."""
        return part_path(self.path, self._index)

    def write(self, data: bytes) -> None:
        self._data += data
        self._dirty = True
        while (end := _record_end(self._data, self._records_end)) is not None:
            self._records_end = end
            if end >= self.part_bytes:
                self._finish_part()

    def flush(self) -> None:
        if self._dirty:
            self.part.write_bytes(bytes(self._data))
            self._dirty = False

    def close(self) -> None:
        self.flush()

    def _finish_part(self) -> None:
        """Upload the current part's whole records as its final content; the bytes after them
        begin the next part."""
        self.part.write_bytes(bytes(self._data[:self._records_end]))
        self._data = self._data[self._records_end:]
        self._index, self._records_end, self._dirty = self._index + 1, 0, bool(self._data)


class RemoteRecordFiles:
    """tensorboardX's writer factory for ``gs://`` (:func:`use_epath_for_tensorboard`)."""

    def __init__(self, part_bytes: int = PART_BYTES):
        self.part_bytes = part_bytes

    def open(self, path: str) -> RemoteRecordFile:
        return RemoteRecordFile(path, self.part_bytes)

    def directory_check(self, path: str) -> None:
        """Nothing to create: an object store has no directories."""


def use_epath_for_tensorboard(part_bytes: int = PART_BYTES) -> None:
    """Route tensorboardX's ``gs://`` event files through :class:`RemoteRecordFile` (epath,
    gcsfs; parts of ``part_bytes``), like every other file of the workdir, instead of its own
    google-cloud-storage writer (whose ``__del__`` uploads the file once more whenever the
    garbage collector gets to it, and which uploads the whole file at every flush).
    Process-wide."""
    from tensorboardX import record_writer

    record_writer.register_writer_factory("gs", RemoteRecordFiles(part_bytes))


class Progress:
    """Logs every ``every`` steps and on demand; ``close()`` flushes the writers."""

    def __init__(self, workdir: str | os.PathLike, total_steps: int, global_batch: int,
                 every: int, start_step: int = 0, *, chips: int = 1,
                 peak_flops: float | None = None):
        self.total, self.batch, self.every = total_steps, global_batch, max(1, every)
        self.chips, self.peak_flops = chips, peak_flops
        self.model_flops: float | None = None  # per step, global (set_model_flops)
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

    def set_model_flops(self, flops: float | None, waited_s: float = 0.0) -> None:
        """The global model FLOPs of one step (``None``: unknown; no TFLOP/s or MFU shown);
        ``waited_s``: how long the loop waited for the count, left out of the next rates."""
        self.model_flops = flops
        self._last_time += waited_s

    def timing(self, steps: int, seconds: float) -> dict[str, float]:
        """The rates of ``steps`` steps in ``seconds`` of wall time (the module docstring):
        ``step_s``, ``examples_per_s``, ``examples_per_s_per_chip`` and, with the model
        FLOPs, ``model_tflops_per_chip`` and (with a known peak) ``mfu``. No steps timed (a
        logging step that is the compiling first step of a run or of a resume): no rates, rather
        than a throughput of 0."""
        if steps <= 0:
            return {}
        seconds = max(seconds, 1e-9)
        out = {"step_s": seconds / steps, "examples_per_s": steps * self.batch / seconds}
        out["examples_per_s_per_chip"] = out["examples_per_s"] / self.chips
        if self.model_flops is not None:
            per_chip = self.model_flops / self.chips / out["step_s"]
            out["model_tflops_per_chip"] = per_chip / 1e12
            if self.peak_flops:
                out["mfu"] = per_chip / self.peak_flops
        return out

    def log_train(self, step: int, metrics: Mapping[str, float]) -> None:
        """One console line, TensorBoard scalars ``train/<name>``, one JSON line."""
        now = time.perf_counter()
        timing = self.timing(step - self._last_step, now - self._last_time)
        self._last_step, self._last_time = step, now
        values = {k: float(np.asarray(v)) for k, v in metrics.items()}
        values.update(timing)
        rate = timing.get("examples_per_s", 0.0)
        eta = (self.total - step) * self.batch / rate if rate > 0 else float("nan")
        if not self.is_writer:
            return
        parts = [f"step {step:>6}/{self.total}"]
        parts += [f"{label} {fmt.format(values[key])}" for key, label, fmt in CONSOLE_KEYS
                  if key in values]
        if values.get("skipped", 0) > 0:  # updates skipped as non-finite so far (the guard)
            parts.append(f"skipped {values['skipped']:.0f}")
        if timing:
            parts.append(f"{timing['step_s']:.3g} s/step")
            parts.append(f"{rate:,.0f} ex/s ({timing['examples_per_s_per_chip']:,.0f}/chip)")
        if "model_tflops_per_chip" in timing:
            parts.append(f"{timing['model_tflops_per_chip']:.3g} TFLOP/s/chip")
            parts.append(f"MFU {100 * timing['mfu']:.1f}%" if "mfu" in timing else "MFU n/a")
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
