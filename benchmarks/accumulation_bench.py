"""Gradient-accumulation benchmark: memory and time of one CLIP train step against K.

    python benchmarks/accumulation_bench.py [--batch 512] [--steps 1 2 4 8] [--runs 3]
    python benchmarks/accumulation_bench.py --batch 2048 --runs 0 \
        --out experiments/results/accumulation_memory.md     # compile only: memory

One CLIP step (ViT on 32x32 RGB images, 4 blocks of width 128, 64 patches; a text Transformer
of 2 blocks over 16 tokens; dropout 0.1; the tiled loss; AdamW) at a fixed global batch, with
``config.accumulation_steps = K`` for each ``--steps`` value, jitted on one CPU device:

- XLA's temporary memory of the compiled step (``memory_analysis().temp_size_in_bytes``): the
  activations kept for the backward pass, which should fall as ~1/K plus the O(B d) rows;
- the median wall time of ``--runs`` steps after a warm-up, and its ratio to K = 1 (the
  second forward of the gradient cache costs about a third of a step); ``--runs 0`` compiles
  only (memory at batches too slow to time here).

Writes ``experiments/results/accumulation_bench.md``.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "results"


def make_config(batch: int, steps: int):
    from contrastive_jax.training.config import base_config

    config = base_config()
    config.data = {"batch_size": batch}
    config.input_key, config.text_key = "image", "caption"
    config.augment = {"kind": "image", "resized_crop": 0.4, "flip": 0.5, "noise": 0.05}
    vit = {"name": "vit", "image_size": 32, "patch": 4, "in_channels": 3, "width": 128,
           "depth": 4, "heads": 4, "mlp_ratio": 4, "dropout": 0.1, "features": 128}
    text = {"name": "text_transformer", "vocab_size": 1000, "max_tokens": 16, "width": 128,
            "depth": 2, "heads": 4, "mlp_ratio": 4, "dropout": 0.1, "features": 128}
    config.model = {"name": "dual_encoder", "sample_encoder": vit, "text_encoder": text,
                    "embed_dim": 128}
    config.method = "clip"
    config.loss = {"name": "clip", "impl": "tiled"}
    config.optimizer = {"name": "adamw", "learning_rate": 1e-3, "weight_decay": 0.1}
    config.accumulation_steps = steps
    return config


def measure(batch: int, steps: int, runs: int) -> dict:
    import jax
    import numpy as np

    from contrastive_jax.mesh import make_mesh
    from contrastive_jax.training.methods import method_for
    from contrastive_jax.training.step import train_step
    from contrastive_jax.training.step.train_state import create_state

    config = make_config(batch, steps)
    mesh = make_mesh({"data": 1}, jax.devices()[:1])
    method = method_for(config)
    graphdef, state, tx = create_state(config, 100, method)
    step = train_step.compiled_step(config, mesh, graphdef, state, tx, 100, method)
    rng = np.random.default_rng(0)
    data = {"image": rng.uniform(0, 1, (batch, 32, 32, 3)).astype(np.float32),
            "caption": rng.integers(1, 1000, (batch, 16)).astype(np.int32)}
    compiled = step.lower(state, data).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    if runs == 0:
        return {"K": steps, "micro": batch // steps, "temp_mb": temp / 2**20,
                "time_s": float("nan"), "loss": float("nan")}
    state, metrics = compiled(state, data)  # warm-up
    jax.block_until_ready(metrics)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        state, metrics = compiled(state, data)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    return {"K": steps, "micro": batch // steps, "temp_mb": temp / 2**20,
            "time_s": statistics.median(times), "loss": float(metrics["loss"])}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=512,
                        help="global batch (2048: the largest power of two whose K = 1 step "
                             "fits this 24 GiB machine; 4096 would need ~22 GB of temporaries)")
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS / "accumulation_bench.md"))
    args = parser.parse_args(argv)
    rows = []
    for k in args.steps:
        row = measure(args.batch, k, args.runs)
        rows.append(row)
        print(f"K={k}: temp {row['temp_mb']:.1f} MB, step {row['time_s']:.3f} s, "
              f"loss {row['loss']:.6f}", flush=True)
    timed = args.runs > 0
    base = rows[0]
    from contrastive_jax.training.run.provenance import provenance_line

    lines = [
        "# Gradient accumulation: memory and time of one CLIP step",
        "",
        provenance_line(),  # date, commit, versions, devices
        "",
        f"Global batch {args.batch}, one CPU device, f32; ViT 32x32 (4 x 128, 64 patches) and a "
        "text Transformer (2 x 128, 16 tokens), dropout 0.1, tiled loss, AdamW. "
        f"`python benchmarks/accumulation_bench.py --batch {args.batch} --runs {args.runs}`; "
        "method in its docstring. Temporaries: "
        "XLA's `memory_analysis().temp_size_in_bytes` of the compiled step.",
        "",
        "| K | micro-batch | temporaries (MB) | vs K = 1 | step (s) | vs K = 1 | loss |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(f"| {r['K']} | {r['micro']} | {r['temp_mb']:.1f} | "
                     f"{r['temp_mb'] / base['temp_mb']:.2f} | "
                     + (f"{r['time_s']:.3f} | {r['time_s'] / base['time_s']:.2f}x | "
                        f"{r['loss']:.6f} |" if timed else "not run | – | – |"))
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
