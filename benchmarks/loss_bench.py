"""Loss benchmark: the textbook dense loss vs the library's impls (autodiff, dense_vjp, tiled).

    python benchmarks/loss_bench.py [--sizes 1024 4096 16384] [--large] [--runs 5]
    python benchmarks/loss_bench.py --sweep-block 256 512 1024 2048 --sizes 16384

Every configuration runs in its own fresh subprocess, one after another (never two at once), so
that each measures its own memory and none competes with another for the cores. A worker starts
JAX, builds two float32 (rows, d) inputs, compiles ``value_and_grad`` of the loss (w.r.t. both
embeddings and the temperature) ahead of time, resets the kernel's resident-memory high-water
mark (``/proc/self/clear_refs``), runs it once (warm-up) and times ``--runs`` forward+backward
passes; a second fresh process, with glibc's mmap threshold fixed so that freed buffers leave
the resident set (``MEMORY_ENV``), measures memory the same way. Memory columns: *run peak* =
high-water mark of the runs above the resident memory with the inputs in place and the program
compiled (outputs, XLA scratch and allocator slack: what the
loss costs to run); *lifetime peak* = the process's lifetime high-water mark (``ru_maxrss``)
above the memory right after JAX's start-up: inputs, compilation and the runs, where the
compiler's freed heap is returned to the OS (glibc ``malloc_trim``) before the runs start;
*XLA scratch* = the compiled program's ``memory_analysis().temp_size_in_bytes``. Last the
worker times an (N, d) @ (d, N) float32 matmul in the same process, the reference for the
useful fraction (for N > 16384 an (N, d) @ (d, 16384) one, whose output still fits in memory).

The baseline a reader has in mind is the *textbook* dense loss, written here in the benchmark
(not the library) as anyone would write it in JAX: normalise, ``s x y^T`` with
``s = min(exp(t), 100)``, and ``optax.softmax_cross_entropy_with_integer_labels`` on the logits
and their transpose (CLIP; for NT-Xent the 2N views with the self-similarity set to ``-inf``;
for SigLIP ``-mean log_sigmoid(z * logits)``), differentiated by autodiff. Every time is also
given relative to it (``time vs textbook``).

Columns: median time of a forward+backward pass; peak extra memory; useful GFLOP/s =
``6 N^2 d / time`` (the three N x N x d matmuls of the dense hand-written pass); and that figure
as a fraction of the matmul's own GFLOP/s (``2 N^2 d / t_matmul``). A tiled pass recomputes the
logits, four matmuls against three, so 0.75 is its ceiling; the tiled NT-Xent visits only the tiles
on and above the diagonal of its symmetric similarity, so it can exceed that. ``N`` is the number of
rows of the similarity matrix: N pairs for CLIP and SigLIP, N/2 pairs (N views) for NT-Xent. SigLIP
has no dense_vjp impl (its tiled backward is the hand-written one).

Writes the table to ``experiments/results/loss_bench.md`` (and the raw rows to ``.json``),
headed by the provenance line (date, commit, versions, devices:
``contrastive_jax.training.run.provenance``) and the command; ``--append`` adds the run as one
more section, with its own header (before and after a change).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import pathlib
import subprocess
import sys
import time

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "results"
IMPLS = ("textbook", "autodiff", "dense_vjp", "tiled")


def textbook_loss(loss: str):
    """The dense loss as a textbook writes it (the baseline; not the library's code)."""
    import jax
    import jax.numpy as jnp
    import optax

    def normalized(v):
        return v / jnp.linalg.norm(v, axis=1, keepdims=True)

    def clip(x, y, t):
        logits = jnp.minimum(jnp.exp(t), 100.0) * normalized(x) @ normalized(y).T
        labels = jnp.arange(x.shape[0])
        return 0.5 * (optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
                      + optax.softmax_cross_entropy_with_integer_labels(logits.T, labels).mean())

    def nt_xent(z1, z2, temperature):
        z = normalized(jnp.concatenate([z1, z2]))
        n = z.shape[0]
        logits = jnp.where(jnp.eye(n, dtype=bool), -jnp.inf, z @ z.T / temperature)
        labels = (jnp.arange(n) + n // 2) % n
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    def siglip(x, y, t):
        logits = jnp.minimum(jnp.exp(t), 100.0) * normalized(x) @ normalized(y).T - 10.0
        signs = 2.0 * jnp.eye(x.shape[0]) - 1.0
        return -jnp.sum(jax.nn.log_sigmoid(signs * logits)) / x.shape[0]

    return {"clip": clip, "nt_xent": nt_xent, "siglip": siglip}[loss]


def _status_mb(key: str) -> float:
    text = pathlib.Path("/proc/self/status").read_text()
    return int(text.split(key + ":")[1].split()[0]) / 1024.0


def _trim_heap() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to hand back
        pass


def worker(args: argparse.Namespace) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from contrastive_jax.losses import clip_loss, nt_xent, siglip_loss

    # JAX's one-time start-up: the CPU client, its thread pools, a first compilation and the
    # matmul library's per-thread buffers.
    jax.block_until_ready(jax.jit(lambda a: jnp.exp(a @ a.T).sum())(jnp.ones((512, 512))))
    started = _status_mb("VmRSS")
    n, d = args.n, args.d
    rows = n // 2 if args.loss == "nt_xent" else n
    # Inputs from NumPy: exactly two (rows, d) float32 buffers, without the temporaries of
    # jax.random's generator that would otherwise stay in the process's heap.
    rng = np.random.default_rng(0)
    x = jax.device_put(rng.standard_normal((rows, d), dtype=np.float32))
    y = jax.device_put(rng.standard_normal((rows, d), dtype=np.float32))
    kwargs = {"impl": args.impl}
    if args.impl == "tiled":
        kwargs["block_size"] = args.block
    if args.impl == "textbook":
        third = jnp.float32(0.1) if args.loss == "nt_xent" else jnp.log(
            jnp.float32(1 / 0.07) if args.loss == "clip" else jnp.float32(10.0))
        fn = textbook_loss(args.loss)
    elif args.loss == "clip":
        third = jnp.log(jnp.float32(1 / 0.07))
        fn = lambda a, b, t: clip_loss(a, b, t, **kwargs)  # noqa: E731
    elif args.loss == "siglip":  # the bias is a constant here: the same passes either way
        third = jnp.log(jnp.float32(10.0))
        fn = lambda a, b, t: siglip_loss(a, b, t, -10.0, **kwargs)  # noqa: E731
    else:
        third = jnp.float32(0.1)
        fn = lambda a, b, t: nt_xent(a, b, t, **kwargs)  # noqa: E731
    step = jax.jit(jax.value_and_grad(fn, argnums=(0, 1, 2))).lower(x, y, third).compile()
    analysis = step.memory_analysis()
    scratch_mb = analysis.temp_size_in_bytes / 2**20 if analysis is not None else float("nan")
    # The compiler frees its working memory, but glibc keeps freed heap pages resident: hand
    # them back (they are no part of running the loss). The compiler's own peak is already in
    # the lifetime high-water mark read here.
    _trim_heap()
    compile_peak = _status_mb("VmHWM") - started
    # Peak resident memory of running the loss: reset the high-water mark (Linux >= 4.0) with
    # the inputs in place and the program compiled, before the first run allocates anything.
    pathlib.Path("/proc/self/clear_refs").write_text("5")
    before = _status_mb("VmRSS")
    value = float(jax.block_until_ready(step(x, y, third))[0])  # warm-up; the loss's value
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        jax.block_until_ready(step(x, y, third))
        times.append(time.perf_counter() - start)
    run_mb = _status_mb("VmHWM") - before
    total_mb = max(compile_peak, _status_mb("VmHWM") - started)
    del step
    if args.measure == "memory":
        return {"run_mb": run_mb, "with_inputs_mb": total_mb, "scratch_mb": scratch_mb}
    matmul = jax.jit(lambda a, b: a @ b.T)
    cols = min(n, 16384)  # an N x 65536 float32 product would not fit in memory
    a = jax.device_put(rng.standard_normal((n, d), dtype=np.float32))
    b = jax.device_put(rng.standard_normal((cols, d), dtype=np.float32))
    jax.block_until_ready(matmul(a, b))
    mm_times = []
    for _ in range(3):
        start = time.perf_counter()
        jax.block_until_ready(matmul(a, b))
        mm_times.append(time.perf_counter() - start)
    t = float(np.median(times))
    t_mm = float(np.median(mm_times))
    useful = 6 * n * n * d / t / 1e9
    mm_gflops = 2 * n * cols * d / t_mm / 1e9
    return {
        "loss": args.loss, "impl": args.impl, "n": n, "d": d,
        "block": args.block if args.impl == "tiled" else None,
        "value": value, "time_s": t, "run_mb": run_mb, "with_inputs_mb": total_mb,
        "scratch_mb": scratch_mb,
        "useful_gflops": useful, "matmul_gflops": mm_gflops, "fraction": useful / mm_gflops,
    }


# glibc raises its mmap threshold after large frees, so that later large buffers come from the
# heap and stay resident after they are freed: the high-water mark then follows the allocator's
# cache, not the live memory (+-100 MB from run to run here). A fixed threshold keeps every
# large buffer mmapped and unmapped on free.
MEMORY_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}


def _run(cmd: list[str], env: dict, timeout: float, what: dict) -> dict:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {**what, "error": f"timeout {timeout:.0f}s"}
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["?"])[-1][:120]
        return {**what, "error": f"exit {out.returncode}: {last}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_worker(loss: str, impl: str, n: int, d: int, block: int, runs: int, timeout: float):
    """Times from one fresh process (default allocator), memory from another (fixed threshold).

    The fixed threshold costs time (every large buffer is a fresh mapping, page-faulted in), so
    the two are measured apart.
    """
    cmd = [sys.executable, __file__, "--worker", "--loss", loss, "--impl", impl, "--n", str(n),
           "--d", str(d), "--block", str(block)]
    what = {"loss": loss, "impl": impl, "n": n, "d": d, "block": block}
    timing = _run([*cmd, "--runs", str(runs), "--measure", "time"], dict(os.environ), timeout,
                  what)
    if "error" in timing:
        return timing
    memory = _run([*cmd, "--runs", "1", "--measure", "memory"], {**os.environ, **MEMORY_ENV},
                  timeout, what)
    if "error" in memory:
        return memory
    return {**timing, **memory}


def markdown(rows: list[dict]) -> str:
    lines = ["| loss | impl | N | block | fwd+bwd (s) | time vs textbook | run peak (MB) "
             "| lifetime peak (MB) | XLA scratch (MB) | useful GFLOP/s | matmul GFLOP/s "
             "| fraction of matmul |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    base = {(r["loss"], r["n"]): r["time_s"] for r in rows
            if r.get("impl") == "textbook" and "error" not in r}
    for r in rows:
        block = r.get("block") or "-"
        if "error" in r:
            lines.append(f"| {r['loss']} | {r['impl']} | {r['n']} | {block} | {r['error']} "
                         "| | | | | | | |")
            continue
        ratio = r["time_s"] / base[(r["loss"], r["n"])] if (r["loss"], r["n"]) in base else None
        lines.append(
            f"| {r['loss']} | {r['impl']} | {r['n']} | {block} | {r['time_s']:.3f} "
            f"| {'-' if ratio is None else f'{ratio:.2f}x'} | {r['run_mb']:.0f} "
            f"| {r['with_inputs_mb']:.0f} | {r['scratch_mb']:.0f} | {r['useful_gflops']:.1f} "
            f"| {r['matmul_gflops']:.1f} | {r['fraction']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--loss", choices=("clip", "nt_xent", "siglip"), default="clip")
    parser.add_argument("--impl", choices=IMPLS, default="tiled")
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--d", type=int, default=512)
    parser.add_argument("--block", type=int, default=None, help="tiled block size")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--measure", choices=("time", "memory"), default="time",
                        help=argparse.SUPPRESS)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--losses", nargs="+", default=["clip", "nt_xent", "siglip"])
    parser.add_argument("--impls", nargs="+", default=list(IMPLS))
    parser.add_argument("--large", action="store_true", help="also tiled at N = 65536")
    parser.add_argument("--sweep-block", type=int, nargs="+", default=None,
                        help="only the tiled impl, once per block size")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per worker")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS / "loss_bench.md")
    parser.add_argument("--append", action="store_true",
                        help="add this run's table to --out (e.g. before and after a change)")
    args = parser.parse_args(argv)
    if args.block is None:
        from contrastive_jax.losses import DEFAULT_BLOCK_SIZE

        args.block = DEFAULT_BLOCK_SIZE
    if args.worker:
        print(json.dumps(worker(args)))
        return 0

    plan = []
    for loss in args.losses:
        for n in args.sizes:
            if args.sweep_block:
                plan += [(loss, "tiled", n, b, args.runs) for b in args.sweep_block]
            else:
                plan += [(loss, impl, n, args.block, args.runs) for impl in args.impls
                         if not (loss == "siglip" and impl == "dense_vjp")]
        if args.large and not args.sweep_block:
            plan.append((loss, "tiled", 65536, args.block, 1))
    rows = []
    for i, (loss, impl, n, block, runs) in enumerate(plan):
        start = time.time()
        row = run_worker(loss, impl, n, args.d, block, runs, args.timeout)
        rows.append(row)
        summary = row.get("error") or (f"{row['time_s']:.3f} s, run peak {row['run_mb']:.0f} MB, "
                                       f"fraction {row['fraction']:.2f}")
        print(f"[{i + 1}/{len(plan)}] {loss:8s} {impl:9s} N={n:6d} block={block:5d}: {summary}"
              f"  ({time.time() - start:.0f} s wall)", flush=True)
    table = markdown(rows)
    print("\n" + table)
    for row in rows:  # every impl computes the textbook's loss (float32 rounding apart)
        want = next((r["value"] for r in rows if r.get("impl") == "textbook" and "value" in r
                     and (r["loss"], r["n"]) == (row["loss"], row["n"])), None)
        if want is not None and "value" in row and abs(row["value"] - want) > 1e-4 * abs(want):
            print(f"WARNING: {row['loss']} {row['impl']} N={row['n']}: loss {row['value']} "
                  f"differs from the textbook's {want}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    from contrastive_jax.training.run.provenance import provenance_line

    produced = (f"`python benchmarks/loss_bench.py {' '.join(argv or sys.argv[1:])}`: "
                f"float32, d = {args.d}, median of the timed runs after one warm-up; see "
                "`benchmarks/loss_bench.py` for the method.")
    section = f"{provenance_line()}\n\n{produced}\n\n{table}\n"  # each run's own header
    raw = args.out.with_suffix(".json")
    if args.append and args.out.exists():  # one more measured section (e.g. after a change)
        args.out.write_text(args.out.read_text().rstrip("\n") + "\n\n" + section)
        rows = json.loads(raw.read_text()) + rows if raw.exists() else rows
    else:
        args.out.write_text(f"# Loss benchmark\n\n{section}")
    raw.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
