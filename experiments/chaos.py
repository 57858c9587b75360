"""Chaos test of the main job: faults injected into real runs, each compared with an
uninterrupted run.

    python experiments/chaos.py [--config configs/simclr_mnist1d.py] [--steps 200]
        [--kills 5] [--checkpoint-every 20] [--seed 0] [--faults kill damaged non_finite
        concurrent flipped all_skipped signal_in_evaluation file_size_limit] [--quick]
    python experiments/chaos.py --processes 2 [--faults host_lost coordinator_lost
        one_signalled disagreeing] [--quick]

Runs the job once without interruption (``--steps`` steps, evaluation off), then once per
fault in a fresh workdir, and checks the final parameter hash (``params_sha256`` in
results.json: parameters and BatchNorm statistics) against the uninterrupted run's:

- ``kill``: SIGKILL (no chance to save) at a random step after each (re)start, ``--kills``
  times, restarting the same command until it finishes; the steps lost per kill are the step it
  was killed at minus the checkpoint it resumed from;
- ``damaged``: SIGTERM at a random step (a checkpoint is saved there), then every file of that
  newest checkpoint truncated to half; the rerun must move it aside, resume from the previous
  checkpoint and finish;
- ``non_finite``: SIGTERM at a random step, then a rerun with learning rate 1e30 (accepted as
  a config change) whose updates all overflow: it must stop (exit 2) after 3 skipped steps and
  move aside the checkpoints from the step that led there; the original command (accepting the
  change back) resumes from the checkpoint before and finishes;
- ``concurrent``: a second trainer started on the workdir while the first runs must stop at
  once (exit 2, naming the holder of the lock) while the first finishes;
- ``flipped``: SIGTERM at a random step, then 64 bytes XOR-ed in the middle of the largest
  array file of that newest checkpoint (``state/ocdbt.process_0/d/``; its size unchanged, so
  nothing but its content says it is damaged); the rerun must find that it does not match the
  checksums saved with it (or fail to read it), move it aside and resume from the previous
  checkpoint. (In ``--quick``'s tiny model the middle of that file is not part of any
  restored array: the rerun restores the state as saved, its checksums match, and the row
  says so.)
- ``all_skipped``: SIGTERM at a random step, then a rerun of 5 more steps with learning rate
  1e30 (too short for the 10-in-a-row guard): every update is skipped, so it must stop with
  exit 2 and no ``results.json`` (not report an untrained model as done) and move aside the
  checkpoints that led there; the original command resumes before them and finishes;
- ``signal_in_evaluation``: the job with its final evaluation on, SIGTERM once it prints
  ``final evaluation``: exit 0 with a message and no ``results.json``; the same command then
  only evaluates (it resumes at the last step) and writes the results;
- ``file_size_limit``: SIGTERM at a random step, then the same command under ``ulimit -f``
  at half the size of the largest file the uninterrupted run wrote: the next checkpoint's
  write is refused, which must end the run with exit 2 and one ``error: cannot write``
  paragraph on stderr (no traceback); the same command without the limit resumes from the
  last complete checkpoint and finishes.

``--processes 2`` runs the job as 2 processes over loopback (1 CPU device each, the launch
variables, heartbeat 10 s) and injects the multi-host faults instead
(docs/reliability.md, "Multi-host faults"):

- ``host_lost`` / ``coordinator_lost``: SIGKILL of process 1 / of process 0 (which hosts
  JAX's coordination service) at a random step: the other must exit 75 with one line (no
  traceback), then both rerun from the last checkpoint to the end;
- ``one_signalled``: SIGTERM to process 1 only: both stop after the same step and exit 0; the
  rerun resumes there;
- ``disagreeing``: process 1 started with another batch size: both exit 2 at start naming
  it, nothing written; then the right command runs to the end.

Writes ``experiments/results/chaos.md`` (``chaos_2_processes.md`` with ``--processes 2``; no
``.csv`` or plot: one row per fault). Exits 1 if any hash differs or a fault was not handled as
described.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import time

from common import reporting
from common.reporting import RESULTS, ROOT, markdown_table


def command(config: str, workdir: pathlib.Path, steps: int, every: int) -> list[str]:
    """The trainer's command line for the job (evaluation off, logging every step)."""
    return [sys.executable, "-m", "contrastive_jax.main", f"--config={config}",
            f"--workdir={workdir}", f"--config.total_steps={steps}",
            f"--config.checkpoint_every={every}", "--config.log_every=1",
            "--config.evaluation.enabled=False"]


