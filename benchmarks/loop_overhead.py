"""The training loop's cost over the bare compiled step, and where the difference goes.

    python benchmarks/loop_overhead.py [--steps 200] [--pod_steps 40] [--only main|pod]

Two runs: the main job (configs/simclr_mnist1d.py, one CPU device) and the pod template's tiny
run (configs/clip_vit_b16_pod.py:tiny on mock coco_captions, 8 fake CPU devices, FSDP, remat,
bf16, ring loss). For each, every figure in milliseconds per step:

* **bare step**: the compiled train step fed from batches already on the devices (a few taken
  from the training stream beforehand, cycled), ``--steps`` steps, timed to the last result;
* **input**: the training stream alone, ``next(stream)`` on the host (it overlaps the step in a
  run: grain's threads and JAX's asynchronous dispatch);
* **trainer**: ``train_and_evaluate`` with a log line half way and one at the end, checkpoints
  at the end only (and the first step: orbax's first save), no evaluation: the last line's
  ``s/step``, over the second half of the steps (the first half holds the first, compiling
  step's aftermath: the first checkpoint, the first log line);
* **+ a log line every step** (``log_every = 1``): the median ``s/step`` of the second half's
  lines: the logging sync point each step;
* **guard off** (``max_skipped_in_a_row = 0``): without the one-step-delayed read of the
  skip counter.

``trainer - bare`` is what the loop adds; the last two rows say how much of it is logging and
the guard. Each figure is one run on a quiet machine (say so when reading it). Writes
``experiments/results/loop_overhead.md`` with the provenance line.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import itertools
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"


def load(spec: str):
    """``configs/NAME.py[:variant]`` as ``--config`` loads it."""
    path, _, variant = spec.partition(":")
    module_spec = importlib.util.spec_from_file_location("cfg", ROOT / "configs" / path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(variant or None)


def case_config(case: str, steps: int, data_dir: str | None, tokenizer: str | None):
    """The run of ``case`` ("main" | "pod"): ``steps`` steps, one log line, no evaluation,
    a checkpoint only at the end."""
    if case == "main":
        config = load("simclr_mnist1d.py")
    else:
        config = load(f"clip_vit_b16_pod.py:tiny,tokenizer={tokenizer}")
        config.data.data_dir = data_dir
    config.total_steps = steps
    config.log_every = steps // 2
    config.checkpoint_every = 10 * steps
    config.evaluation.enabled = False
    return config


def bare_ms(config, workdir: str, steps: int) -> tuple[float, float]:
    """``(bare step ms, input ms per batch)``: the compiled step on device-resident batches,
    and the stream alone."""
    import jax

    from contrastive_jax.training import train

    run, state = train.prepare_run(config, workdir)
    step = run.step_fn(state)
    batches = [next(run.stream) for _ in range(4)]
    state, metrics = step(state, batches[0])
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for batch in itertools.islice(itertools.cycle(batches), steps):
        state, metrics = step(state, batch)
    jax.block_until_ready((state, metrics))
    bare = 1000 * (time.perf_counter() - start) / steps
    start = time.perf_counter()
    for _ in range(steps):
        jax.block_until_ready(next(run.stream))
    return bare, 1000 * (time.perf_counter() - start) / steps


def trainer_ms(config, workdir: str) -> float:
    """ms per step of a whole run over its second half: the last log line's ``s/step``, or
    the median of the second half's lines (a line every step)."""
    from contrastive_jax.training import train
    from contrastive_jax.training.run.progress import read_metrics_lines

    with contextlib.redirect_stdout(sys.stderr):
        train.train_and_evaluate(config, workdir)
    records = [json.loads(line) for line in read_metrics_lines(workdir)]
    lines = [r["step_s"] for r in records
             if r["prefix"] == "train" and r["step"] > config.total_steps // 2]
    return 1000 * statistics.median(lines)


def measure(case: str, steps: int, data_dir: str | None, tokenizer: str | None) -> dict:
    """Every figure of one case (in this process)."""
    with tempfile.TemporaryDirectory() as tmp:
        config = case_config(case, steps, data_dir, tokenizer)
        bare, stream = bare_ms(config, f"{tmp}/bare", steps)
        out = {"case": case, "steps": steps, "bare": bare, "input": stream,
               "trainer": trainer_ms(config, f"{tmp}/trainer")}
        logged = case_config(case, steps, data_dir, tokenizer)
        logged.log_every = 1
        out["log_every_1"] = trainer_ms(logged, f"{tmp}/logged")
        unguarded = case_config(case, steps, data_dir, tokenizer)
        unguarded.max_skipped_in_a_row = 0
        out["guard_off"] = trainer_ms(unguarded, f"{tmp}/unguarded")
    return out


def run_case(case: str, steps: int, data_dir: str | None, tokenizer: str | None) -> dict:
    """:func:`measure` in a fresh process with the case's devices (1, or 8 fake ones)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    env.pop("XLA_FLAGS", None)
    if case == "pod":
        env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    command = [sys.executable, __file__, "--worker",
               json.dumps([case, steps, data_dir, tokenizer])]
    out = subprocess.run(command, env=env, capture_output=True, text=True, cwd=ROOT)
    rows = [line for line in out.stdout.splitlines() if line.startswith("ROW ")]
    if out.returncode != 0 or not rows:
        raise RuntimeError(f"{case}: {out.stderr[-2000:]}")
    return json.loads(rows[-1][4:])


def mock_pod_data(folder: str) -> tuple[str, str]:
    """Mock coco_captions and a SentencePiece model of its captions, as the tests build
    them."""
    from contrastive_jax.training.data import build_tokenizer
    from contrastive_jax.training.data.prepare import main as prepare

    data_dir, model = f"{folder}/tfds", f"{folder}/coco.model"
    with contextlib.redirect_stdout(sys.stderr):
        assert prepare(["--mock", "coco_captions", f"--data_dir={data_dir}"]) == 0
        assert build_tokenizer.main(["--dataset=coco_captions", f"--data_dir={data_dir}",
                                     "--split=train+restval", "--vocab_size=64",
                                     f"--output={model}"]) == 0
    return data_dir, model


def table(rows: list[dict]) -> str:
    names = {"main": "main job (SimCLR, MNIST-1D, 1 CPU device)",
             "pod": "pod template :tiny (8 fake CPU devices)"}
    out = ["| run | steps | bare step | input (alone) | trainer | trainer - bare "
           "| log line every step | guard off |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        out.append(f"| {names[r['case']]} | {r['steps']} | {r['bare']:.2f} | {r['input']:.2f} "
                   f"| {r['trainer']:.2f} | {r['trainer'] - r['bare']:+.2f} "
                   f"| {r['log_every_1']:.2f} | {r['guard_off']:.2f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--pod_steps", type=int, default=40)
    parser.add_argument("--only", choices=("main", "pod"))
    parser.add_argument("--out", default=str(RESULTS / "loop_overhead.md"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        case, steps, data_dir, tokenizer = json.loads(args.worker)
        print("ROW " + json.dumps(measure(case, steps, data_dir, tokenizer)), flush=True)
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data_dir, tokenizer = (None, None) if args.only == "main" else mock_pod_data(tmp)
        for case, steps in (("main", args.steps), ("pod", args.pod_steps)):
            if args.only in (None, case):
                rows.append(run_case(case, steps, data_dir, tokenizer))
                print(f"{case}: {rows[-1]}", flush=True)
    from contrastive_jax.training.run.provenance import provenance_line

    text = table(rows)
    command = "python benchmarks/loop_overhead.py " + " ".join(argv or sys.argv[1:])
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(
        "# The training loop's cost over the bare compiled step (ms per step)\n\n"
        f"{provenance_line()}\n\n`{command.strip()}`\n\n" + text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
