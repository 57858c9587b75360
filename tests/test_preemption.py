"""How a run learns it must stop: JAX's preemption sync point on TPU, signals elsewhere.

The sync point cannot fire on CPU (it needs TPU's preemption service over jax.distributed), so
the TPU path is tested with ``reached_preemption_sync_point`` replaced; the end-to-end run
stopped through it is in ``tests/test_remote_paths.py``, the signal path's in
``tests/test_reliability.py`` and ``tests/test_distributed.py``.
"""

import signal

import jax
import pytest
from jax.experimental import multihost_utils

from contrastive_jax.training.run import preemption
from contrastive_jax.training.run.preemption import StopSignal, uses_preemption_sync_point


def test_the_sync_point_is_used_on_tpu_with_jax_distributed_only(monkeypatch):
    assert not uses_preemption_sync_point()  # here: CPU, no jax.distributed
    # and here JAX's sync point never fires: it answers False without a distributed client
    assert multihost_utils.reached_preemption_sync_point(1) is False
    for backend, initialized, expected in [("cpu", True, False), ("gpu", True, False),
                                           ("tpu", False, False), ("tpu", True, True)]:
        monkeypatch.setattr(jax, "default_backend", lambda b=backend: b)
        monkeypatch.setattr(jax.distributed, "is_initialized", lambda i=initialized: i)
        assert uses_preemption_sync_point() is expected, (backend, initialized)
        assert StopSignal().sync_point is expected
    jax.config.update("jax_enable_preemption_service", False)
    try:
        assert not uses_preemption_sync_point()  # tpu, initialised, service off
    finally:
        jax.config.update("jax_enable_preemption_service", True)


def test_tpu_path_asks_the_sync_point_every_step_and_leaves_sigterm_to_jax(monkeypatch):
    asked = []
    monkeypatch.setattr(multihost_utils, "reached_preemption_sync_point",
                        lambda step: asked.append(step) or step == 7)
    raise_signal = signal.raise_signal
    forwarded = []
    monkeypatch.setattr(signal, "raise_signal", forwarded.append)
    sigterm_before = signal.getsignal(signal.SIGTERM)
    sigint_before = signal.getsignal(signal.SIGINT)
    with StopSignal(sync_point=True) as stop:
        # JAX's preemption service owns SIGTERM: no Python handler replaces it
        assert signal.getsignal(signal.SIGTERM) is sigterm_before
        assert signal.getsignal(signal.SIGINT) == stop._handle
        assert [stop.should_stop(step) for step in range(5, 9)] == [False, False, True, False]
        assert asked == [5, 6, 7, 8]
        raise_signal(signal.SIGINT)  # Ctrl-C: handed to JAX's SIGTERM handler
        assert stop.received == signal.SIGINT and forwarded == [signal.SIGTERM]
        with pytest.raises(KeyboardInterrupt):  # a second one interrupts at once
            raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is sigint_before
    assert signal.getsignal(signal.SIGTERM) is sigterm_before


def test_cpu_path_is_the_signal_flag(monkeypatch):
    def never(step):
        raise AssertionError("the sync point must not be asked off TPU")

    monkeypatch.setattr(multihost_utils, "reached_preemption_sync_point", never)
    before = {s: signal.getsignal(s) for s in preemption.SIGNALS}
    with StopSignal() as stop:
        assert not stop.sync_point
        assert all(signal.getsignal(s) == stop._handle for s in preemption.SIGNALS)
        assert not stop.should_stop(1)
        signal.raise_signal(signal.SIGTERM)
        assert stop.received == signal.SIGTERM and stop.should_stop(2)
    assert {s: signal.getsignal(s) for s in preemption.SIGNALS} == before


def test_an_interrupt_re_raised_by_a_library_still_names_its_signal():
    """TFDS re-raises an exception caught while it builds a dataset with its own words in front
    (``Failed to construct dataset "mnist1d", ...: SIGTERM``); the stop line must still say
    ``SIGTERM`` (the chaos run's signal during the final evaluation printed TFDS's words)."""
    import signal as signals

    from tensorflow_datasets.core.utils import py_utils

    from contrastive_jax.training.run.preemption import Interrupted

    with pytest.raises(Interrupted) as caught:
        try:
            raise Interrupted(signals.SIGTERM)
        except Interrupted as err:
            py_utils.reraise(err, prefix='Failed to construct dataset "mnist1d": ')
    assert str(caught.value).startswith("Failed to construct dataset")  # what str() says
    assert caught.value.signal_name == "SIGTERM"


