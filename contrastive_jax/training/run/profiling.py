"""``config.profile``: a ``jax.profiler`` trace of chosen train steps, written into the workdir.

``profile = {"start_step": S, "num_steps": K, "all_hosts": False}`` traces the steps
``S .. S + K - 1`` (numbered as the progress lines number them: step 1 is the first update,
and it includes the compilation) into ``workdir/profile/process_<i>/``, in the layout
TensorBoard's profile plugin and XProf read: ``plugins/profile/<date_time>/<host>.xplane.pb``.
``K = 0`` (the default) traces nothing. The trace starts before the first traced step takes
its batch (the input pipeline is in it), once the step before it has finished on the device,
and stops once the last traced step's outputs are ready (:func:`jax.block_until_ready` on the
state and the metrics): it holds the window's steps' device work, and no other step's.

Process 0 traces; with ``all_hosts`` every process traces into its own ``process_<i>`` folder.
A resumed run traces the steps of the window it runs (none if it resumes past the window), and
a run stopped inside the window (a signal, an error) writes the steps traced so far. On a
``gs://`` workdir the trace is written to a local temporary folder and then copied into the
workdir through :class:`etils.epath.Path`, the client every other file of the workdir goes
through (JAX's own exporter would write with a Cloud Storage client of its own, with its own
credentials and endpoint).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import jax
from etils import epath

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.run.workdir.workdir_path import is_remote

PROFILE_DIR = "profile"  # the traces' folder in the workdir
DEFAULTS = {"start_step": 0, "num_steps": 0, "all_hosts": False}  # off


@dataclasses.dataclass(frozen=True)
class ProfileWindow:
    """The traced steps ``start_step .. start_step + num_steps - 1`` (1-based) and who traces."""

    start_step: int
    num_steps: int
    all_hosts: bool = False

    @property
    def last_step(self) -> int:
        return self.start_step + self.num_steps - 1


def profile_window(settings: Mapping[str, Any] | None, total_steps: int
                   ) -> ProfileWindow | None:
    """The window ``settings`` (``config.profile``) asks for in a run of ``total_steps``
    steps, or None (no block, or ``num_steps = 0``). A :class:`ConfigError` naming the setting
    to change for an unknown key, a non-integer or negative count, a start step without a
    count or a count without a start step, or a window that ends past the run's last step."""
    if settings is None:
        return None
    settings = dict(settings)
    unknown = sorted(set(settings) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"unknown profile setting(s) {unknown}; valid: {sorted(DEFAULTS)}")
    settings = {**DEFAULTS, **settings}
    for key in ("start_step", "num_steps"):
        value = settings[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"profile.{key} must be an integer >= 0; got {value!r}")
    if not isinstance(settings["all_hosts"], bool):
        raise ConfigError(f"profile.all_hosts must be True or False; got "
                          f"{settings['all_hosts']!r}")
    start, count = settings["start_step"], settings["num_steps"]
    if count == 0:
        if start:
            raise ConfigError(f"profile.start_step={start} traces nothing with "
                              "profile.num_steps=0: set profile.num_steps > 0, or "
                              "profile.start_step=0")
        return None
    if start == 0:
        raise ConfigError(f"profile.num_steps={count} needs profile.start_step, the first step "
                          "to trace (>= 1; step 1 includes the compilation, so e.g. 10)")
    window = ProfileWindow(start, count, settings["all_hosts"])
    if window.last_step > total_steps:
        raise ConfigError(
            f"profile steps {start}..{window.last_step} end past the run's last step "
            f"{total_steps}: set profile.start_step + profile.num_steps <= {total_steps + 1}")
    return window


def trace_folder(workdir: str | os.PathLike, process_index: int) -> epath.Path:
    """``workdir/profile/process_<process_index>``: one process's traces."""
    return epath.Path(workdir) / PROFILE_DIR / f"process_{process_index}"


def _copy_tree(source: str, dest: epath.Path) -> None:
    """Every file under the local folder ``source`` to the same place under ``dest``."""
    for folder, _, files in os.walk(source):
        target = dest / os.path.relpath(folder, source)
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                (target / name).write_bytes(f.read())


class StepProfiler:
    """Starts and stops the trace of a :class:`ProfileWindow` around the loop's steps.

    ``before_step(step)`` before step ``step`` takes its batch, ``after_step(step, outputs)``
    with the step's outputs; used as a context manager, a trace still open at the exit (a stop
    inside the window, an error) is written with the steps traced so far.
    """

    def __init__(self, window: ProfileWindow | None, workdir: str | os.PathLike,
                 first_step: int, message: Callable[[str], None] = print, *,
                 process_index: int | None = None):
        """``first_step``: the first step this run runs (1, or the resumed step + 1);
        ``process_index``: this process (None: :func:`jax.process_index`)."""
        index = jax.process_index() if process_index is None else process_index
        self.message = message
        self.folder = trace_folder(workdir, index)
        self.start = self.last = None  # the steps this process traces
        self._local: str | None = None  # the folder jax writes into while tracing
        self._traced = 0
        self._before: Any = None  # the outputs of the step before the window
        self._last: Any = None  # the outputs of the latest traced step
        if window is None or not (index == 0 or window.all_hosts):
            return
        if window.last_step < first_step:
            message(f"profile: steps {window.start_step}..{window.last_step} come before this "
                    f"run's first step {first_step} (resumed): nothing traced")
            return
        self.start, self.last = max(window.start_step, first_step), window.last_step

    def before_step(self, step: int) -> None:
        """Before step ``step`` takes its batch: the first traced step starts the trace, once
        the step before it has finished."""
        if step != self.start:
            return
        jax.block_until_ready(self._before)  # the step before is not in the trace
        self._before = None
        remote = is_remote(self.folder)
        self._local = tempfile.mkdtemp(prefix="profile_") if remote else str(self.folder)
        if not remote:
            self.folder.mkdir(parents=True, exist_ok=True)
        self.message(f"profile: tracing steps {self.start}..{self.last} into {self.folder}")
        jax.profiler.start_trace(self._local)

    def after_step(self, step: int, outputs: Any) -> None:
        """After step ``step`` returned ``outputs`` (the state and the metrics): the last traced
        step waits for them and writes the trace."""
        if self.start is not None and step == self.start - 1:
            self._before = outputs
        if self._local is None:
            return
        self._traced += 1
        self._last = outputs
        if step == self.last:
            self._stop()

    def _stop(self, failing: bool = False) -> None:
        """Wait for the latest traced step's outputs (the trace holds its device work; unless
        ``failing``: an error on its way out may have left them deleted or failed), then write
        the trace."""
        try:
            jax.block_until_ready(self._last)
        except Exception:
            if not failing:
                raise  # the trace is still open: the exit writes it
        local, self._local, self._last = self._local, None, None
        jax.profiler.stop_trace()
        steps = f"{self.start}..{self.start + self._traced - 1}" if self._traced else "none"
        if local != str(self.folder):
            try:
                _copy_tree(local, self.folder)
            finally:
                shutil.rmtree(local, ignore_errors=True)
        self.message(f"profile: the trace of steps {steps} is in {self.folder}")

    def __enter__(self) -> StepProfiler:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if self._local is None:
            return
        if kind is None:
            self._stop()
            return
        try:  # an error is on its way out: write what was traced, without hiding the error
            self._stop(failing=True)
        except Exception as stop_error:
            self.message(f"warning: profile: the trace could not be written ({stop_error})")
