"""Runs survive preemption and damage, stop on persistent NaNs, and explain bad input."""

import json
import random
import shutil
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import grain
import numpy as np
import pytest

from contrastive_jax.errors import ConfigError
from contrastive_jax.mesh import make_mesh
from contrastive_jax.training import run_results, train
from contrastive_jax.training.methods import method_for
from contrastive_jax.training.run.checkpoints import CheckpointError
from contrastive_jax.training.step.train_state import all_finite, params_digest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
import forked_command_lines  # noqa: E402
from test_train import load_config  # noqa: E402
from trained_workdirs import simclr_quick_config, simclr_quick_workdir  # noqa: E402
from xla_environment import child_environment  # noqa: E402

QUICK = ["--config=configs/simclr_mnist1d.py:quick", "--config.evaluation.enabled=False",
         "--config.log_every=1"]


def command(workdir, *extra):
    return [sys.executable, "-m", "contrastive_jax.main", f"--workdir={workdir}", *QUICK,
            *extra]


def digest(workdir) -> str:
    return json.loads((Path(workdir) / "results.json").read_text())["params_sha256"]


def load_chaos():
    import importlib.util

    spec = importlib.util.spec_from_file_location("chaos", REPO / "experiments" / "chaos.py")
    chaos = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(chaos)
    return chaos


def test_stopped_or_killed_runs_resume_bit_identical(tmp_path):
    """One uninterrupted run; the same run stopped by SIGTERM, restarted, killed by SIGKILL at
    a random step (experiments/chaos.py) and restarted again: both end with the same
    parameter hash (parameters and BatchNorm statistics bit-identical). Each run is forked by
    tests/forked_command_lines.py's server (no start-up of Python and its imports each)."""
    chaos = load_chaos()
    steps, every = 16, 4
    config = "configs/simclr_mnist1d.py:quick"
    whole = forked_command_lines.run(chaos.command(config, tmp_path / "whole", steps, every))
    assert whole.returncode == 0, whole.stderr[-2000:]

    cut = tmp_path / "cut"
    run = forked_command_lines.popen(chaos.command(config, cut, steps, every))
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and run.poll() is None:
            if chaos.logged_step(cut) >= 6:
                run.send_signal(signal.SIGTERM)
                break
            time.sleep(0.02)
        out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 0, err[-2000:]
    assert "stopped by signal" in out and "run the same command to resume" in out
    stopped = int(out.split("after step ")[1].split(":")[0])
    assert 6 <= stopped < steps
    saved = sorted(int(p.name) for p in (cut / "checkpoints").iterdir() if p.name.isdigit())
    assert saved[-1] == stopped  # saved at the step boundary it stopped at
    # restart it; kill that run with SIGKILL at a random later step; restart again
    stats = chaos.run_with_kills(chaos.command(config, cut, steps, every), cut, steps, 1,
                                 random.Random(0), child_environment(),
                                 popen=forked_command_lines.popen)
    assert stats["kills"] == 1 and stats["runs"] == 2 and stats["resumes"] == 2, stats
    # saves are asynchronous and each waits for the one before: a kill during a save loses
    # that checkpoint too, so at most the steps since the save before it
    assert 0 <= stats["lost"][0] <= 2 * every - 1, stats
    assert digest(cut) == digest(tmp_path / "whole")


def quick(**overrides):
    """The SimCLR quick config without evaluation. The in-process runs of the suite use
    ``total_steps`` in {6, 9, 12} (checkpoints every 3), so that each run's train step is a
    program an earlier run of the session compiled (the persistent compilation cache,
    tests/conftest.py); the length of the schedule is part of the compiled program. The
    6-step run from scratch is not run again: tests/trained_workdirs.py trains it once per
    process, and each test copies its workdir."""
    config = simclr_quick_config()
    for key, value in overrides.items():
        config[key] = value
    return config


def _set_aside(workdir) -> list[str]:
    folder = Path(workdir) / "checkpoints_set_aside"
    return sorted(p.name.rsplit("-", 1)[0] for p in folder.iterdir()) if folder.exists() else []


def _saved_steps(workdir) -> list[int]:
    return sorted(int(p.name) for p in (Path(workdir) / "checkpoints").iterdir()
                  if p.name.isdigit())


