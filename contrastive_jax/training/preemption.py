"""Stop a run cleanly on SIGTERM / SIGINT: finish the step, save a checkpoint, exit 0.

A pod scheduler preempts a job with SIGTERM (and a grace period); a user stops one with
Ctrl-C. :class:`StopSignal` turns either into a flag that the training loop polls at each
step boundary. With several processes the flag is combined across all of them (a logical OR
by an all-gather of one integer), so every host stops after the same step and the checkpoint
they write together is consistent.
"""

from __future__ import annotations

import signal

import jax
import numpy as np
from jax.experimental import multihost_utils

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignal:
    """Context manager: while active, SIGTERM/SIGINT set :attr:`received` instead of killing.

    A second signal while the first is being handled restores the default behaviour (so a
    second Ctrl-C still interrupts at once).
    """

    def __init__(self):
        self.received: int | None = None
        self._previous = {}

    def __enter__(self) -> StopSignal:
        for sig in SIGNALS:
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

    def should_stop(self) -> bool:
        """Whether any process received a stop signal (the same answer on every process)."""
        mine = np.int32(self.received is not None)
        if jax.process_count() == 1:
            return bool(mine)
        return bool(np.max(multihost_utils.process_allgather(mine)))