def logged_step(workdir: pathlib.Path) -> int:
    """The last step the run logged (metrics.jsonl), 0 if none."""
    from contrastive_jax.training.run.progress import read_metrics_lines

    lines = [json.loads(line) for line in read_metrics_lines(workdir) if line.strip()]
    return max((r["step"] for r in lines if r.get("prefix") == "train"), default=0)


def run_with_kills(cmd, workdir: pathlib.Path, steps: int, kills: int, rng: random.Random,
                   env, popen=None) -> dict:
    """Start ``cmd`` repeatedly, SIGKILL it at a random logged step ``kills`` times.
    ``popen(cmd, env)`` starts it (:func:`_start` when None; the test suite forks it)."""
    stats = {"runs": 0, "kills": 0, "resumes": 0, "lost": []}
    while True:
        start = logged_step(workdir)
        stats["runs"] += 1
        proc = (popen or _start)(cmd, env)
        # a random step in the first half of what is left, so the kill lands before the end
        half = start + max(2, (steps - start) // 2)
        target = rng.randint(start + 2, half) if stats["kills"] < kills and \
            half < steps else None
        killed_at = None
        while proc.poll() is None:
            if target is not None and logged_step(workdir) >= target:
                killed_at = logged_step(workdir)
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.005)
        out, err = proc.communicate(timeout=600)
        if "resumed from step" in out:
            stats["resumes"] += 1
        if killed_at is not None:
            stats["kills"] += 1
            resumed = [int(p.name) for p in (workdir / "checkpoints").iterdir()
                       if p.name.isdigit()] if (workdir / "checkpoints").exists() else []
            stats["lost"].append(killed_at - max(resumed, default=0))
            continue
        if proc.returncode != 0:
            raise RuntimeError(f"run failed ({proc.returncode}):\n{err[-3000:]}")
        return stats


def _start(cmd, env) -> subprocess.Popen:
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=1800)
    return proc.returncode, out, err


def _wait_for_step(procs: list[subprocess.Popen], workdir: pathlib.Path, target: int) -> None:
    """Until the run has logged step ``target`` (or a process ended)."""
    while all(p.poll() is None for p in procs) and logged_step(workdir) < target:
        time.sleep(0.005)


def _stop_at(cmd, workdir: pathlib.Path, target: int, env) -> int:
    """Run ``cmd`` until it has logged step ``target``, then SIGTERM it (it saves a checkpoint
    at the step it stops at); returns that step."""
    proc = _start(cmd, env)
    _wait_for_step([proc], workdir, target)
    proc.send_signal(signal.SIGTERM)
    code, out, err = _finish(proc)
    if code != 0 or "stopped by signal" not in out:
        raise RuntimeError(f"SIGTERM did not stop the run cleanly ({code}):\n{err[-3000:]}")
    return int(out.split("after step ")[1].split(":")[0])


def _saved(workdir: pathlib.Path) -> list[int]:
    folder = workdir / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) \
        if folder.exists() else []


def _set_aside(workdir: pathlib.Path) -> list[str]:
    folder = workdir / "checkpoints_set_aside"
    return sorted(p.name.rsplit("-", 1)[0] for p in folder.iterdir()) if folder.exists() else []


def fault_kill(cmd, workdir, steps, rng, env, *, kills: int, **_) -> dict:
    stats = run_with_kills(cmd, workdir, steps, kills, rng, env)
    lost = stats["lost"]
    return {"what": f"SIGKILL at a random step, {stats['kills']} times",
            "seen": f"{stats['runs']} runs, {stats['resumes']} resumes; steps lost per kill "
                    f"{lost} (mean {sum(lost) / max(len(lost), 1):.1f})",
            "ok": stats["kills"] == kills and stats["resumes"] == kills}