def test_damaged_latest_checkpoint_is_moved_aside_and_the_previous_one_restored(tmp_path,
                                                                                capsys):
    simclr_quick_workdir(tmp_path)  # trained once per process, copied
    latest = tmp_path / "checkpoints" / "6" / "state"
    for path in latest.rglob("*"):  # corrupt every data file of the newest checkpoint
        if path.is_file() and path.stat().st_size > 0:
            path.write_bytes(b"\0" * 7)
    results = train.train_and_evaluate(quick(total_steps=9, checkpoint_every=3),
                                       str(tmp_path))
    out = capsys.readouterr().out
    assert "checkpoint 6" in out and "moved aside" in out and results["resumed_from"] == 3
    assert _set_aside(tmp_path) == ["6-damaged"]  # kept for inspection, not deleted
    assert _saved_steps(tmp_path) == [3, 6, 9]  # step 6 saved again by the rerun
    # the workdir is not stuck: the next run resumes from the new checkpoint
    again = train.train_and_evaluate(quick(total_steps=12, checkpoint_every=3), str(tmp_path))
    assert again["resumed_from"] == 9


def test_a_checkpoint_changed_after_its_save_is_detected_by_its_checksums(tmp_path, capsys):
    """Damage that orbax reads without complaint (bytes of raw array data changed after the
    save; in this tiny model's compressed chunks a flip is a read error instead, handled
    above): one bit of one parameter differs from what was saved with the checkpoint's
    checksums. The checksums do not match, so the checkpoint is moved aside and the previous
    one restored, as for other damage."""
    import jax
    import orbax.checkpoint as ocp

    from contrastive_jax.training.checkpoint_integrity import state_checksums
    from contrastive_jax.training.run import checkpoints

    simclr_quick_workdir(tmp_path)  # trained once per process, copied
    config = quick(total_steps=12, checkpoint_every=3)
    run, state = train.prepare_run(config, tmp_path)
    manager = checkpoints.manager(tmp_path, every=1, keep=5)
    state, step = checkpoints.restore_latest(manager, state, run.stream)
    assert step == 6
    recorded = jax.device_get(state_checksums(state)).tolist()
    leaves, treedef = jax.tree.flatten(state.params)
    flipped = np.array(leaves[0])
    flipped.view(np.uint32).flat[0] ^= 1  # the lowest mantissa bit: finite, nearly equal
    changed = state.replace(params=jax.tree.unflatten(
        treedef, [jax.device_put(flipped, leaves[0].sharding), *leaves[1:]]))
    assert bool(all_finite(changed))
    manager.save(9, args=ocp.args.Composite(
        state=ocp.args.StandardSave(changed), data=grain.checkpoint.CheckpointSave(run.stream),
        checksums=ocp.args.JsonSave({"state": recorded})))
    manager.wait_until_finished()
    manager.close()
    capsys.readouterr()
    results = train.train_and_evaluate(config, str(tmp_path))
    out = capsys.readouterr().out
    assert "checkpoint 9" in out and "does not match the checksums" in out, out
    assert results["resumed_from"] == 6
    assert _set_aside(tmp_path) == ["9-damaged"]


def test_state_checksums_do_not_depend_on_the_sharding_and_see_one_bit():
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from contrastive_jax.mesh import make_mesh
    from contrastive_jax.training.checkpoint_integrity import state_checksums

    rng = np.random.default_rng(0)
    tree = {"w": rng.standard_normal((16, 6)).astype(np.float32),
            "columns": rng.standard_normal((6, 16)),  # float64: two words an element
            "half": rng.standard_normal((3, 8)).astype(np.float16),
            "b": rng.standard_normal(16).astype(np.float32).astype(jax.numpy.bfloat16),
            "step": np.int32(7), "mask": rng.random(8) > 0.5,
            "key": rng.integers(0, 2**32, 2, dtype=np.uint32)}
    mesh = make_mesh({"data": 8})
    shardings = {"w": NamedSharding(mesh, P("data")),
                 "columns": NamedSharding(mesh, P(None, "data")),  # split on its last axis
                 "half": NamedSharding(mesh, P(None, "data")),
                 "b": NamedSharding(mesh, P("data")),
                 "step": NamedSharding(mesh, P()),
                 "mask": NamedSharding(mesh, P("data")),
                 "key": NamedSharding(mesh, P())}
    with jax.enable_x64(True):  # the float64 leaf stays float64
        split = jax.device_put(tree, shardings)
        whole = jax.device_get(state_checksums(tree))
        assert whole.shape == (7, 2) and whole.dtype == np.uint32
        np.testing.assert_array_equal(jax.device_get(state_checksums(split)), whole)
        np.testing.assert_array_equal(whole, ravelled_checksums(tree))  # the saved format
    for name in ("w", "b", "mask", "columns", "half"):
        changed = {k: np.array(v) for k, v in tree.items()}
        flat = changed[name].view(np.uint8).reshape(-1)
        flat[3] ^= 1  # one bit of one element
        with jax.enable_x64(True):
            differs = jax.device_get(state_checksums(changed)) != whole
        assert differs.any(axis=1).sum() == 1, name  # that leaf's row, no other


