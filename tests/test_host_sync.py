"""The training loop never waits for the device between its sync points.

The steps between logging, checkpoint and evaluation steps run under
``jax.transfer_guard_device_to_host("disallow")`` (``config.transfer_guard``), with JAX's
guard emulated on the CPU (tests/emulated_transfer_guard.py: on the CPU backend JAX never
applies it): a whole run with a periodic evaluation, checkpoints, log lines and a stop signal
completes, so the only device reads are the loop's named sync points; the same run with a
read added to every step's stop check (what the per-step all-gather of the stop flag was)
fails at once. The two-process case, a signal to one process, is
tests/test_distributed.py::test_sigterm_to_one_host_stops_both_at_the_same_step.
"""

import signal

import emulated_transfer_guard
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_reliability import quick

from contrastive_jax.training import train
from contrastive_jax.training.run import preemption


def run_with_guard(tmp_path, monkeypatch, signal_at: int):
    """The SimCLR quick run for 12 steps (logs every 5, checkpoints every 3, an evaluation
    every 4) under the emulated guard, this process sent SIGTERM at step ``signal_at`` (by
    the stop check itself, so that the signal arrives at a known step)."""
    emulated_transfer_guard.install()
    check = preemption.StopSignal.should_stop

    def signalled_at(self, step):
        if step == signal_at and self.received is None:
            signal.raise_signal(signal.SIGTERM)
        return check(self, step)

    monkeypatch.setattr(preemption.StopSignal, "should_stop", signalled_at)
    config = quick(total_steps=12, checkpoint_every=3, log_every=5, transfer_guard="disallow")
    config.evaluation.enabled = True
    config.evaluation.every = 4
    return train.train_and_evaluate(config, str(tmp_path))


def test_between_its_sync_points_the_loop_reads_nothing_from_the_device(tmp_path,
                                                                        monkeypatch, capsys):
    results = run_with_guard(tmp_path, monkeypatch, signal_at=10)
    out = capsys.readouterr().out
    assert results["stopped_at"] == 10  # one process: the step the signal came at
    assert "eval at step 4" in out and "eval at step 8" in out
    assert "step      5/12" in out and "step     10/12" in out
    saved = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()
                   if p.name.isdigit())
    assert saved == [6, 9, 10]  # keep 3: 3 was pushed out


def test_a_read_in_every_step_is_caught(tmp_path, monkeypatch):
    """The control: the stop check reading a device scalar each step, as the per-step
    all-gather of the stop flags did, stops the run at its first step."""
    flag = jnp.zeros((), jnp.int32)

    def reads_the_device(self, step):
        return bool(np.asarray(flag))

    monkeypatch.setattr(preemption.StopSignal, "should_stop", reads_the_device)
    with pytest.raises(emulated_transfer_guard.GuardedRead, match="read on the host"):
        run_with_guard(tmp_path, monkeypatch, signal_at=100)
    assert jax.config.jax_transfer_guard_device_to_host in (None, "allow")
