"""FLOPs and step time of the pod template at patch dropout 0 / 0.5 / 0.75 and image size
112 / 160 / 224 (FLIP's masking, CLIPA's low resolution; docs/training.md "Cheaper training").

    python benchmarks/cheaper_clip_bench.py [--batch 16] [--steps 5] [--quick]

Two tables, one row per (image size, patch dropout):

* **The template's count.** The whole train step of ``configs/clip_vit_b16_pod.py`` as it is
  (ViT-B/16 and its text tower at full width, bf16) with the variants ``res=N`` and
  ``patch_dropout=P``: model FLOPs per example, the count the plan and the progress line use
  (:func:`contrastive_jax.training.step.model_flops.step_flops`: XLA's count of the step's
  HLO, nothing compiled), on a batch of 8 on one device (the B x B logits are a negligible part
  at any batch), and its ratio to the full-size unmasked step.
* **Measured on this CPU.** The same step at a quarter of the width (image tower 192 wide, 3
  heads; text tower 128 wide, 2 heads; both 12 blocks, scanned, remat, the template's loss),
  float32 (this CPU emulates bf16 matmuls), on one device: compile seconds, the median of
  ``--steps`` step times after one warm-up at ``--batch``, XLA's count of that step and the
  rate it runs at.

Writes ``experiments/results/cheaper_clip_bench.md`` with the provenance line; ``--quick``
(image size 112 and 224 at p = 0 and 0.5, 2 steps) prints the tables and writes nothing.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
SIZES = (224, 160, 112)
RATES = (0.0, 0.5, 0.75)
REDUCED = {"sample_encoder": {"width": 192, "heads": 3, "features": 192},
           "text_encoder": {"width": 128, "heads": 2, "features": 128}}


def pod_template(size: int, rate: float, batch: int, reduced: bool):
    """``configs/clip_vit_b16_pod.py:tokenizer=x,res=SIZE,patch_dropout=RATE`` at ``batch``
    (``reduced``: a quarter of the width, float32)."""
    sys.path.insert(0, str(ROOT / "configs"))
    import clip_vit_b16_pod

    config = clip_vit_b16_pod.get_config(f"tokenizer=x,res={size},patch_dropout={rate}")
    config.data.batch_size = batch
    if reduced:
        for tower, settings in REDUCED.items():
            config.model[tower].update(settings)
        config.model.dtype = "float32"
    return config


def flops_per_example(config, mesh) -> float:
    """The step's model FLOPs (XLA's count) per example of its batch."""
    import jax

    from contrastive_jax.plan import example_shapes
    from contrastive_jax.training.step.model_flops import step_flops

    rows = config.data.batch_size
    shapes = {k: jax.ShapeDtypeStruct((rows, *shape), dtype)
              for k, (shape, dtype) in example_shapes(config).items()}
    return step_flops(config, mesh, shapes, config.total_steps) / rows


def image_tokens(config) -> int:
    """The image tokens a training example's blocks see: the kept patches (and no class
    token: the template's ViT has none unless configured)."""
    from contrastive_jax.training.models.dropout import kept_patches

    vit = config.model.sample_encoder
    patches = (vit.image_size // vit.patch) ** 2
    return kept_patches(patches, float(vit.get("patch_dropout", 0.0))) + \
        int(bool(vit.get("class_token", False)))


def timed_step(config, mesh, steps: int) -> dict:
    """Compile seconds and the median step time of ``config`` on ``mesh`` (random batch)."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from contrastive_jax.mesh import DATA_AXIS
    from contrastive_jax.plan import example_shapes
    from contrastive_jax.training.methods import method_for
    from contrastive_jax.training.step.state_sharding import state_shardings
    from contrastive_jax.training.step.train_state import create_state
    from contrastive_jax.training.step.train_step import compiled_step

    method = method_for(config)
    graphdef, state, tx = create_state(config, config.total_steps, method)
    state = jax.device_put(state, state_shardings(config.sharding, mesh, state))
    rng = np.random.default_rng(0)
    batch = {}
    for key, (shape, dtype) in example_shapes(config).items():
        high = 255 if dtype == "uint8" else config.model.text_encoder.vocab_size
        batch[key] = jax.device_put(
            rng.integers(1, high, (config.data.batch_size, *shape)).astype(dtype),
            NamedSharding(mesh, P(DATA_AXIS)))
    step = compiled_step(config, mesh, graphdef, state, tx, config.total_steps, method)
    start = time.perf_counter()
    compiled = step.lower(state, batch).compile()
    compile_s = time.perf_counter() - start
    state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        state, metrics = compiled(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    loss = float(np.asarray(metrics["loss"]))
    if not np.isfinite(loss):
        raise RuntimeError(f"the step's loss is {loss}")
    return {"compile_s": compile_s, "step_s": statistics.median(times)}


def tables(grid, batch: int, steps: int) -> tuple[str, str]:
    import jax

    from contrastive_jax.mesh import make_mesh

    mesh = make_mesh({"data": 1}, devices=jax.devices()[:1])
    full, cpu = [], []
    for size, rate in grid:
        config = pod_template(size, rate, 8, reduced=False)
        full.append({"size": size, "rate": rate, "tokens": image_tokens(config),
                     "gflop": flops_per_example(config, mesh) / 1e9})
        small = pod_template(size, rate, batch, reduced=True)
        cpu.append({"size": size, "rate": rate, "gflop": flops_per_example(small, mesh) / 1e9,
                    **timed_step(small, mesh, steps)})
        print(f"image {size}, patch_dropout {rate}: {full[-1]} {cpu[-1]}", flush=True)
    base_full = next(r for r in full if r["size"] == max(SIZES) and r["rate"] == 0.0)
    base_cpu = next(r for r in cpu if r["size"] == max(SIZES) and r["rate"] == 0.0)
    head = ("| image size | patch_dropout | image tokens a block sees | GFLOP per example "
            "(train step) | vs 224, p = 0 |\n| --- | --- | --- | --- | --- |")
    first = [head] + [f"| {r['size']} | {r['rate']:g} | {r['tokens']} | {r['gflop']:.1f} "
                      f"| {r['gflop'] / base_full['gflop']:.3f}x |" for r in full]
    head = (f"| image size | patch_dropout | GFLOP per example | compile s | step s (batch "
            f"{batch}) | vs 224, p = 0 | GFLOP/s |\n| --- | --- | --- | --- | --- | --- | --- |")
    second = [head] + [
        f"| {r['size']} | {r['rate']:g} | {r['gflop']:.2f} | {r['compile_s']:.1f} "
        f"| {r['step_s']:.3f} | {r['step_s'] / base_cpu['step_s']:.3f}x "
        f"| {r['gflop'] * batch / r['step_s']:.0f} |" for r in cpu]
    return "\n".join(first), "\n".join(second)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        grid, steps = [(s, p) for s in (224, 112) for p in (0.0, 0.5)], 2
    else:
        grid, steps = [(s, p) for s in SIZES for p in RATES], args.steps
    first, second = tables(grid, args.batch, steps)
    text = (f"## The template's count (ViT-B/16, full width)\n\n{first}\n\n"
            f"## Measured on this CPU (a quarter of the width, float32, one device)\n\n"
            f"{second}\n")
    print(text)
    if args.quick:
        return 0
    from contrastive_jax.training.run.provenance import provenance_line

    command = "python benchmarks/cheaper_clip_bench.py " + " ".join(sys.argv[1:])
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "cheaper_clip_bench.md").write_text(
        "# Patch dropout and image size: FLOPs and step time\n\n"
        f"{provenance_line()}\n\n`{command.strip()}`\n\n"
        "The pod template's train step (configs/clip_vit_b16_pod.py) at each image size "
        "(`res=N`) and patch dropout (`patch_dropout=P`); FLOPs are XLA's count of the step "
        "as the model computes it (`model_flops.step_flops`, what the plan and the progress "
        "line use). See benchmarks/cheaper_clip_bench.py for the settings.\n\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