def test_the_host_checksums_equal_the_devices_and_a_partial_read_is_checked_by_name(
        tmp_path, monkeypatch):
    """The readers of pretrained weights sum host arrays in NumPy (a float64 leaf stays
    float64 whatever x64 says): the same numbers as the devices' program, chunk by chunk
    (a chunk of 5 words here). A partial tree (parameters and statistics only) is checked leaf
    by leaf against a record of today's format, and as a sub-multiset of a record before 0.3
    (a list in tree order); one changed sum, or a record that is not JSON, is a mismatch; a
    checkpoint without a record has nothing to check."""
    import json

    import jax

    from contrastive_jax.training import checkpoint_integrity as sc

    rng = np.random.default_rng(1)
    tree = {"params": {"w": rng.standard_normal((16, 6)).astype(np.float32),
                       "columns": rng.standard_normal((6, 3))},  # float64
            "rest": {"mean": rng.standard_normal(7).astype(np.float32)},
            "opt_state": {"mu": rng.standard_normal((16, 6)).astype(np.float32)},
            "step": np.int32(3), "mask": rng.random(9) > 0.5}
    monkeypatch.setattr(sc, "_CHUNK", 5)
    with jax.enable_x64(True):
        on_devices = sc.checksum_record(tree)
    assert sc.host_checksum_record(tree) == on_devices
    assert list(on_devices.values()) == ravelled_checksums(tree).tolist()

    partial = {"params": tree["params"], "rest": tree["rest"]}
    step = tmp_path / "7"
    assert sc.checksums_mismatch(step, partial, partial=True) is None  # saved before checksums
    (step / "checksums").mkdir(parents=True)
    record = step / "checksums" / "metadata"
    for saved in ({"leaves": on_devices}, {"state": ravelled_checksums(tree).tolist()}):
        record.write_text(json.dumps(saved))
        assert sc.checksums_mismatch(step, partial, partial=True) is None
        assert sc.checksums_mismatch(step, tree) is None
        changed = {"params": {**tree["params"], "w": tree["params"]["w"] * 2}, "rest":
                   tree["rest"]}
        assert "does not match the checksums" in sc.checksums_mismatch(step, changed,
                                                                       partial=True)
    record.write_text('{"leaves": ')
    assert "its checksum record cannot be read" in sc.checksums_mismatch(step, partial,
                                                                         partial=True)


def ravelled_checksums(tree) -> np.ndarray:
    """The checksums as checkpoints before 0.3 recorded them, by the obvious NumPy formula:
    each leaf's bytes as unsigned words in row-major order (8-byte values: two words), their
    sum and ``sum (2 i + 1) w_i``, mod 2^32."""
    import jax

    rows = []
    for leaf in jax.tree.leaves(tree):
        x = np.ascontiguousarray(np.asarray(leaf))
        x = x.astype(np.uint8) if x.dtype == np.bool_ else x
        words = x.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint32}[x.itemsize])
        words = words.reshape(-1).astype(np.uint64)
        weights = 2 * np.arange(words.size, dtype=np.uint64) + 1
        rows.append([int(words.sum() % 2**32), int((words * weights).sum() % 2**32)])
    return np.asarray(rows, np.uint32)


