"""Compile time and program size of the train step, scanned vs unrolled Transformer blocks.

    python benchmarks/compile_bench.py [--depths 2 12 24 48] [--timeout 600] [--quick]

The step is the pod template's ``:tiny`` run (configs/clip_vit_b16_pod.py: a ViT and a text
tower of width 16, bf16 compute, remat, FSDP, the ring loss) on 8 fake CPU devices, with both
towers at each depth, ``model.<tower>.scan`` True or False. Each configuration runs in a fresh
subprocess (JAX's default XLA flags, no persistent compilation cache): it builds the state,
lowers and compiles the step (compile seconds: ``lower`` + ``compile``, wall clock), counts the
lines of the optimised HLO (``compiled.as_text()``), then runs the step on a random batch of 16
(median of 5 after one warm-up). A configuration still compiling after ``--timeout`` seconds is
stopped and its row says so. Writes ``experiments/results/compile_bench.md`` with the
provenance line; ``--quick`` runs depths 1 and 2 only and prints the table (the test's mode).

Floors (issue 40): the scanned step's compile time at depth 48 is at most 1.3x its time at
depth 2, and its HLO does not grow with depth.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"


def pod_template(variant: str):
    """``configs/clip_vit_b16_pod.py:<variant>`` as ``--config`` loads it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("pod", ROOT / "configs" / "clip_vit_b16_pod.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(variant)


def measure(depth: int, scan: bool) -> dict:
    """One configuration, in this process (8 fake CPU devices)."""
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from contrastive_jax.mesh import DATA_AXIS, make_mesh
    from contrastive_jax.plan import example_shapes
    from contrastive_jax.training.methods import method_for
    from contrastive_jax.training.step.state_sharding import state_shardings
    from contrastive_jax.training.step.train_state import create_state
    from contrastive_jax.training.step.train_step import compiled_step

    config = pod_template("tiny,tokenizer=x")
    for tower in (config.model.sample_encoder, config.model.text_encoder):
        tower.update({"depth": depth, "scan": scan})
    mesh = make_mesh({"data": 8})
    method = method_for(config)
    graphdef, state, tx = create_state(config, 10, method)
    state = jax.device_put(state, state_shardings(config.sharding, mesh, state))
    rng = np.random.default_rng(0)
    rows = config.data.batch_size
    batch = {}
    for key, (shape, dtype) in example_shapes(config).items():
        high = 255 if dtype == "uint8" else config.model.text_encoder.vocab_size
        batch[key] = jax.device_put(rng.integers(1, high, (rows, *shape)).astype(dtype),
                                    NamedSharding(mesh, P(DATA_AXIS)))
    step = compiled_step(config, mesh, graphdef, state, tx, 10, method)
    start = time.perf_counter()
    compiled = step.lower(state, batch).compile()
    compile_s = time.perf_counter() - start
    lines = len(compiled.as_text().splitlines())
    state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        state, metrics = compiled(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    return {"depth": depth, "scan": scan, "compile_s": compile_s, "hlo_lines": lines,
            "step_ms": 1000 * statistics.median(times),
            "loss": float(np.asarray(metrics["loss"]))}


def run_one(depth: int, scan: bool, timeout: float) -> dict:
    """:func:`measure` in a fresh subprocess (no compilation cache, JAX's default flags)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("XLA_FLAGS", "CONTRASTIVE_JAX_COMPILATION_CACHE")}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    command = [sys.executable, __file__, "--worker", json.dumps([depth, scan])]
    try:
        out = subprocess.run(command, env=env, capture_output=True, text=True,
                             timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"depth": depth, "scan": scan, "status": f"still compiling after {timeout:.0f} s"}
    rows = [line for line in out.stdout.splitlines() if line.startswith("ROW ")]
    if out.returncode != 0 or not rows:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        return {"depth": depth, "scan": scan, "status": f"error: {last[:160]}"}
    return {**json.loads(rows[-1][4:]), "status": "ok"}


def table(rows: list[dict]) -> str:
    """The markdown table, with each row's compile time relative to its layout at the
    smallest depth."""
    first = {}
    for r in rows:
        if r["status"] == "ok":
            first.setdefault(r["scan"], r)
    out = ["| blocks | depth (each tower) | compile s | vs smallest depth | optimised HLO lines "
           "| step ms (batch 16, 8 CPU devices) | status |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        layout = "scanned" if r["scan"] else "unrolled"
        if r["status"] != "ok":
            out.append(f"| {layout} | {r['depth']} | | | | | {r['status']} |")
            continue
        ratio = r["compile_s"] / first[r["scan"]]["compile_s"]
        out.append(f"| {layout} | {r['depth']} | {r['compile_s']:.1f} | {ratio:.2f}x "
                   f"| {r['hlo_lines']:,} | {r['step_ms']:.1f} | ok |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[2, 12, 24, 48])
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        depth, scan = json.loads(args.worker)
        print("ROW " + json.dumps(measure(depth, scan)), flush=True)
        return 0
    depths = [1, 2] if args.quick else args.depths
    rows = []
    for scan in (True, False):
        for depth in depths:
            rows.append(run_one(depth, scan, args.timeout))
            print(f"{'scanned' if scan else 'unrolled'} depth {depth}: {rows[-1]}", flush=True)
    text = table(rows)
    if args.quick:
        print(text)
        return 0
    from contrastive_jax.training.run.provenance import provenance_line

    command = "python benchmarks/compile_bench.py " + " ".join(sys.argv[1:])
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "compile_bench.md").write_text(
        "# Compile time of the train step: scanned vs unrolled blocks\n\n"
        f"{provenance_line()}\n\n`{command.strip()}`\n\n"
        "The pod template's `:tiny` step (ViT and text tower of width 16, bf16, remat, FSDP, "
        "ring loss) on 8 fake CPU devices, both towers at each depth; each row a fresh "
        "process with JAX's default XLA flags and no compilation cache.\n\n" + text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