def test_the_trainer_names_the_signal_that_stopped_its_final_evaluation(tmp_path, monkeypatch,
                                                                        capsys):
    """The final evaluation interrupted inside TFDS: the run says ``stopped by SIGTERM during
    the final evaluation`` (not TFDS's message), writes no results.json, and a rerun
    evaluates."""
    import signal as signals

    from tensorflow_datasets.core.utils import py_utils
    from trained_workdirs import simclr_quick_config

    from contrastive_jax.training import run_results, train
    from contrastive_jax.training.run.preemption import Interrupted

    def interrupted_in_tfds(*args, **kwargs):
        try:
            raise Interrupted(signals.SIGTERM)
        except Interrupted as err:
            py_utils.reraise(err, prefix='Failed to construct dataset "mnist1d": ')

    config = simclr_quick_config()
    config.evaluation.enabled = True
    monkeypatch.setattr(run_results, "evaluate", interrupted_in_tfds)
    stopped = train.train_and_evaluate(config, str(tmp_path))
    out = capsys.readouterr().out
    assert stopped["stopped_at"] == config.total_steps
    assert "stopped by SIGTERM during the final evaluation: the training is finished" in out
    assert "Failed to construct" not in out and not (tmp_path / "results.json").exists()


class FakeStore:
    """The coordination service's key-value store, shared by simulated processes: set (no
    overwrite), list a directory, blocking get (a missing key is a deadline error)."""

    def __init__(self):
        self.values, self.calls, self.blocking = {}, [], 0

    def key_value_set(self, key, value, allow_overwrite=False):
        assert allow_overwrite or key not in self.values, key
        self.values[key] = value

    def key_value_dir_get(self, prefix):
        self.calls.append(prefix)
        return [(k, v) for k, v in self.values.items() if k.startswith(prefix)]

    def blocking_key_value_get(self, key, timeout_in_ms):
        self.blocking += 1
        if key not in self.values:
            raise TimeoutError(f"DEADLINE_EXCEEDED {key}")
        return self.values[key]


def test_processes_agree_on_one_step_after_the_largest_any_of_them_had_reached():
    """Three processes whose hosts run 0, 1 and 2 steps apart (each checks once a step, in
    turn); process 2 is signalled at its step 10. Each posts its step at its first check that
    sees the request (10, 12, 13) and all stop after 13 + WINDOW = 15, the same step on every
    process, each knowing it before getting there; no process waits on the store (every
    ``at`` arrives within the window) and none asks it more than twice a step."""
    store = FakeStore()
    agree = [preemption.CoordinatedStop(store, p, 3, timeout_s=1, prefix="t/1")
             for p in range(3)]
    ahead = {0: 2, 1: 1, 2: 0}  # how many steps each host is ahead of process 2's
    stopped, known = {}, {}
    for tick in range(1, 20):
        for p in (0, 1, 2):
            step = tick + ahead[p]
            if p in stopped:
                continue
            if agree[p].should_stop(step, signalled=p == 2 and step >= 10):
                stopped[p] = step
            if agree[p].stop_at is not None:
                known.setdefault(p, step)
    assert stopped == {0: 15, 1: 15, 2: 15}
    assert all(step <= 15 for step in known.values())
    assert store.values["t/1/request/2"] == "10"
    assert {k: v for k, v in store.values.items() if "/at/" in k} == {
        "t/1/at/2": "10", "t/1/at/1": "12", "t/1/at/0": "13"}
    assert store.blocking == 0
    assert len(store.calls) <= 2 * 3 * 16


def test_a_process_that_never_answers_is_an_error_naming_it():
    store = FakeStore()
    first = preemption.CoordinatedStop(store, 0, 2, timeout_s=0.001, prefix="t/2")
    assert first.should_stop(3, signalled=False) is False
    assert first.should_stop(4, signalled=True) is False  # posts; process 1 may answer
    assert first.should_stop(5, signalled=True) is False
    with pytest.raises(RuntimeError, match="process 1 did not say which step it is at"):
        first.should_stop(6, signalled=True)  # at + WINDOW: it must know by now


def test_the_stop_check_of_one_process_reads_nothing_from_the_device(monkeypatch):
    """One process: the flag alone (no store, no device), whatever the guard says."""
    with jax.transfer_guard_device_to_host("disallow"), StopSignal(sync_point=False) as stop:
        assert stop.should_stop(1) is False
        signal.raise_signal(signal.SIGTERM)
        assert stop.should_stop(2) is True