def test_the_checksums_of_an_fsdp_state_need_no_more_than_its_largest_shard():
    """16 weights of 1 MiB split by FSDP on their second axis over 8 devices (128 KiB each):
    the checksum program's temporaries per device stay within 1.1x the largest shard (a
    ``ravel`` of such a leaf is an all-gather: it needed 33 MiB)."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from contrastive_jax.mesh import make_mesh
    from contrastive_jax.training.checkpoint_integrity import state_checksums

    mesh = make_mesh({"data": 8})
    sharding = NamedSharding(mesh, P(None, "data"))
    tree = [jax.ShapeDtypeStruct((64, 4096), np.float32, sharding=sharding) for _ in range(16)]
    shard = 64 * 4096 * 4 // 8
    memory = state_checksums.lower(tree).compile().memory_analysis()
    assert memory.temp_size_in_bytes <= 1.1 * shard, memory


@pytest.mark.parametrize("when", ["evaluating", "announced"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_the_final_evaluation_stops_cleanly_and_the_rerun_evaluates(
        tmp_path, capsys, monkeypatch, signum, when):
    """SIGTERM (the default would kill the process: exit 143, no message) and SIGINT during
    the final evaluation both stop the run at once with a message and no results.json; the
    training is saved, so the same command then only evaluates and writes the results. Also
    for a signal sent as soon as the run prints ``final evaluation`` (a scheduler watching the
    log): the handler is in place before that line."""
    import os

    from contrastive_jax.training.run.progress import Progress

    simclr_quick_workdir(tmp_path)  # trained once per process, copied: steps 1-6
    config = quick(total_steps=9, checkpoint_every=3)
    config.evaluation.enabled = True
    real_evaluate, real_message = run_results.evaluate, Progress.message
    default = signal.getsignal(signum)

    def signal_self():
        if signal.getsignal(signum) is default:  # the signal would kill pytest: fail instead
            raise AssertionError("no handler for the signal at the final evaluation")
        os.kill(os.getpid(), signum)  # the handler raises before the next line
        raise AssertionError("the signal did not stop the evaluation")

    def signalled(*args, **kwargs):
        signal_self()

    def announced(self, line):
        real_message(self, line)
        if line.startswith("final evaluation"):
            signal_self()

    if when == "evaluating":
        monkeypatch.setattr(run_results, "evaluate", signalled)
    else:
        monkeypatch.setattr(Progress, "message", announced)
    before = signal.getsignal(signum)
    capsys.readouterr()
    stopped = train.train_and_evaluate(config, str(tmp_path))
    out = capsys.readouterr().out
    assert stopped == {"steps": 9, "stopped_at": 9, "resumed_from": 6}
    assert (f"stopped by {signal.Signals(signum).name} during the final evaluation: the "
            "training is finished and saved (checkpoint 9") in out, out
    assert not json.loads((tmp_path / "results.json").read_text()).get("steps") == 9
    assert signal.getsignal(signum) is before  # the handler restored
    monkeypatch.setattr(run_results, "evaluate", real_evaluate)
    monkeypatch.setattr(Progress, "message", real_message)
    results = train.train_and_evaluate(config, str(tmp_path))
    assert results["steps"] == 9 and results["resumed_from"] == 9
    assert 0 <= results["linear_probe"] <= 1 and results["evaluations"][-1]["step"] == 9


def test_non_finite_newest_checkpoint_is_moved_aside(tmp_path, capsys):
    import jax
    import orbax.checkpoint as ocp

    from contrastive_jax.training.run import checkpoints

    simclr_quick_workdir(tmp_path)  # trained once per process, copied
    config = quick(total_steps=12, checkpoint_every=3)
    run, state = train.prepare_run(config, tmp_path)
    manager = checkpoints.manager(tmp_path, every=1, keep=5)
    state, step = checkpoints.restore_latest(manager, state, run.stream)
    assert step == 6 and bool(all_finite(state))
    poisoned = state.replace(params=jax.tree.map(lambda x: x * np.nan, state.params))
    assert not bool(all_finite(poisoned))
    manager.save(9, args=ocp.args.Composite(
        state=ocp.args.StandardSave(poisoned), data=grain.checkpoint.CheckpointSave(run.stream)))
    manager.wait_until_finished()
    manager.close()
    capsys.readouterr()
    results = train.train_and_evaluate(config, str(tmp_path))
    assert "checkpoint 9" in capsys.readouterr().out and results["resumed_from"] == 6
    assert _set_aside(tmp_path) == ["9-non-finite"]


def test_a_diverged_run_sets_its_checkpoints_aside_and_the_fixed_rerun_resumes_before(
        tmp_path):
    """lr = 1e30 from a good checkpoint: every update overflows the parameters and is skipped;
    the run stops, moving aside the checkpoints from the step whose parameters led to the
    skipped steps. With the rate fixed, the rerun resumes from the last good one, not from
    a poisoned one."""
    simclr_quick_workdir(tmp_path)  # trained once per process, copied
    bad = quick(total_steps=30, checkpoint_every=3, max_skipped_in_a_row=3)
    bad.optimizer.learning_rate = 1e30
    with pytest.raises(train.NonFiniteError, match=r"step 9: .*3 steps in a row.*steps >= 6 "
                                                   r"hold the parameters.*moved to.*next run "
                                                   r"resumes from step 3\.") as caught:
        train.train_and_evaluate(bad, str(tmp_path), accept_config_change=True)
    assert (caught.value.step, caught.value.in_a_row) == (9, 3)
    assert _set_aside(tmp_path) == ["6-diverged"]  # no save at 9: its update was skipped
    assert _saved_steps(tmp_path) == [1, 3]
    results = train.train_and_evaluate(quick(total_steps=9, checkpoint_every=3),
                                       str(tmp_path), accept_config_change=True)
    assert results["resumed_from"] == 3


def test_a_diverging_run_saves_no_checkpoint_that_would_push_the_good_ones_out(tmp_path):
    """Checkpoints every step, keep 3, six skipped updates: saving them (the last good
    parameters under later steps) would delete checkpoints 1, 3 and 6 before the guard sets
    the diverged ones aside, leaving nothing to resume from. Saves wait while updates are
    skipped, so checkpoints 1 and 3 survive and the next run resumes from 3."""
    simclr_quick_workdir(tmp_path)  # trained once per process, copied: checkpoints 1, 3, 6
    bad = quick(total_steps=12, checkpoint_every=1)
    bad.optimizer.learning_rate = 1e30
    assert (bad.keep_checkpoints, bad.max_skipped_in_a_row) == (3, 10)
    with pytest.raises(train.NonFiniteError, match=r"step 12: .*last 6 update\(s\).*steps >= 6"
                                                   r".*next run resumes from step 3\.") as caught:
        train.train_and_evaluate(bad, str(tmp_path), accept_config_change=True)
    assert (caught.value.step, caught.value.in_a_row) == (12, 6)
    assert _saved_steps(tmp_path) == [1, 3]  # a fresh run's first step is saved too
    assert _set_aside(tmp_path) == ["6-diverged"]  # none of steps 7-12 was saved


def test_no_restorable_checkpoint_and_a_different_model_are_clear_errors(tmp_path):
    simclr_quick_workdir(tmp_path)  # trained once per process, copied
    wider = quick(total_steps=9)
    wider.model.encoder.features = 24
    with pytest.raises(ConfigError, match=r"another config.*model\.encoder\.features: 16 -> 24"):
        train.train_and_evaluate(wider, str(tmp_path))  # workdir/config.json tells first
    with pytest.raises(CheckpointError, match=r"different shape.*new --workdir"):
        train.train_and_evaluate(wider, str(tmp_path), accept_config_change=True)
    for step in (tmp_path / "checkpoints").iterdir():
        if step.name.isdigit():
            shutil.rmtree(step / "state")
    with pytest.raises(CheckpointError, match=r"none of the checkpoints.*can be restored"):
        train.train_and_evaluate(quick(total_steps=9), str(tmp_path))


def test_checkpoints_of_another_state_layout_are_a_clear_error(tmp_path):
    """A workdir written by an older version (the train state as a plain dict, MoCo's state at
    the top level) is declared incompatible, naming what differs."""
    import orbax.checkpoint as ocp

    from contrastive_jax.training.data import train_iterator
    from contrastive_jax.training.run import checkpoints

    config = quick(total_steps=3)
    old = {"step": np.int32(3), "params": {"w": np.ones(3, np.float32)},
           "queue": np.zeros((4, 2), np.float32)}
    manager = checkpoints.manager(tmp_path / "w", every=1, keep=1)
    stream = train_iterator(config.data, make_mesh())
    manager.save(3, args=ocp.args.Composite(state=ocp.args.StandardSave(old),
                                            data=grain.checkpoint.CheckpointSave(stream)))
    manager.wait_until_finished()
    manager.close()
    with pytest.raises(CheckpointError, match=r"another train-state layout.*'queue'"):
        train.train_and_evaluate(config, str(tmp_path / "w"))


def test_persistent_non_finite_losses_stop_the_run_naming_the_step(tmp_path, capsys):
    config = load_config("mi_gaussian.py:quick")
    config.total_steps = 12
    config.max_skipped_in_a_row = 3
    config.optimizer.learning_rate = 1e30  # the first update sends the weights to infinity
    with pytest.raises(train.NonFiniteError, match=r"step 3: .* 3 steps in a row"):
        train.train_and_evaluate(config, str(tmp_path / "guard"))  # refused: steps 1-3
    # a run too short for that guard (all 12 updates skipped, fewer than 20 in a row) ends
    # in the same error, without results, its progress lines counting the skips
    config.max_skipped_in_a_row = 20
    capsys.readouterr()
    with pytest.raises(train.NonFiniteError, match=r"step 12: .* non-finite for the run's last "
                                                   r"12 update\(s\), each skipped.* No "
                                                   r"checkpoint was saved from step 0 on .* "
                                                   r"the next run starts from scratch\."):
        train.train_and_evaluate(config, str(tmp_path / "short"))
    out = capsys.readouterr().out
    assert "step     12/12 | " in out and "| skipped 12 |" in out, out
    assert not (tmp_path / "short" / "results.json").exists()


USER_ERRORS = [
    (["--config.data.batchsize=8"], 'unknown config key .*Did you mean "batch_size"'),
    (["--config.model.xyzzy_setting=1"], "unknown config key xyzzy_setting"),  # no close match
    (["--config.loss.temperature=0"], "loss.temperature must be > 0"),
    (["--config.data.name=cifar10"], "not prepared .*tfds build cifar10"),
    (["--config.data.batch_size=abc"], "invalid literal for int"),
    (["--config=configs/simclr_mnist1d.py:quick,batchh=32"],
     "unknown config variant 'batchh'; did you mean 'batch'"),
    (["--config=configs/simclr_mnist1d.py:quick,temperature=nan"],
     "loss.temperature must be > 0; got nan"),
    (["--config=configs/no_such_config.py"], "could not be loaded: .*No such file"),
    (["--config=configs/no_such_config.py", "--config.seed=1"],
     "--config could not be loaded: .*No such file"),  # an override of a file not loaded
    (["--no_such_flag=1"], r"^error: unknown flag --no_such_flag \(`python -m "
                           r"contrastive_jax.main --help` lists the flags\)\n$"),
    # JAX's options are flags, applied before the run: 2 devices, not the suite's 8
    (["--jax_num_cpu_devices=2", "--config.data.batch_size=3"],
     "global batch 3 does not divide by the 2 devices"),
    (["--workdir="], "--workdir is empty"),
    (["--config.optimizer.learning_rate=nan"], "learning_rate must be a finite .* got nan"),
    (["--config.optimizer.learning_rate=inf"], "learning_rate must be a finite .* got inf"),
    # the config file's own code fails: its line, not the loaders' traceback
    (["--config=tests/fixtures/configs/raises_on_import.py"],
     r"--config file \S*/raises_on_import.py, line 8: ValueError: no data folder "
     r"/nonexistent-contrastive-jax-data; fix the config file"),
    (["--config=tests/fixtures/configs/raises_in_get_config.py"],
     r"--config file \S*/raises_in_get_config.py, line 7: KeyError: 'hidden_size'"),
    (["--config=tests/fixtures/configs/syntax_error.py"],
     r"--config file \S*/syntax_error.py, line 2: SyntaxError: expected ':'"),
    # a stream of shards (docs/data.md "Your own image-text shards"): checked before any work
    (["--config=configs/clip_vit_b16_pod.py:tiny,stream=/nonexistent-cj/{0..3}.tar,steps=2"],
     r"data.shards '/nonexistent-cj/\{0..3\}.tar': '/nonexistent-cj/0.tar' matches no file "
     r"\(and 3 more of its 4 names\)"),
    (["--config=configs/clip_vit_b16_pod.py:tiny,stream=README.md,steps=2"],
     r"shard 'README.md' is neither a webdataset tar \(.tar, .tar.gz, .tgz\) nor a parquet"),
    (["--config=configs/clip_vit_b16_pod.py:tiny,stream=/data/{0..9}.tar"],
     r"stream=/data/\{0..9\}.tar: give the step count with steps=N"),
]


def run_command_lines(commands: list, env: dict | None = None) -> list:
    """``contrastive_jax.main`` with each of ``commands`` (the arguments after ``-m
    contrastive_jax.main``, or a dict: ``args``, and ``env`` or ``bug``, a message the trainer
    raises as a RuntimeError), in turn, each a child forked by tests/forked_command_lines.py's
    server that ends at once (``os._exit``: its status and output are all that is checked):
    each result has the command's ``returncode``, ``stdout`` and ``stderr``. ``env`` is added to
    every command's environment."""
    results = []
    for request in (dict(c) if isinstance(c, dict) else {"args": c} for c in commands):
        run = forked_command_lines.server().start(
            request["args"], {**child_environment(), **(env or {}), **request.get("env", {})},
            bug=request.get("bug"), exit_at_once=True)
        out, err = run.communicate(timeout=300)
        results.append(SimpleNamespace(returncode=run.returncode, stdout=out, stderr=err))
    return results


