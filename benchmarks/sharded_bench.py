"""Sharded-loss benchmark: gather, gather without gradient, and ring on D fake CPU devices.

    python benchmarks/sharded_bench.py [--devices 8] [--sizes 4096 16384] [--d 512] [--runs 3]

For each loss (CLIP both directions, NT-Xent with N pairs = 2N views, SigLIP) and strategy it
compiles ``value_and_grad`` of :func:`contrastive_jax.losses.sharded.sharded_clip_loss` /
``sharded_nt_xent`` / ``sharded_siglip_loss`` (w.r.t. both embeddings and the temperature)
under ``jit`` on a ``data`` mesh of ``--devices`` CPU devices, and reports:

- time: median forward+backward of ``--runs`` runs after a warm-up. All fake devices share this
  machine's cores, so this is the time of the whole D-device step, not of one device.
- per-device memory from the compiled SPMD program (``memory_analysis``): XLA scratch, and
  scratch + arguments + outputs (the device's shards of x, y and their gradients); the ring's
  bound (:func:`traffic.ring_memory_bound`): a few copies of the
  device's ``(N/D) d`` rows plus a few (b, b) tiles.
- bytes each device receives per step: from the formula (below), and counted from the compiled
  HLO: every all-gather, reduce-scatter and collective-permute, times the trip counts of the
  loops it sits in (XLA's ``known_trip_count``), at ``(D - 1) / D`` of the gathered or
  reduced array for the first two.

The formula and the HLO count are :mod:`traffic` (``benchmarks/traffic.py``). A second table
compiles the ring at fixed rows per device (``--flat-rows``) on ``--flat-devices`` devices: its
per-device scratch should not grow with D.

Writes ``experiments/results/sharded_bench.md``.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "results"
STRATEGIES = ("all_gather", "all_gather_no_grad", "ring")


def loss_fn(loss: str, strategy: str, mesh, block: int):
    """``f(x, y, scale_param)`` for ``value_and_grad``, and the scale parameter's value (CLIP
    and SigLIP: the log-scale; NT-Xent: the temperature)."""
    import jax.numpy as jnp

    from contrastive_jax.losses.sharded import (
        sharded_clip_loss,
        sharded_nt_xent,
        sharded_siglip_loss,
    )

    if loss == "clip":
        return (lambda a, b, t: sharded_clip_loss(a, b, t, mesh=mesh, strategy=strategy,
                                                  block_size=block)), jnp.log(jnp.float32(1 / 0.07))
    if loss == "siglip":
        return (lambda a, b, t: sharded_siglip_loss(a, b, t, -10.0, mesh=mesh, strategy=strategy,
                                                    block_size=block)), jnp.log(jnp.float32(10.0))
    return (lambda a, b, t: sharded_nt_xent(a, b, t, mesh=mesh, strategy=strategy,
                                            block_size=block)), jnp.float32(0.1)


def flat_memory(loss: str, rows_per_device: int, d: int, block: int, devices: int) -> dict:
    """Compile only: the ring's per-device scratch with ``rows_per_device`` rows on each of
    ``devices`` devices (constant in D when the ring holds a fixed number of chunks)."""
    import jax
    import jax.numpy as jnp

    from contrastive_jax.mesh import make_mesh
    from traffic import ring_memory_bound

    mesh = make_mesh({"data": devices}, jax.devices()[:devices])
    fn, scale_param = loss_fn(loss, "ring", mesh, block)
    spec = jax.ShapeDtypeStruct((rows_per_device * devices, d), jnp.float32)
    compiled = jax.jit(jax.value_and_grad(fn, argnums=(0, 1, 2))).lower(spec, spec,
                                                                      scale_param).compile()
    return {"loss": loss, "D": devices, "rows": rows_per_device,
            "scratch_mb": compiled.memory_analysis().temp_size_in_bytes / 2**20,
            "bound_mb": ring_memory_bound(loss, rows_per_device * devices, devices, d,
                                          block) / 2**20}


def run(loss: str, strategy: str, n_total: int, d: int, devices: int, block: int, runs: int):
    import jax
    import jax.numpy as jnp
    import numpy as np

    from contrastive_jax.mesh import make_mesh
    from traffic import collective_bytes, expected_bytes, ring_memory_bound

    mesh = make_mesh({"data": devices}, jax.devices()[:devices])
    rows = n_total // 2 if loss == "nt_xent" else n_total  # NT-Xent: N = 2 x pairs rows in S
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((rows, d), dtype=np.float32))
    y = jnp.asarray(rng.standard_normal((rows, d), dtype=np.float32))
    fn, scale_param = loss_fn(loss, strategy, mesh, block)
    compiled = jax.jit(jax.value_and_grad(fn, argnums=(0, 1, 2))).lower(x, y, scale_param).compile()
    mem = compiled.memory_analysis()
    hlo = compiled.as_text()
    jax.block_until_ready(compiled(x, y, scale_param))
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(compiled(x, y, scale_param))
        times.append(time.perf_counter() - start)
    return {
        "loss": loss, "strategy": strategy, "N": n_total, "time_s": float(np.median(times)),
        "scratch_mb": mem.temp_size_in_bytes / 2**20,
        "device_mb": (mem.temp_size_in_bytes + mem.argument_size_in_bytes
                      + mem.output_size_in_bytes) / 2**20,
        "bound_mb": ring_memory_bound(loss, rows, devices, d, block) / 2**20,
        "formula_mb": expected_bytes(loss, strategy, rows, devices, d) / 2**20,
        "hlo_mb": collective_bytes(hlo, devices) / 2**20,
    }


def markdown(rows: list[dict], devices: int, d: int) -> str:
    lines = [f"D = {devices} fake CPU devices, d = {d}, f32. N = rows of the similarity matrix "
             "(CLIP: N pairs; NT-Xent: N/2 pairs, N views). Time: whole D-device step on this "
             "machine's 2 cores. Memory per device from the compiled program; ring bound: "
             "`traffic.ring_memory_bound`. Communication: MB received per device "
             "per step.", "",
             "| loss | strategy | N | fwd+bwd (s) | scratch / device (MB) | incl. shards and "
             "grads (MB) | ring bound (MB) | comm, formula (MB) | comm, from HLO (MB) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        bound = f"{r['bound_mb']:.1f}" if r["strategy"] == "ring" else "-"
        lines.append(f"| {r['loss']} | {r['strategy']} | {r['N']} | {r['time_s']:.2f} "
                     f"| {r['scratch_mb']:.1f} | {r['device_mb']:.1f} | {bound} "
                     f"| {r['formula_mb']:.2f} | {r['hlo_mb']:.2f} |")
    return "\n".join(lines)


def flat_markdown(rows: list[dict], d: int) -> str:
    lines = [f"## Ring memory at fixed rows per device\n\nd = {d}, f32, compiled program only: "
             "XLA scratch per device for `value_and_grad` with the same rows on every device "
             "(NT-Xent: pairs) as the number of devices grows.", "",
             "| loss | rows / device | " + " | ".join(f"D = {r['D']}" for r in rows
                                                   if r["loss"] == rows[0]["loss"])
             + " | bound (MB) |",
             "| --- | --- | " + " | ".join("---" for r in rows if r["loss"] == rows[0]["loss"])
             + " | --- |"]
    for loss in dict.fromkeys(r["loss"] for r in rows):
        mine = [r for r in rows if r["loss"] == loss]
        lines.append(f"| {loss} | {mine[0]['rows']} | "
                     + " | ".join(f"{r['scratch_mb']:.1f} MB" for r in mine)
                     + f" | {max(r['bound_mb'] for r in mine):.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--d", type=int, default=512)
    parser.add_argument("--block", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--losses", nargs="+", default=["clip", "nt_xent", "siglip"])
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES))
    parser.add_argument("--flat-devices", type=int, nargs="+", default=[2, 4, 8, 16],
                        help="ring scratch at fixed rows per device on these device counts")
    parser.add_argument("--flat-rows", type=int, default=2048, help="rows per device")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS / "sharded_bench.md")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_num_cpu_devices", max([args.devices, *args.flat_devices]))
    rows = []
    for loss in args.losses:
        for n in args.sizes:
            for strategy in args.strategies:
                if loss == "siglip" and strategy == "all_gather_no_grad":
                    continue
                start = time.time()
                row = run(loss, strategy, n, args.d, args.devices, args.block, args.runs)
                rows.append(row)
                print(f"{loss:8s} {strategy:18s} N={n:6d}: {row['time_s']:.2f} s, scratch "
                      f"{row['scratch_mb']:.1f} MB/device, comm {row['hlo_mb']:.1f} MB (HLO) / "
                      f"{row['formula_mb']:.1f} MB (formula)  ({time.time() - start:.0f} s wall)",
                      flush=True)
    table = markdown(rows, args.devices, args.d)
    flat = [flat_memory(loss, args.flat_rows, args.d, args.block, devices)
            for loss in args.losses for devices in args.flat_devices]
    table += "\n\n" + flat_markdown(flat, args.d)
    print("\n" + table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    from contrastive_jax.training.run.provenance import provenance_line

    args.out.write_text(f"# Sharded-loss benchmark\n\n{provenance_line()}\n\n{table}\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
