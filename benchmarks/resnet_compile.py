"""Does a scan over a ResNet's repeated blocks pay? Compile time and temporaries of one
ResNet training gradient, unrolled (the model as shipped) against a scanned prototype.

    python benchmarks/resnet_compile.py [--depths=50,152] [--compilers=tpu,cpu] [--batch=64]

The gradient of ``sum(f(x)^2)`` for a torchvision-layout ResNet (``encoders/resnet.py``,
bf16 compute, BatchNorm in training mode) on a ``(batch, 224, 224, 3)`` batch, compiled for
one device: a v5e chip by libtpu's TPU compiler run on this CPU (``tpu``), or XLA:CPU
(``cpu``). Three layouts:

- ``unrolled``: :class:`~contrastive_jax.training.models.encoders.resnet.ResNet` itself, one
  Python-level call per block;
- ``scanned``: the same blocks, each stage's first block on its own (it strides and widens)
  and the stage's other blocks stacked and run by one ``lax.scan`` (the BatchNorm statistics
  carried out as the scan's outputs), as ``scanned_layers`` does for Transformer blocks;
- ``scanned+remat``: that scan with each step rematerialised (``jax.checkpoint``).

Prints a table and writes experiments/results/resnet_compile.{md,json}. Compile times are
wall seconds on this machine's cores (shared with whatever else runs: say so when quoting).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import SingleDeviceSharding

from contrastive_jax.training.models.encoders.resnet import DEPTHS, ResNet
from contrastive_jax.training.models.scanned_layers import stacked

RESULTS = pathlib.Path(__file__).resolve().parent.parent / "experiments" / "results"
LAYOUTS = ("unrolled", "scanned", "scanned+remat")


class ScannedResNet(nnx.Module):
    """A ResNet's stem and blocks with each stage's repeated blocks as one ``lax.scan``."""

    def __init__(self, base: ResNet, remat: bool):
        self.stem, self.stem_norm, self.remat = base.stem, base.stem_norm, remat
        blocks, firsts, stacks, start = list(base.blocks), [], [], 0
        for count in DEPTHS[base.depth][1]:
            firsts.append(blocks[start])
            stacks.append(stacked(blocks[start + 1:start + count]))
            start += count
        self.firsts, self.stacks = nnx.List(firsts), nnx.List(stacks)

    def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
        x = nnx.relu(self.stem_norm(self.stem(x), use_running_average=not train))
        x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
        for first, stack in zip(self.firsts, self.stacks, strict=True):
            x = first(x, train=train)
            graphdef, state = nnx.split(stack)

            def step(h, row, graphdef=graphdef):
                block = nnx.merge(graphdef, row)
                return block(h, train=train), nnx.state(block)

            if self.remat:
                step = jax.checkpoint(step, prevent_cse=False)
            x, new = jax.lax.scan(step, x, state)
            nnx.update(stack, new)
        return jnp.mean(x, axis=(1, 2))


def device_for(compiler: str):
    if compiler == "cpu":
        return jax.devices("cpu")[0]
    from contrastive_jax.accelerators import tpu_slice
    from contrastive_jax.plan.tpu_compiler import require, topology_devices

    require()
    return topology_devices(tpu_slice("v5e-4"))[0]


def measure(depth: int, layout: str, compiler: str, batch: int) -> dict:
    def build():
        base = ResNet(depth=depth, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
        return base if layout == "unrolled" else ScannedResNet(base, layout.endswith("remat"))

    graphdef, state = nnx.split(nnx.eval_shape(build))
    sharding = SingleDeviceSharding(device_for(compiler))
    state = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding),
                         state)
    images = jax.ShapeDtypeStruct((batch, 224, 224, 3), jnp.float32, sharding=sharding)

    def loss(state, x):
        return jnp.sum(nnx.merge(graphdef, state)(x, train=True).astype(jnp.float32) ** 2)

    start = time.perf_counter()
    lowered = jax.jit(jax.grad(loss)).lower(state, images)
    traced = time.perf_counter()
    compiled = lowered.compile()
    done = time.perf_counter()
    memory = compiled.memory_analysis()
    return {"depth": depth, "layout": layout, "compiler": compiler, "batch": batch,
            "trace_lower_s": round(traced - start, 1), "compile_s": round(done - traced, 1),
            "temp_gib": round(memory.temp_size_in_bytes / 2**30, 2)}


def table(rows: list[dict]) -> str:
    lines = ["| ResNet | layout | compiler | batch | trace + lower s | compile s | "
             "temporaries GiB |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['depth']} | {r['layout']} | "
                     f"{'TPU (v5e chip)' if r['compiler'] == 'tpu' else 'XLA:CPU'} | "
                     f"{r['batch']} | {r['trace_lower_s']} | {r['compile_s']} | "
                     f"{r['temp_gib']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", default="50,152")
    parser.add_argument("--compilers", default="tpu,cpu")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--output", default=str(RESULTS / "resnet_compile"))
    args = parser.parse_args()
    rows = []
    for compiler in args.compilers.split(","):
        for depth in (int(d) for d in args.depths.split(",")):
            for layout in LAYOUTS:
                rows.append(measure(depth, layout, compiler, args.batch))
                print(table(rows[-1:]).splitlines()[-1], flush=True)
    text = table(rows)
    print(text)
    out = pathlib.Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(
        {"rows": rows, "jax": jax.__version__}, indent=1) + "\n")
    out.with_suffix(".md").write_text(
        "# ResNet training gradient: unrolled blocks against a scan per stage\n\n"
        "`python benchmarks/resnet_compile.py` (bf16 compute, BatchNorm in training mode, one "
        f"device; jax {jax.__version__}; wall seconds on 2 CPU cores shared with other "
        "work).\n\n" + text + "\n")


if __name__ == "__main__":
    main()