@pytest.fixture(scope="module")
def command_line_runs(tmp_path_factory):
    """Every command line of this module's exit-status tests, run once (one interpreter, a
    fork each): ``user_errors``, those of USER_ERRORS in order; ``bug``, a run whose trainer
    raises a RuntimeError; ``traceback``, a user error with CONTRASTIVE_JAX_TRACEBACK=1;
    ``unwritable``, a --workdir under a plain file."""
    commands = []
    for argv, _ in USER_ERRORS:
        base = command(tmp_path_factory.mktemp("w") / "w")[3:]
        if argv[0].startswith("--config="):  # another config file or variant instead of QUICK's
            base = [a for a in base if not a.startswith("--config")] + argv[:1]
            argv = argv[1:]
        commands.append(base + argv)
    blocker = tmp_path_factory.mktemp("blocked") / "file"
    blocker.write_text("")
    named = {"bug": {"args": command(tmp_path_factory.mktemp("w") / "w")[3:], "bug": "a bug"},
             "traceback": {"args": command(tmp_path_factory.mktemp("w") / "w",
                                           "--config.loss.temperature=0")[3:],
                           "env": {"CONTRASTIVE_JAX_TRACEBACK": "1"}},
             "unwritable": command(blocker / "run")[3:]}
    runs = run_command_lines(commands + list(named.values()))
    return SimpleNamespace(user_errors=runs[:len(commands)],
                           **dict(zip(named, runs[len(commands):], strict=True)))