def fault_damaged(cmd, workdir, steps, rng, env, *, every: int, **_) -> dict:
    stopped = _stop_at(cmd, workdir, rng.randint(2 * every, steps // 2), env)
    newest = workdir / "checkpoints" / str(stopped) / "state"
    for path in newest.rglob("*"):
        if path.is_file():
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    before = [s for s in _saved(workdir) if s < stopped][-1]
    code, out, _ = _finish(_start(cmd, env))
    ok = (code == 0 and f"resumed from step {before}" in out
          and _set_aside(workdir) == [f"{stopped}-damaged"])
    return {"what": f"SIGTERM at step {stopped}, its checkpoint's files truncated to half",
            "seen": f"exit {code}; moved aside {_set_aside(workdir)}, resumed from step "
                    f"{before}",
            "ok": ok}


def fault_non_finite(cmd, workdir, steps, rng, env, *, every: int, **_) -> dict:
    stopped = _stop_at(cmd, workdir, rng.randint(2 * every, steps // 2), env)
    diverge = [*cmd, "--config.optimizer.learning_rate=1e30", "--config.max_skipped_in_a_row=3",
               "--accept_config_change"]
    code, _, err = _finish(_start(diverge, env))
    moved = _set_aside(workdir)
    good = _saved(workdir)
    fixed, out, _ = _finish(_start([*cmd, "--accept_config_change"], env))
    ok = (code == 2 and "in a row" in err and moved and all("diverged" in m for m in moved)
          and fixed == 0 and (f"resumed from step {good[-1]}" in out if good else True))
    return {"what": f"SIGTERM at step {stopped}, then a rerun with learning rate 1e30",
            "seen": f"exit {code} after 3 skipped steps; moved aside {moved}; the fixed rerun: "
                    f"exit {fixed}, resumed from step {good[-1] if good else 0}",
            "ok": ok}


def fault_concurrent(cmd, workdir, steps, rng, env, **_) -> dict:
    first = _start(cmd, env)
    while first.poll() is None and logged_step(workdir) < 2:
        time.sleep(0.005)
    start = time.monotonic()
    second, _, err = _finish(_start(cmd, env))
    waited = time.monotonic() - start
    code, _, _ = _finish(first)
    ok = second == 2 and "in use by another trainer" in err and code == 0
    return {"what": "a second trainer on the workdir while the first runs",
            "seen": f"second: exit {second} after {waited:.1f} s, 'in use by another "
                    f"trainer (pid ...)'; first: exit {code}",
            "ok": ok}


def _resumed_from(out: str) -> str:
    """The step a run's output says it resumed from, ``-`` if none."""
    return out.split("resumed from step ")[1].split(":")[0] if "resumed from step" in out \
        else "-"


def fault_flipped(cmd, workdir, steps, rng, env, *, every: int, **_) -> dict:
    stopped = _stop_at(cmd, workdir, rng.randint(2 * every, steps // 2), env)
    state = workdir / "checkpoints" / str(stopped) / "state"
    largest = max((p for p in state.rglob("*") if p.is_file() and p.parent.name == "d"),
                  key=lambda p: p.stat().st_size)
    data = bytearray(largest.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(b ^ 0xFF for b in data[middle:middle + 64])
    largest.write_bytes(bytes(data))
    before = [s for s in _saved(workdir) if s < stopped][-1]
    code, out, _ = _finish(_start(cmd, env))
    how = ("its checksums do not match" if "does not match the checksums" in out else
           "a read error" if "cannot be restored" in out else None)
    if how is None:  # restored: it matched its checksums, so the bytes were not state bytes
        how = "no, the changed bytes are not read (the state matches its checksums)"
        ok = code == 0 and _resumed_from(out) == str(stopped) and not _set_aside(workdir)
    else:
        ok = (code == 0 and _resumed_from(out) == str(before)
              and _set_aside(workdir) == [f"{stopped}-damaged"])
    return {"what": f"SIGTERM at step {stopped}, 64 bytes XOR-ed in its checkpoint's largest "
                    f"array file ({largest.relative_to(state).parent}, {len(data):,} bytes; "
                    "size unchanged)",
            "seen": f"exit {code}; detected: {how}; moved aside {_set_aside(workdir)}, "
                    f"resumed from step {_resumed_from(out)}",
            "ok": ok}


def fault_all_skipped(cmd, workdir, steps, rng, env, *, every: int, **_) -> dict:
    stopped = _stop_at(cmd, workdir, rng.randint(2 * every, steps // 2), env)
    short = [*cmd, f"--config.total_steps={stopped + 5}",
             "--config.optimizer.learning_rate=1e30", "--accept_config_change"]
    code, _, err = _finish(_start(short, env))
    moved = _set_aside(workdir)
    good = _saved(workdir)
    no_results = not (workdir / "results.json").exists()
    fixed, out, _ = _finish(_start([*cmd, "--accept_config_change"], env))
    ok = (code == 2 and "last 5 update(s), each skipped" in err and no_results
          and moved and all("diverged" in m for m in moved) and fixed == 0
          and f"resumed from step {good[-1]}" in out)
    return {"what": f"SIGTERM at step {stopped}, then 5 more steps with learning rate 1e30",
            "seen": f"exit {code}, 'the run's last 5 update(s), each skipped', "
                    f"{'no' if no_results else 'a'} results.json; moved aside {moved}; the "
                    f"rerun: exit {fixed}, resumed from step {good[-1] if good else 0}",
            "ok": ok}


def fault_signal_in_evaluation(cmd, workdir, steps, rng, env, **_) -> dict:
    evaluated = [*cmd, "--config.evaluation.enabled=True"]
    proc = subprocess.Popen(evaluated, env={**env, "PYTHONUNBUFFERED": "1"}, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    signalled = False
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "final evaluation:" in line and not signalled:
            proc.send_signal(signal.SIGTERM)
            signalled = True
    code = proc.wait(timeout=600)
    out = "".join(lines)
    no_results = not (workdir / "results.json").exists()
    again, rerun, _ = _finish(_start(evaluated, env))
    results = json.loads((workdir / "results.json").read_text()) if again == 0 else {}
    ok = (signalled and code == 0 and "stopped by SIGTERM during the final evaluation" in out
          and no_results and again == 0 and f"resumed from step {steps}" in rerun
          and results.get("evaluations", [{}])[-1].get("step") == steps)
    return {"what": "SIGTERM once the run printed 'final evaluation'",
            "seen": f"exit {code}, 'stopped by SIGTERM during the final evaluation', "
                    f"{'no' if no_results else 'a'} results.json; the rerun: exit {again}, "
                    f"only evaluated (resumed from step {steps})",
            "ok": ok}


def fault_file_size_limit(cmd, workdir, steps, rng, env, *, every: int, largest: int,
                          **_) -> dict:
    stopped = _stop_at(cmd, workdir, rng.randint(2 * every, steps // 2), env)
    kib = largest // 2 // 1024
    before = _saved(workdir)
    # a shell's ulimit, not preexec_fn (unsafe to fork from a threaded process)
    limited = ["bash", "-c", f'ulimit -f {kib} && exec "$@"', "bash", *cmd]
    code, _, err = _finish(_start(limited, env))
    errors = [line for line in err.splitlines()
              if line.strip() and "Warning" not in line and "warn(" not in line]
    one_paragraph = len(errors) == 1 and errors[0].startswith("error: cannot write")
    named = errors[0].replace(str(workdir), "WORKDIR").split(":")[0:2] if errors else []
    intact = [s for s in _saved(workdir) if s in before]
    fixed, out, _ = _finish(_start(cmd, env))
    resumed = _resumed_from(out)
    ok = (code == 2 and one_paragraph and "file-size limit" in err and intact == before
          and fixed == 0 and resumed == str(max(before)))
    return {"what": f"SIGTERM at step {stopped}, then the same command under `ulimit -f {kib}`",
            "seen": f"exit {code}, {'one' if one_paragraph else 'NOT one'} paragraph "
                    f"'{':'.join(named)}: File too large ...'; checkpoints {before} intact; "
                    f"without the limit: exit {fixed}, resumed from step {resumed}",
            "ok": ok}


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _job(cmd, env, extra: tuple[list[str], list[str]] = ([], [])) -> list[subprocess.Popen]:
    """``cmd`` as a 2-process job over loopback (1 CPU device each); ``extra``: arguments
    added to process 0's and process 1's command."""
    port = _free_port()
    return [_start([*cmd, *extra[i]], {**env, "CONTRASTIVE_JAX_COORDINATOR": f"127.0.0.1:{port}",
                                        "CONTRASTIVE_JAX_NUM_PROCESSES": "2",
                                        "CONTRASTIVE_JAX_PROCESS_ID": str(i),
                                        "JAX_PLATFORMS": "cpu"})
            for i in range(2)]


def _finish_job(procs) -> list[tuple[int, str, str]]:
    return [_finish(p) for p in procs]


def _lost(cmd, workdir, steps, rng, env, victim: int) -> dict:
    """SIGKILL of process ``victim`` at a random step; the other must exit 75 with one line;
    then both rerun to the end."""
    target = rng.randint(steps // 4, steps // 2)
    procs = _job(cmd, env)
    _wait_for_step(procs, workdir, target)
    killed_at = logged_step(workdir)
    procs[victim].send_signal(signal.SIGKILL)
    start = time.monotonic()
    code, _, err = _finish(procs[1 - victim])
    waited = time.monotonic() - start
    procs[victim].wait()
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    saved = _saved(workdir)
    rerun = _finish_job(_job(cmd, env))
    resumed = _resumed_from(rerun[0][1])
    ok = (code == 75 and len(errors) == 1 and "the job lost a process" in errors[0]
          and "Traceback" not in err and all(c == 0 for c, _, _ in rerun)
          and resumed == str(max(saved, default=0) if saved else "-"))
    return {"what": f"SIGKILL of process {victim} of 2 at step {killed_at}",
            "seen": f"process {1 - victim}: exit {code} after {waited:.1f} s, "
                    f"{'one line' if len(errors) == 1 else f'{len(errors)} error lines'}; "
                    f"both rerun: exit {[c for c, _, _ in rerun]}, resumed from step {resumed}",
            "ok": ok}


def fault_host_lost(cmd, workdir, steps, rng, env, **_) -> dict:
    return _lost(cmd, workdir, steps, rng, env, victim=1)


def fault_coordinator_lost(cmd, workdir, steps, rng, env, **_) -> dict:
    return _lost(cmd, workdir, steps, rng, env, victim=0)


def fault_one_signalled(cmd, workdir, steps, rng, env, **_) -> dict:
    """SIGTERM to process 1 only: both stop after the same step and exit 0; then rerun."""
    target = rng.randint(steps // 4, steps // 2)
    procs = _job(cmd, env)
    _wait_for_step(procs, workdir, target)
    procs[1].send_signal(signal.SIGTERM)
    ends = _finish_job(procs)
    stopped = ends[0][1].split("after step ")[1].split(":")[0] if "after step " in ends[0][1] \
        else "?"
    rerun = _finish_job(_job(cmd, env))
    ok = ([c for c, _, _ in ends] == [0, 0] and "stopped by" in ends[0][1]
          and _resumed_from(rerun[0][1]) == stopped and all(c == 0 for c, _, _ in rerun))
    return {"what": f"SIGTERM to process 1 of 2 at step {target}",
            "seen": f"both exit {[c for c, _, _ in ends]}, stopped after step {stopped}; the "
                    f"rerun resumed from step {_resumed_from(rerun[0][1])}",
            "ok": ok}


def fault_disagreeing(cmd, workdir, steps, rng, env, **_) -> dict:
    """Process 1 started with another batch size: both exit 2 at start with one line naming
    it, nothing written; then the right command finishes."""
    ends = _finish_job(_job(cmd, env, ([], ["--config.data.batch_size=32"])))
    named = all("process 1: data.batch_size" in err for _, _, err in ends)
    written = (workdir / "checkpoints").exists()
    rerun = _finish_job(_job(cmd, env))
    ok = ([c for c, _, _ in ends] == [2, 2] and named and not written
          and all(c == 0 for c, _, _ in rerun))
    return {"what": "process 1 of 2 started with data.batch_size=32",
            "seen": f"both exit {[c for c, _, _ in ends]} naming data.batch_size, "
                    f"{'a checkpoint' if written else 'nothing'} written; the right command: "
                    f"exit {[c for c, _, _ in rerun]}",
            "ok": ok}


MULTI_PROCESS_FAULTS = {"host_lost": fault_host_lost,
                        "coordinator_lost": fault_coordinator_lost,
                        "one_signalled": fault_one_signalled, "disagreeing": fault_disagreeing}
FAULTS = {"kill": fault_kill, "damaged": fault_damaged, "non_finite": fault_non_finite,
          "concurrent": fault_concurrent, "flipped": fault_flipped,
          "all_skipped": fault_all_skipped, "signal_in_evaluation": fault_signal_in_evaluation,
          "file_size_limit": fault_file_size_limit, **MULTI_PROCESS_FAULTS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/simclr_mnist1d.py")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--faults", nargs="+", choices=list(FAULTS), default=None)
    parser.add_argument("--processes", type=int, choices=(1, 2), default=1,
                        help="2: the job as 2 processes over loopback, the multi-host faults")
    parser.add_argument("--quick", action="store_true", help="tiny model, 60 steps, 2 kills")
    parser.add_argument("--out", default=None, help="default: experiments/results/chaos.md "
                        "(chaos_2_processes.md with --processes 2)")
    args = parser.parse_args(argv)
    args.out = args.out or str(RESULTS / ("chaos_2_processes.md" if args.processes == 2
                                          else "chaos.md"))
    config = args.config + (":quick" if args.quick else "")
    steps, kills, every = (60, 2, 4) if args.quick else (args.steps, args.kills,
                                                         args.checkpoint_every)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    faults = args.faults or [f for f in FAULTS
                             if (f in MULTI_PROCESS_FAULTS) == (args.processes == 2)]
    heartbeat = ["--config.launch.heartbeat_timeout_s=10"] if args.processes == 2 else []
    rng = random.Random(args.seed)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        whole_cmd = [*command(config, tmp / "whole", steps, every), *heartbeat]
        if args.processes == 2:
            ends = _finish_job(_job(whole_cmd, env))
            if any(code != 0 for code, _, _ in ends):
                raise RuntimeError(ends[0][2][-3000:] + ends[1][2][-3000:])
        else:
            whole = subprocess.run(whole_cmd, env=env, cwd=ROOT, capture_output=True,
                                   text=True, timeout=1800)
            if whole.returncode != 0:
                raise RuntimeError(whole.stderr[-3000:])
        whole_results = json.loads((tmp / "whole" / "results.json").read_text())
        want = whole_results["params_sha256"]
        largest = max(p.stat().st_size for p in (tmp / "whole").rglob("*") if p.is_file())
        for name in faults:
            workdir = tmp / name
            row = FAULTS[name]([*command(config, workdir, steps, every), *heartbeat], workdir,
                               steps, rng, env, kills=kills, every=every, largest=largest)
            got = json.loads((workdir / "results.json").read_text())["params_sha256"]
            row.update(fault=name, same=got == want, hash=got[:16] + "...")
            rows.append(row)
            print(f"{name}: {row}", flush=True)
    passed = all(r["ok"] and r["same"] for r in rows)
    table = markdown_table(
        ["fault", "injected", "what the run did", "handled as described", "final hash equal",
         "final hash"],
        [[r["fault"], r["what"], r["seen"], "yes" if r["ok"] else "NO",
          "yes" if r["same"] else "NO", r["hash"]] for r in rows])
    produced = (f"{reporting.command(__file__, argv)}: `{config}`, {steps} steps, checkpoint every "
                f"{every}, seed {args.seed}; uninterrupted hash {want[:16]}...")
    processes = f", {args.processes} processes" if args.processes > 1 else ""
    text = (f"# Chaos: {config}, {steps} steps, checkpoint every {every}{processes}\n\n"
            f"{reporting.provenance_line(whole_results['provenance'])}\n\n"  # the runs'
            f"{produced}\n\n{table}\n")
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
