"""Stop a run cleanly on preemption or Ctrl-C: finish the step, save a checkpoint, exit 0.

A scheduler preempts a job with SIGTERM (and a grace period); a user stops one with Ctrl-C
(SIGINT). :class:`StopSignal` is polled by the training loop after every step,
``should_stop(step)``, and answers the same on every process, so all hosts save the same step.
How the processes agree depends on the platform (:func:`uses_preemption_sync_point`):

- **TPU with** ``jax.distributed.initialize`` (a pod launched with
  ``CONTRASTIVE_JAX_DISTRIBUTED=auto``, or any multi-process TPU job): JAX's preemption sync
  point, :func:`jax.experimental.multihost_utils.reached_preemption_sync_point`. The
  initialisation starts JAX's preemption service, whose SIGTERM handler (installed by XLA's
  ``PreemptionNotifier`` in ``jax.distributed.initialize``) tells the coordination service; the
  service picks the step after the largest step any host has reached, and the call returns
  ``True`` on every host at that step. No collective runs per step. SIGTERM is left to that
  handler (a Python handler would replace it), and Ctrl-C is handed to it as a SIGTERM to this
  process.
- **Everywhere else** (CPU, GPU, or TPU without ``jax.distributed``, where the sync point would
  never fire: JAX returns ``False`` when no distributed client exists): SIGTERM and SIGINT set
  a flag; with several processes the flags are combined every step by an all-gather of one
  integer (a logical OR).

A second signal while the first is being handled interrupts at once (``KeyboardInterrupt``).

After the last step, during the final evaluation (the training is finished and its last
checkpoint saved: nothing is left to save), :func:`interrupt_on_signal` makes SIGTERM stop the
run as SIGINT does, at once and cleanly, instead of the default SIGTERM kill.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

import jax
import numpy as np
from jax.experimental import multihost_utils

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def uses_preemption_sync_point() -> bool:
    """Whether stopping goes through JAX's preemption sync point: the backend is TPU,
    ``jax.distributed`` is initialised and its preemption service is enabled
    (``jax_enable_preemption_service``, on by default)."""
    return (jax.default_backend() == "tpu" and jax.distributed.is_initialized()
            and bool(jax.config.jax_enable_preemption_service))


class StopSignal:
    """Context manager: while active, a stop signal makes :meth:`should_stop` true on every
    process after the same step, instead of killing the process.

    ``sync_point``: use JAX's preemption sync point (default: :func:`uses_preemption_sync_point`).
    Then only SIGINT gets a Python handler (forwarded to JAX's SIGTERM handler); otherwise
    SIGTERM and SIGINT set :attr:`received`.
    """

    def __init__(self, sync_point: bool | None = None):
        self.sync_point = uses_preemption_sync_point() if sync_point is None else sync_point
        self.received: int | None = None
        self._previous = {}

    def __enter__(self) -> StopSignal:
        for sig in (signal.SIGINT,) if self.sync_point else SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        if self.received is not None:  # second signal: give up waiting
            signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))
            raise KeyboardInterrupt
        self.received = signum
        if self.sync_point:  # JAX's preemption service listens for SIGTERM only
            signal.raise_signal(signal.SIGTERM)

    def should_stop(self, step: int) -> bool:
        """Whether every process stops after ``step`` (the same answer on every process).

        With the sync point: ``reached_preemption_sync_point(step)``, which must be called at
        every step by every process (it is, by the training loop).
        """
        if self.sync_point:
            return bool(multihost_utils.reached_preemption_sync_point(step))
        mine = np.int32(self.received is not None)
        if jax.process_count() == 1:
            return bool(mine)
        return bool(np.max(multihost_utils.process_allgather(mine)))

    def cause(self) -> str:
        """What stopped the run, in words (after :meth:`should_stop` said so)."""
        if self.received:
            return f"signal {self.received}"
        if self.sync_point:
            return "JAX's preemption sync point (a SIGTERM on some host)"
        return "a signal to another process"


class Interrupted(Exception):
    """Raised by :func:`interrupt_on_signal`'s handler; ``signum`` is the signal.

    Libraries the signal interrupts may re-raise it with their own words prepended (TFDS:
    ``Failed to construct dataset "mnist1d", ...: SIGTERM``), so name the signal with
    :attr:`signal_name`, never ``str()``."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def signal_name(self) -> str:
        """``"SIGTERM"``, whatever the message became."""
        return signal.Signals(self.signum).name


@contextlib.contextmanager
def interrupt_on_signal() -> Iterator[None]:
    """While active, SIGTERM and SIGINT raise :class:`Interrupted` at the next Python step (a
    running XLA computation ends first), for work that can be dropped and redone, such as the
    final evaluation. With JAX's preemption sync point SIGTERM stays with JAX's handler (module
    docstring) and only SIGINT is caught."""
    def handle(signum, frame):
        raise Interrupted(signum)

    signals = (signal.SIGINT,) if uses_preemption_sync_point() else SIGNALS
    previous = {sig: signal.signal(sig, handle) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