@pytest.mark.parametrize("case", range(len(USER_ERRORS)),
                         ids=[f"{argv[-1]}" for argv, _ in USER_ERRORS])
def test_user_errors_exit_2_with_one_paragraph(command_line_runs, case):
    import re

    message, run = USER_ERRORS[case][1], command_line_runs.user_errors[case]
    assert run.returncode == 2, run.stderr[-2000:]
    assert re.search(message, run.stderr, re.S), run.stderr[-2000:]
    assert "Traceback" not in run.stderr and run.stderr.count("error:") == 1


def test_anything_else_raises_with_its_traceback(command_line_runs):
    """A bug is not a user error: exit status 1 and the traceback (docs/reliability.md); and
    CONTRASTIVE_JAX_TRACEBACK=1 shows the traceback of a user error too."""
    run = command_line_runs.bug
    assert run.returncode == 1 and "Traceback" in run.stderr
    assert "RuntimeError: a bug" in run.stderr and "error: a bug" not in run.stderr
    shown = command_line_runs.traceback
    assert shown.returncode == 1 and "Traceback" in shown.stderr
    assert "ConfigError: loss.temperature must be > 0" in shown.stderr


def test_global_batch_must_divide_over_the_devices(tmp_path):
    with pytest.raises(ValueError, match="global batch 12 does not divide by the 8"):
        train.train_and_evaluate(_batch(12), str(tmp_path))


def _batch(size):
    config = quick(total_steps=2)
    config.data.batch_size = size
    return config


def test_unwritable_workdir_is_a_short_error(command_line_runs):
    run = command_line_runs.unwritable
    assert run.returncode == 2 and "is not writable" in run.stderr
    assert "Traceback" not in run.stderr


def test_moco_queue_and_digest():
    with pytest.raises(ValueError, match="multiple of the global batch"):
        config = load_config("moco_mnist1d.py:quick")
        config.moco.queue_size = 100
        method_for(config)
    state = SimpleNamespace(params={"w": np.ones(3, np.float32)}, rest={})
    bumped = np.array([1, 1, np.nextafter(np.float32(1), np.float32(2))], np.float32)
    other = SimpleNamespace(params={"w": bumped}, rest={})  # one bit different
    assert params_digest(state) != params_digest(other)
    assert params_digest(state) == params_digest(SimpleNamespace(**vars(state)))
