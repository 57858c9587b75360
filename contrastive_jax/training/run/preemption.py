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
  a flag; with several processes they agree through the key-value store of JAX's coordination
  service (:class:`CoordinatedStop`), an algorithm like the sync point's: a signalled
  process posts a request; each step every process asks the store, on the host, whether a
  request exists (one small RPC to the coordinator, never a device collective, so the host
  keeps dispatching steps while the chips compute); once one does, each process posts the step
  it is at, and all stop after the largest plus :attr:`CoordinatedStop.WINDOW` (2) steps. A
  host that never answers is an error naming it after ``launch.heartbeat_timeout_s``.

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
    SIGTERM and SIGINT set :attr:`received`. ``timeout_s``: with several processes and no sync
    point, how long the step that stops waits for the others to say where they are.
    """

    def __init__(self, sync_point: bool | None = None, timeout_s: float = 100.0):
        self.sync_point = uses_preemption_sync_point() if sync_point is None else sync_point
        self.timeout_s = timeout_s  # how long the stop step waits for the other processes
        self.received: int | None = None
        self._previous = {}
        self._coordinated: CoordinatedStop | None = None

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
        every step by every process (it is, by the training loop); with several processes
        otherwise, :meth:`CoordinatedStop.should_stop`, likewise called at every step. Neither
        reads from a device.
        """
        if self.sync_point:
            return bool(multihost_utils.reached_preemption_sync_point(step))
        if jax.process_count() == 1:
            return self.received is not None
        if self._coordinated is None:
            self._coordinated = CoordinatedStop.for_this_job(self.timeout_s)
        return self._coordinated.should_stop(step, self.received is not None)

    def cause(self) -> str:
        """What stopped the run, in words (after :meth:`should_stop` said so)."""
        if self.received:
            return f"signal {self.received}"
        if self.sync_point:
            return "JAX's preemption sync point (a SIGTERM on some host)"
        return "a signal to another process"


class CoordinatedStop:
    """Several processes agree on the step after which all stop, through the key-value store
    of JAX's coordination service (``jax.distributed``'s client), on the host.

    Keys, under ``contrastive_jax/stop/<n>`` (``n`` counts the stop signals this job created,
    the same on every process: one training loop each)::

        request/<process>   posted once by a process that received a signal (its step)
        at/<process>        posted by every process at the first step it sees a request

    Every step, right after dispatching it and before reading anything from the device, each
    process asks the store (non-blocking RPCs to the coordinator): has a request been posted;
    once it has posted its own ``at``, have all processes. All stop after ``max(at) +
    WINDOW``. A process that reaches its own ``at + WINDOW`` without every ``at`` waits for
    the missing ones there (up to ``timeout_s``), so none passes the stop step before it
    knows it: at that point the others can still reach their next check, because what they
    wait for from this process (its steps up to ``at + WINDOW``, the collectives and saves of
    ``at + 1``) was dispatched after it saw the request. So all save the same step, and no
    step waits for a device collective to decide it.
    """

    PREFIX = "contrastive_jax/stop"
    WINDOW = 2  # steps a process may run past its ``at`` before it must know every ``at``
    _created = 0  # stop signals of this process so far (the same count on every process)

    def __init__(self, client, process: int, processes: int, timeout_s: float, prefix: str):
        self.client, self.process, self.processes = client, process, processes
        self.timeout_ms = max(1, int(timeout_s * 1000))
        self.prefix = prefix
        self.requested = False
        self.at: int | None = None
        self.stop_at: int | None = None

    @classmethod
    def for_this_job(cls, timeout_s: float) -> CoordinatedStop:
        """The agreement of this job's processes (``jax.distributed`` must be initialised)."""
        from jax._src import distributed

        client = distributed.global_state.client
        if client is None:
            raise RuntimeError("several processes but no jax.distributed client: call "
                               "jax.distributed.initialize first")
        cls._created += 1
        return cls(client, jax.process_index(), jax.process_count(), timeout_s,
                   f"{cls.PREFIX}/{cls._created}")

    def should_stop(self, step: int, signalled: bool) -> bool:
        """Whether all processes stop after ``step``. Call at every step, on every process,
        before the step's device reads; ``signalled``: this process has received a stop
        signal."""
        if self.stop_at is None:
            self._agree(step, signalled)
        return self.stop_at is not None and step >= self.stop_at

    def _agree(self, step: int, signalled: bool) -> None:
        if signalled and not self.requested:
            self.client.key_value_set(f"{self.prefix}/request/{self.process}", str(step))
            self.requested = True
        if self.at is None:
            if not (self.requested
                    or self.client.key_value_dir_get(f"{self.prefix}/request/")):
                return
            self.at = step
            self.client.key_value_set(f"{self.prefix}/at/{self.process}", str(step))
        posted = dict(self.client.key_value_dir_get(f"{self.prefix}/at/"))
        if len(posted) < self.processes and step < self.at + self.WINDOW:
            return  # the others will post at their next check
        steps = []
        for other in range(self.processes):
            key = f"{self.prefix}/at/{other}"
            if key not in posted:
                try:
                    posted[key] = self.client.blocking_key_value_get(key, self.timeout_ms)
                except Exception as err:  # a deadline: that host is gone or stuck
                    raise RuntimeError(
                        f"stopping after a signal: process {other} did not say which step it "
                        f"is at within {self.timeout_ms / 1000:.0f} s ({type(err).__name__}); "
                        "it is gone or stuck, so the processes cannot save the same "
                        "step") from None
            steps.append(int(posted[key]))
        self.stop_at = max(steps) + self.WINDOW


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
