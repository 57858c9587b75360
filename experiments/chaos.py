"""Chaos test of the main job: kill it with SIGKILL at random points, restart, compare.

    python experiments/chaos.py [--config configs/simclr_mnist1d.py] [--steps 200]
        [--kills 5] [--checkpoint-every 20] [--seed 0] [--quick]

Runs the job once without interruption (``--steps`` steps, evaluation off), then again in a
fresh workdir, killing the process with SIGKILL (no chance to save) at a random step after
each (re)start and restarting the same command until it finishes. Reports the runs, kills,
resumes, the steps lost per kill (the step it was killed at minus the checkpoint it resumed
from) and whether the final parameters hash (``params_sha256`` in results.json: parameters and
BatchNorm statistics) equals the uninterrupted run's. Writes ``experiments/results/chaos.md``
(no ``.csv`` or plot: one row). Exits 1 if the hashes differ.
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
    path = workdir / "metrics.jsonl"
    if not path.exists():
        return 0
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return max((r["step"] for r in lines if r.get("prefix") == "train"), default=0)


def run_with_kills(cmd, workdir: pathlib.Path, steps: int, kills: int, rng: random.Random,
                   env) -> dict:
    """Start ``cmd`` repeatedly, SIGKILL it at a random logged step ``kills`` times."""
    stats = {"runs": 0, "kills": 0, "resumes": 0, "lost": []}
    while True:
        start = logged_step(workdir)
        stats["runs"] += 1
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/simclr_mnist1d.py")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny model, 60 steps, 2 kills")
    parser.add_argument("--out", default=str(RESULTS / "chaos.md"))
    args = parser.parse_args(argv)
    config = args.config + (":quick" if args.quick else "")
    steps, kills, every = (60, 2, 4) if args.quick else (args.steps, args.kills,
                                                         args.checkpoint_every)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        whole = subprocess.run(command(config, tmp / "whole", steps, every), env=env,
                               cwd=ROOT, capture_output=True, text=True, timeout=1800)
        if whole.returncode != 0:
            raise RuntimeError(whole.stderr[-3000:])
        stats = run_with_kills(command(config, tmp / "chaos", steps, every), tmp / "chaos",
                               steps, kills, rng, env)
        digests = [json.loads((tmp / d / "results.json").read_text())["params_sha256"]
                   for d in ("whole", "chaos")]
    same = digests[0] == digests[1]
    lost = stats["lost"]
    table = markdown_table(
        ["runs", "kills", "resumes", "steps lost per kill", "mean lost", "final hash equal",
         "uninterrupted hash", "chaos hash"],
        [[stats["runs"], stats["kills"], stats["resumes"], lost,
          f"{sum(lost) / max(len(lost), 1):.1f}", "yes" if same else "NO",
          f"{digests[0][:16]}...", f"{digests[1][:16]}..."]])
    produced = (f"{reporting.command(__file__, argv)}: `{config}`, {steps} steps, checkpoint every "
                f"{every}, {kills} kills by SIGKILL at random steps, seed {args.seed}.")
    text = (f"# Chaos: {config}, {steps} steps, checkpoint every {every}, SIGKILL\n\n"
            f"{produced}\n\n{table}\n")
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
