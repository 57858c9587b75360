"""Accelerator check: correctness, loss speed and memory, and a ViT-B/16 CLIP step on one chip.

    PYTHONPATH=. python3 benchmarks/accelerator_check.py --out DIR [--budget_s 330] [--smoke]

One command for a borrowed GPU (or TPU) chip, sized to finish in about 6 minutes on one
H100/H200; it needs jax, flax, optax, numpy and this package, nothing else (no TensorFlow, TFDS,
grain, ml_collections or orbax: the train step is written here, not imported from
``contrastive_jax.training.step``). It writes ``DIR/accelerator_check.md`` (one markdown file:
provenance, the command, three tables) and ``DIR/accelerator_check.json`` (the raw rows), and
rewrites both after every measurement, so that a run cut short still leaves its table.

(a) **Correctness.** Every loss (``clip_loss``, ``siglip_loss``, ``nt_xent``, ``moco_infonce``)
with each impl it has, at N = 4096, d = 512 (MoCo: a 16384-key queue), in float32 on the default
device, against the same loss in float64 on the CPU (``impl="autodiff"``, the dense reference):
relative errors ``|v - v64| / |v64|`` of the value and ``max|g - g64| / max|g64|`` of the
gradients w.r.t. the embeddings and w.r.t. the log-scale / temperature / bias; once at JAX's
default matmul precision (what a user gets: TF32 may be allowed for float32 on a GPU) and once
under ``jax.default_matmul_precision("highest")``.

(b) **Speed and memory** of the tiled CLIP and SigLIP losses against the textbook dense loss
(``benchmarks/loss_bench.py``'s ``textbook_loss``), ``value_and_grad`` w.r.t. both embeddings,
float32, d = 512, N = 16384 / 65536 / 262144: the median time of a few runs after a warm-up and
the device's ``peak_bytes_in_use`` (which JAX cannot reset, so every configuration runs in a
fresh process of this script, ``--worker SPEC``). An XLA resource-exhausted error is ``OOM``.

(c) **A ViT-B/16 CLIP train step** (the pod template's model, ``configs/clip_vit_b16_pod.py``:
bf16 compute, float32 parameters, AdamW, the tiled CLIP loss), at the largest batch of
``--batches`` that fits (descending on OOM, each attempt in a fresh process): step time,
examples/s, peak memory, compile seconds (lowering + compilation), MFU; for scanned against
unrolled blocks, attention ``"cudnn"`` against ``"xla"`` (``"cudnn"`` first on a GPU) and, last,
without rematerialisation. Model FLOPs per step are XLA's cost analysis of the *lowered* (not
compiled) step at the same batch with unrolled blocks (XLA counts a loop body once), no remat
(recomputation is no model FLOP), XLA attention (cuDNN's kernel is a custom call with no FLOP
count) and the dense CLIP loss (the tiled loss is a loop too): forward, backward, loss and AdamW.
MFU = those FLOPs / (step time x the chip's dense bf16 peak,
:func:`contrastive_jax.accelerators.device_peak_flops`; ``n/a`` on a CPU).

Every measurement is wrapped: a failure is a row (``OOM``, ``error: <one line>``) and the check
goes on. ``--budget_s`` (default 330) bounds the whole run: part (a) may use up to 15% of it,
(a)+(b) 50%, (a)+(b)+(c) all of it (time a part leaves is the next part's); a worker still
running at its part's deadline is stopped (``timeout (budget)``) and the configurations left are
``skipped (budget)`` rows. ``--smoke``: the same code paths at tiny sizes (N = 64, a tiny ViT
and text tower, two batch sizes; (a) at the default precision only, (c) without the no-remat
row) on whatever device JAX has, well under a minute on a CPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

SCRIPT = pathlib.Path(__file__).resolve()
ROOT = SCRIPT.parents[1]
MARK = "ROW "  # a worker's result line: MARK + one JSON object
NOTE = "NOTE "  # a worker's progress line, echoed by the parent
# fractions of --budget_s by which parts (a), (a)+(b) and (a)+(b)+(c) must be done
PART_DEADLINES = {"a": 0.15, "b": 0.5, "c": 1.0}
# the most seconds one worker of each part may run (a hung compilation must not eat its part)
WORKER_CAP_S = {"a": None, "b": 90.0, "c": 150.0}

VIT_B16 = {"name": "vit", "image_size": 224, "patch": 16, "in_channels": 3, "width": 768,
           "depth": 12, "heads": 12, "mlp_ratio": 4, "features": 768}
TEXT_B = {"name": "text_transformer", "vocab_size": 32000, "max_tokens": 32, "width": 512,
          "depth": 12, "heads": 8, "mlp_ratio": 4, "features": 512}
VIT_TINY = {"name": "vit", "image_size": 32, "patch": 8, "in_channels": 3, "width": 32,
            "depth": 2, "heads": 2, "mlp_ratio": 4, "features": 32}
TEXT_TINY = {"name": "text_transformer", "vocab_size": 64, "max_tokens": 8, "width": 32,
             "depth": 2, "heads": 2, "mlp_ratio": 4, "features": 32}

FULL = {"a_n": 4096, "a_d": 512, "a_queue": 16384, "b_sizes": [16384, 65536, 262144],
        "b_d": 512, "b_runs": 5, "batches": [4096, 2048, 1024, 512, 256], "steps": 5,
        "block_size": None, "towers": [VIT_B16, TEXT_B], "embed_dim": 512, "no_remat": True,
        "precisions": ["default", "highest"]}
SMOKE = {"a_n": 64, "a_d": 16, "a_queue": 128, "b_sizes": [64], "b_d": 16, "b_runs": 2,
         "batches": [16, 8], "steps": 2, "block_size": 16, "towers": [VIT_TINY, TEXT_TINY],
         "embed_dim": 16, "no_remat": False, "precisions": ["default"]}

# (a): each loss's impls (moco_infonce has one: reverse mode through its dense form)
A_IMPLS = {"clip": ("autodiff", "dense_vjp", "tiled"), "siglip": ("autodiff", "tiled"),
           "nt_xent": ("autodiff", "dense_vjp", "tiled"), "moco": ("autodiff",)}
B_LOSSES = ("clip", "siglip")
B_IMPLS = ("tiled", "textbook")


# ----------------------------------------------------------------------------------------
# worker side: every measurement runs in a fresh process of this script


def emit(row: dict) -> None:
    """Hand one result row to the parent (one JSON line on stdout)."""
    print(MARK + json.dumps(row), flush=True)


def note(message: str) -> None:
    """A progress line the parent prints as it comes."""
    print(NOTE + message, flush=True)


def one_line(text: str, limit: int = 160) -> str:
    """The first non-empty line of ``text``, shortened, safe inside a markdown table cell."""
    line = next((s.strip() for s in text.splitlines() if s.strip()), "?")
    line = line.replace("|", "/")
    return line if len(line) <= limit else line[:limit - 3] + "..."


OOM_WORDS = ("resource_exhausted", "out of memory", "out_of_memory", "alloc_failed",
             "failed to allocate")


def is_oom(text: str) -> bool:
    """Whether an error message is XLA's, the allocator's, CUDA's or cuDNN's out-of-memory."""
    lowered = text.lower()
    return any(word in lowered for word in OOM_WORDS)


def failure(err: BaseException) -> str:
    """The status of a measurement that raised: ``OOM`` or ``error: <one line>``."""
    text = f"{type(err).__name__}: {err}"
    return "OOM" if is_oom(text) else "error: " + one_line(text)


def memory_stats() -> dict:
    """The default device's allocator statistics (empty where JAX has none: the CPU)."""
    import jax

    try:
        return jax.devices()[0].memory_stats() or {}
    except Exception:  # a backend without the call
        return {}


def enable_x64():
    """``jax.enable_x64(True)``, or the older experimental spelling."""
    import jax

    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64 as experimental  # older JAX

    return experimental()


def device_record() -> dict:
    """Provenance (date, commit, versions, devices) and the default device's platform."""
    import jax

    from contrastive_jax.training.run.provenance import provenance

    device = jax.devices()[0]
    stats = memory_stats()
    return {"part": "provenance", **provenance(), "platform": device.platform,
            "default_device_kind": device.device_kind, "bytes_limit": stats.get("bytes_limit"),
            "memory_fraction_env": {k: os.environ[k] for k in os.environ
                                    if k.startswith("XLA_PYTHON_CLIENT")}}


def correctness_inputs(loss: str, n: int, d: int, queue: int, seed: int):
    """``(fn(impl) -> loss function, float64 arguments, argnums, embedding argnums)``."""
    import numpy as np

    from contrastive_jax.losses import clip_loss, moco_infonce, nt_xent, siglip_loss

    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((n, d)), rng.standard_normal((n, d))
    if loss == "clip":
        return (lambda kw: lambda x, y, t: clip_loss(x, y, t, **kw),
                [a, b, np.float64(math.log(1 / 0.07))], (0, 1, 2), (0, 1))
    if loss == "siglip":
        return (lambda kw: lambda x, y, t, bias: siglip_loss(x, y, t, bias, **kw),
                [a, b, np.float64(math.log(10.0)), np.float64(-10.0)], (0, 1, 2, 3), (0, 1))
    if loss == "nt_xent":
        return (lambda kw: lambda x, y, tau: nt_xent(x, y, tau, **kw),
                [a, b, np.float64(0.1)], (0, 1, 2), (0, 1))
    keys = rng.standard_normal((queue, d))
    return (lambda kw: lambda q, k, keys_, tau: moco_infonce(q, k, keys_, tau),
            [a, b, keys, np.float64(0.07)], (0, 3), (0,))


def rel_errors(value, grads, ref_value, ref_grads, argnums, embeddings) -> dict:
    """Relative errors of a float32 result against the float64 reference."""
    import numpy as np

    def rel(got, want):
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        scale = float(np.max(np.abs(want)))
        return float(np.max(np.abs(got - want))) / scale if scale > 0 else float("nan")

    emb = [rel(g, w) for i, g, w in zip(argnums, grads, ref_grads, strict=True)
           if i in embeddings]
    scalars = [rel(g, w) for i, g, w in zip(argnums, grads, ref_grads, strict=True)
               if i not in embeddings]
    return {"value": float(value), "value_64": float(ref_value),
            "value_rel": rel(value, ref_value), "emb_grad_rel": max(emb),
            "scalar_grad_rel": max(scalars),
            "scalar_grads": [float(g) for i, g in zip(argnums, grads, strict=True)
                             if i not in embeddings]}


def float64_reference(make, args, argnums) -> tuple[Any, list]:
    """``(value, gradients)`` of the dense (autodiff) loss in float64 on the CPU, as NumPy."""
    import jax
    import numpy as np

    cpu = jax.devices("cpu")[0]
    with enable_x64():
        fn = jax.jit(jax.value_and_grad(make, argnums=argnums))
        value, grads = fn(*[jax.device_put(a, cpu) for a in args])
        return np.asarray(value), [np.asarray(g) for g in grads]


def float32_case(make, args, argnums, precision: str) -> tuple[Any, list]:
    """``(value, gradients)`` of the loss in float32 on the default device, at JAX's default
    matmul precision or under ``jax.default_matmul_precision(precision)``, as NumPy."""
    import contextlib

    import jax
    import numpy as np

    device = jax.devices()[0]
    scope = (contextlib.nullcontext() if precision == "default"
             else jax.default_matmul_precision(precision))
    with scope:
        fn = jax.jit(jax.value_and_grad(make, argnums=argnums))
        out = fn(*[jax.device_put(np.asarray(a, np.float32), device) for a in args])
        return jax.device_get(out)


def part_a(spec: dict) -> None:
    """(a): every loss x impl x matmul precision against the float64 CPU reference."""
    emit(device_record())
    for seed, (loss, impls) in enumerate(A_IMPLS.items()):
        make, args, argnums, embeddings = correctness_inputs(
            loss, spec["n"], spec["d"], spec["queue"], seed)
        base = {"part": "a", "loss": loss, "n": spec["n"], "d": spec["d"]}
        start = time.time()
        try:
            ref_value, ref_grads = float64_reference(
                make({} if loss == "moco" else {"impl": "autodiff"}), args, argnums)
        except Exception as err:
            for impl in impls:
                for precision in spec["precisions"]:
                    emit({**base, "impl": impl, "precision": precision,
                          "status": "reference " + failure(err)})
            continue
        note(f"(a) {loss}: float64 CPU reference in {time.time() - start:.1f} s")
        for impl in impls:
            kwargs = {} if loss == "moco" else {"impl": impl}
            if impl == "tiled" and spec["block_size"]:
                kwargs["block_size"] = spec["block_size"]
            for precision in spec["precisions"]:
                row = {**base, "impl": impl, "precision": precision}
                if time.time() > spec["deadline"]:
                    emit({**row, "status": "skipped (budget)"})
                    continue
                try:
                    value, grads = float32_case(make(kwargs), args, argnums, precision)
                    errors = rel_errors(value, grads, ref_value, ref_grads, argnums, embeddings)
                    finite = all(math.isfinite(errors[k]) for k in
                                 ("value_rel", "emb_grad_rel", "scalar_grad_rel"))
                    emit({**row, **errors, "status": "ok" if finite else "non-finite"})
                except Exception as err:
                    emit({**row, "status": failure(err)})


def timed_runs(fn: Callable[[], Any], runs: int,
               seconds: float) -> tuple[list[float], float, Any]:
    """One warm-up call of ``fn``, then up to ``runs`` timed calls (fewer if each warm-up-long
    call would take the total past ``seconds``, at least one): ``(times, warm-up time, the
    last call's output)``."""
    import jax

    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    warm = time.perf_counter() - start
    times = []
    for _ in range(max(1, min(runs, int(seconds / max(warm, 1e-9))))):
        start = time.perf_counter()
        out = jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return times, warm, out


def part_b(spec: dict) -> None:
    """(b): one loss x impl x N, forward + backward: time and peak device memory."""
    sys.path.insert(0, str(SCRIPT.parent))
    import jax
    import jax.numpy as jnp
    from loss_bench import textbook_loss

    from contrastive_jax.losses import clip_loss, siglip_loss

    n, d, loss, impl = spec["n"], spec["d"], spec["loss"], spec["impl"]
    row = {"part": "b", "loss": loss, "impl": impl, "n": n, "d": d,
           "block": spec["block_size"] if impl == "tiled" else None}
    try:
        kx, ky = jax.random.split(jax.random.key(0))
        x = jax.random.normal(kx, (n, d), jnp.float32)
        y = jax.random.normal(ky, (n, d), jnp.float32)
        t = jnp.log(jnp.float32(1 / 0.07 if loss == "clip" else 10.0))
        if impl == "textbook":
            fn = textbook_loss(loss)
        elif loss == "clip":
            fn = lambda a, b, s: clip_loss(a, b, s, block_size=spec["block_size"])  # noqa: E731
        else:
            fn = lambda a, b, s: siglip_loss(a, b, s, -10.0,  # noqa: E731
                                             block_size=spec["block_size"])
        inputs = memory_stats().get("bytes_in_use")
        start = time.perf_counter()
        step = jax.jit(jax.value_and_grad(fn, argnums=(0, 1))).lower(x, y, t).compile()
        row["compile_s"] = time.perf_counter() - start
        note(f"(b) {loss} {impl} N={n}: compiled in {row['compile_s']:.1f} s")
        times, warm, (value, _) = timed_runs(lambda: step(x, y, t), spec["runs"],
                                             spec["run_seconds"])
        row["value"] = float(value)
        median = statistics.median(times)
        peak = memory_stats().get("peak_bytes_in_use")
        row.update({"time_s": median, "runs": len(times), "warmup_s": warm,
                    "peak_bytes": peak, "input_bytes": inputs,
                    "useful_tflops": 6 * n * n * d / median / 1e12,
                    "status": "ok" if math.isfinite(row["value"]) else "non-finite"})
    except Exception as err:
        row["status"] = failure(err)
    emit(row)


def model_block(spec: dict, *, scan: bool, remat: bool, attention: str) -> dict:
    """The ``dual_encoder`` model block of the pod template (or the smoke run's tiny one)."""
    vit, text = spec["towers"]
    return {"name": "dual_encoder", "sample_encoder": {**vit, "scan": scan},
            "text_encoder": {**text, "scan": scan}, "embed_dim": spec["embed_dim"],
            "init_temperature": 0.07, "dtype": "bfloat16", "remat": remat,
            "attention": attention}


def make_train_step(graphdef, rest, tx, loss_kwargs: dict):
    """``step(params, opt_state, images, tokens) -> (params, opt_state, loss)``: one CLIP
    step, uint8 images normalised on the device, the clipped logit scale of the model."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from contrastive_jax.losses import clip_loss

    def step(params, opt_state, images, tokens):
        def loss_fn(p):
            model = nnx.merge(graphdef, p, rest)
            pixels = (images.astype(jnp.float32) / 255.0 - 0.5) / 0.25
            x = model.embed_samples(pixels, train=True)
            y = model.embed_texts(tokens, train=True)
            return clip_loss(x, y, model.log_scale[...], **loss_kwargs)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def optimizer():
    """The pod template's AdamW (without its schedule and clipping)."""
    import optax

    return optax.adamw(1e-4, b1=0.9, b2=0.98, eps=1e-6, weight_decay=0.2)


def batch_shapes(spec: dict, batch: int):
    """``(images, tokens)`` as ``jax.ShapeDtypeStruct``: uint8 pixels, int32 ids."""
    import jax
    import jax.numpy as jnp

    vit, text = spec["towers"]
    size = vit["image_size"]
    return (jax.ShapeDtypeStruct((batch, size, size, vit["in_channels"]), jnp.uint8),
            jax.ShapeDtypeStruct((batch, text["max_tokens"]), jnp.int32))


def model_flops(spec: dict, batch: int) -> float | None:
    """XLA's FLOPs of the lowered step (unrolled, no remat, XLA attention, dense loss) at
    ``batch``, from abstract shapes: nothing is allocated."""
    import jax
    from flax import nnx

    from contrastive_jax.training.models import build_model

    block = model_block(spec, scan=False, remat=False, attention="xla")
    abstract = nnx.eval_shape(lambda: build_model(block, nnx.Rngs(0)))
    graphdef, params, rest = nnx.split(abstract, nnx.Param, ...)
    tx = optimizer()
    opt_state = jax.eval_shape(tx.init, params)
    step = make_train_step(graphdef, rest, tx, {"impl": "autodiff"})
    cost = jax.jit(step).lower(params, opt_state, *batch_shapes(spec, batch)).cost_analysis()
    if isinstance(cost, list | tuple):  # older JAX: one dict per program
        cost = cost[0] if cost else {}
    flops = (cost or {}).get("flops")
    return float(flops) if flops else None


def train_inputs(spec: dict):
    """``(model parameters' count, step function, params, opt_state, images, tokens)`` of one
    part (c) configuration, built on the default device (random uint8 images, int32 ids)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from contrastive_jax.training.models import build_model

    block = model_block(spec, scan=spec["scan"], remat=spec["remat"],
                        attention=spec["attention"])
    graphdef, params, rest = nnx.split(build_model(block, nnx.Rngs(0)), nnx.Param, ...)
    count = int(sum(np.prod(v.shape) for v in jax.tree.leaves(params)))
    tx = optimizer()
    image_shape, token_shape = batch_shapes(spec, spec["batch"])
    ki, kt = jax.random.split(jax.random.key(1))
    images = jax.random.randint(ki, image_shape.shape, 0, 256, jnp.int32).astype(jnp.uint8)
    tokens = jax.random.randint(kt, token_shape.shape, 1, spec["towers"][1]["vocab_size"],
                                jnp.int32)
    loss_kwargs = {"block_size": spec["block_size"]} if spec["block_size"] else {}
    step = make_train_step(graphdef, rest, tx, loss_kwargs)
    return count, step, params, tx.init(params), images, tokens


def part_c(spec: dict) -> None:
    """(c): one ViT-B/16 CLIP train step configuration at one batch size."""
    import jax

    from contrastive_jax.accelerators import device_peak_flops

    batch = spec["batch"]
    row = {"part": "c", "scan": spec["scan"], "attention": spec["attention"],
           "remat": spec["remat"], "batch": batch, "label": spec["label"]}
    try:
        row["params"], step, params, opt_state, images, tokens = train_inputs(spec)
        start = time.perf_counter()
        compiled = jax.jit(step, donate_argnums=(0, 1)).lower(
            params, opt_state, images, tokens).compile()
        row["compile_s"] = time.perf_counter() - start
        note(f"(c) {spec['label']} batch {batch}: compiled in {row['compile_s']:.1f} s")
        state = [params, opt_state]
        del params, opt_state  # donated to the first step

        def one_step():
            state[0], state[1], loss = compiled(state[0], state[1], images, tokens)
            return state[0], state[1], loss

        times, _, out = timed_runs(one_step, spec["steps"], spec["run_seconds"])
        step_s = statistics.median(times)
        row.update({"loss": float(out[2]), "step_s": step_s, "steps": len(times),
                    "examples_per_s": batch / step_s,
                    "peak_bytes": memory_stats().get("peak_bytes_in_use")})
        row["status"] = "ok" if math.isfinite(row["loss"]) else "non-finite"
    except Exception as err:
        row["status"] = failure(err)
        emit(row)
        return
    try:
        flops = spec.get("flops") or model_flops(spec, batch)
        peak = device_peak_flops(jax.devices()[0].device_kind)
        row.update({"flops": flops, "peak_flops": peak,
                    "mfu": flops / (step_s * peak) if flops and peak else None})
    except Exception as err:
        row["flops_status"] = failure(err)
    emit(row)


def worker(spec: dict) -> None:
    """Run the part ``spec`` names, emitting its rows."""
    {"a": part_a, "b": part_b, "c": part_c}[spec["part"]](spec)


# ----------------------------------------------------------------------------------------
# parent side: plans, budget, subprocesses, the table


class Check:
    """The parent's state: settings, start time, rows, where the table goes."""

    def __init__(self, args: argparse.Namespace, argv: list[str]):
        from contrastive_jax.losses import DEFAULT_BLOCK_SIZE

        self.args = args
        self.sizes = dict(SMOKE if args.smoke else FULL)
        self.sizes["block_size"] = self.sizes["block_size"] or DEFAULT_BLOCK_SIZE
        if args.batches:
            self.sizes["batches"] = sorted(args.batches, reverse=True)
        self.start = time.time()
        self.rows: list[dict] = []
        self.record: dict | None = None
        self.command = " ".join(["python3", "benchmarks/accelerator_check.py", *argv])
        self.flops: dict[int, float] = {}  # model FLOPs per step, by batch

    def elapsed(self) -> float:
        """Seconds since the check started."""
        return time.time() - self.start

    def deadline(self, part: str) -> float:
        """The absolute time by which ``part`` must be done."""
        return self.start + PART_DEADLINES[part] * self.args.budget_s

    def say(self, message: str) -> None:
        """A progress line: elapsed seconds and the message."""
        print(f"[{self.elapsed():6.1f} s] {message}", flush=True)

    def add(self, row: dict) -> None:
        """Record a row, print it, and rewrite the table."""
        if row.get("part") == "provenance":
            self.record = row
            self.say(f"device: {row['device_count']} x {row['device_kind']} "
                     f"({row['platform']})")
        else:
            self.rows.append(row)
            self.say(f"({row['part']}) {summary(row)}")
        write_outputs(self)


def summary(row: dict) -> str:
    """One progress line for a row."""
    if row["part"] == "a":
        head = f"{row['loss']} {row['impl']} precision={row['precision']}"
        if row["status"] != "ok":
            return f"{head}: {row['status']}"
        return (f"{head}: value rel {row['value_rel']:.1e}, embedding grads rel "
                f"{row['emb_grad_rel']:.1e}, scalar grads rel {row['scalar_grad_rel']:.1e}")
    if row["part"] == "b":
        head = f"{row['loss']} {row['impl']} N={row['n']}"
        if row["status"] != "ok":
            return f"{head}: {row['status']}"
        return (f"{head}: {row['time_s'] * 1e3:.1f} ms, peak {gib(row.get('peak_bytes'))} GiB, "
                f"compile {row['compile_s']:.1f} s")
    head = f"{row['label']} batch {row['batch']}"
    if row["status"] != "ok":
        return f"{head}: {row['status']}"
    return (f"{head}: {row['step_s'] * 1e3:.0f} ms/step, {row['examples_per_s']:.0f} ex/s, "
            f"MFU {pct(row.get('mfu'))}, compile {row['compile_s']:.1f} s")


def worker_environment() -> dict[str, str]:
    """This process's environment with the repository first on PYTHONPATH."""
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def run_worker(check: Check, spec: dict, deadline: float) -> tuple[list[dict], str | None]:
    """Run one worker until it ends or ``deadline`` passes: ``(its rows, None)`` if it
    exited cleanly, else ``(the rows it gave, the status of what is missing)``."""
    timeout = deadline - time.time()
    if timeout <= 1:
        return [], "skipped (budget)"
    spec = {**spec, "deadline": deadline}
    expired = threading.Event()
    rows = []
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, str(SCRIPT), "--worker", json.dumps(spec)],
                                stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT,
                                env=worker_environment())

        def stop():
            expired.set()
            proc.kill()

        timer = threading.Timer(timeout, stop)
        timer.start()
        try:
            for line in proc.stdout:
                if line.startswith(MARK):
                    row = json.loads(line[len(MARK):])
                    rows.append(row)
                    check.add(row)
                elif line.startswith(NOTE):
                    check.say(line[len(NOTE):].rstrip())
            returncode = proc.wait()
        finally:
            timer.cancel()
        if expired.is_set():
            return rows, f"timeout (stopped after {timeout:.0f} s)"
        if returncode == 0:
            return rows, None
        err.seek(0)
        text = err.read()
    if is_oom(text):
        return rows, "OOM"
    last = (text.strip().splitlines() or ["?"])[-1]
    return rows, f"error: exit {returncode}: {one_line(last)}"


def run_single(check: Check, spec: dict, row: dict, part: str) -> dict:
    """Run a one-row worker (parts b and c) until its part's deadline or its cap
    (:data:`WORKER_CAP_S`); the row it gave, or ``row`` with the status of its failure
    (recorded as well)."""
    deadline = min(check.deadline(part), time.time() + WORKER_CAP_S[part])
    rows, problem = run_worker(check, spec, deadline)
    if rows:
        return rows[-1]
    missing = {**row, "status": problem}
    check.add(missing)
    return missing


def run_part_a(check: Check) -> None:
    """(a), one worker; rows it did not give are filled in with the reason."""
    sizes = check.sizes
    check.say(f"(a) correctness: N={sizes['a_n']}, d={sizes['a_d']}, float32 vs float64 (CPU)")
    spec = {"part": "a", "n": sizes["a_n"], "d": sizes["a_d"], "queue": sizes["a_queue"],
            "block_size": sizes["block_size"], "precisions": sizes["precisions"]}
    rows, problem = run_worker(check, spec, check.deadline("a"))
    if problem:
        done = {(r.get("loss"), r.get("impl"), r.get("precision")) for r in rows}
        for loss, impls in A_IMPLS.items():
            for impl in impls:
                for precision in sizes["precisions"]:
                    if (loss, impl, precision) not in done:
                        check.add({"part": "a", "loss": loss, "impl": impl,
                                   "precision": precision, "status": problem})


def run_part_b(check: Check) -> None:
    """(b), one worker per loss x impl x N, sizes ascending."""
    sizes = check.sizes
    for n in sizes["b_sizes"]:
        for loss in B_LOSSES:
            for impl in B_IMPLS:
                check.say(f"(b) {loss} {impl} N={n} ...")
                row = {"part": "b", "loss": loss, "impl": impl, "n": n, "d": sizes["b_d"],
                       "block": sizes["block_size"] if impl == "tiled" else None}
                hopeless = impl == "textbook" and beyond_memory(check, n)
                if hopeless:
                    check.add({**row, "status": hopeless})
                    continue
                spec = {**row, "part": "b", "block_size": sizes["block_size"],
                        "runs": sizes["b_runs"], "run_seconds": 10.0}
                run_single(check, spec, row, "b")


def beyond_memory(check: Check, n: int) -> str | None:
    """The status of a dense loss whose one N x N float32 logits matrix alone exceeds the
    device's allocator limit (not run: compiling a program with 2^36-element arrays only to
    learn it cannot fit costs the budget), else None."""
    limit = (check.record or {}).get("bytes_limit")
    logits = 4 * n * n
    if not limit or logits <= limit:
        return None
    return (f"OOM (not run: the N x N float32 logits alone are {gib(logits)} GiB > the "
            f"{gib(limit)} GiB limit)")


def search_batch(check: Check, label: str, settings: dict, batches: list[int]) -> int | None:
    """Try ``batches`` (descending) until one fits: that batch, or None. Anything but an OOM
    (an unsupported kernel, a configuration error, the budget) ends the search: a smaller
    batch would not help, and each try costs a compilation."""
    for batch in batches:
        check.say(f"(c) {label} batch {batch} ...")
        row = {"part": "c", **settings, "batch": batch, "label": label}
        spec = {**row, "steps": check.sizes["steps"], "run_seconds": 15.0,
                "towers": check.sizes["towers"], "embed_dim": check.sizes["embed_dim"],
                "block_size": check.sizes["block_size"], "flops": check.flops.get(batch)}
        got = run_single(check, spec, row, "c")
        if got["status"] == "ok":
            if got.get("flops"):
                check.flops[batch] = got["flops"]
            return batch
        if got["status"] != "OOM":
            return None
    return None


def run_part_c(check: Check) -> None:
    """(c): the largest batch for scanned blocks and the best attention, then the other
    attention, unrolled blocks and no remat at that batch (or below, on OOM)."""
    platform = (check.record or {}).get("platform", "cpu")
    best, other = ("cudnn", "xla") if platform == "gpu" else ("xla", "cudnn")
    batches = check.sizes["batches"]
    configs = [(f"scan, {best}, remat", {"scan": True, "attention": best, "remat": True}),
               (f"scan, {other}, remat", {"scan": True, "attention": other, "remat": True}),
               (f"unrolled, {best}, remat", {"scan": False, "attention": best, "remat": True})]
    if check.sizes["no_remat"]:  # the same code path as the first with remat off: full runs only
        configs.append((f"scan, {best}, no remat",
                        {"scan": True, "attention": best, "remat": False}))
    label, settings = configs[0]
    found = search_batch(check, label, settings, batches)
    start = batches if found is None else [b for b in batches if b <= found]
    for label, settings in configs[1:]:
        search_batch(check, label, settings, start)


# ----------------------------------------------------------------------------------------
# the table


def gib(value: float | None) -> str:
    """Bytes as GiB with two decimals, ``n/a`` if unknown."""
    return "n/a" if value is None else f"{value / 2**30:.2f}"


def pct(value: float | None) -> str:
    """A fraction as a percentage, ``n/a`` if unknown."""
    return "n/a" if value is None else f"{100 * value:.1f}%"


def sci(value: float | None) -> str:
    """A small number in scientific notation, ``-`` if absent."""
    return "-" if value is None else f"{value:.1e}"


def table(header: list[str], lines: list[list[str]]) -> str:
    """A markdown table."""
    out = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return "\n".join([*out, *("| " + " | ".join(cells) + " |" for cells in lines)])


def table_a(rows: list[dict]) -> str:
    """Part (a)'s table."""
    lines = []
    for r in rows:
        ok = r["status"] == "ok" or r["status"] == "non-finite"
        lines.append([r["loss"], r["impl"], r["precision"],
                      sci(r.get("value_rel")) if ok else "-",
                      sci(r.get("emb_grad_rel")) if ok else "-",
                      sci(r.get("scalar_grad_rel")) if ok else "-", r["status"]])
    return table(["loss", "impl", "matmul precision", "value rel err", "embedding grad rel err",
                  "scale/temperature/bias grad rel err", "status"], lines)


def table_b(rows: list[dict]) -> str:
    """Part (b)'s table."""
    lines = []
    for r in rows:
        block = str(r["block"]) if r.get("block") else "-"
        if r["status"] != "ok":
            lines.append([r["loss"], r["impl"], str(r["n"]), block, r["status"], *[""] * 6])
            continue
        peak, inputs = r.get("peak_bytes"), r.get("input_bytes")
        lines.append([r["loss"], r["impl"], str(r["n"]), block, "ok",
                      f"{r['time_s'] * 1e3:.2f}", str(r["runs"]), f"{r['compile_s']:.1f}",
                      gib(peak), gib(None if peak is None or inputs is None else peak - inputs),
                      f"{r['useful_tflops']:.3g}"])
    return table(["loss", "impl", "N", "block", "status", "fwd+bwd median (ms)", "runs",
                  "compile (s)", "peak device memory (GiB)", "peak above the inputs (GiB)",
                  "useful TFLOP/s (6 N^2 d / t)"], lines)


def table_c(rows: list[dict]) -> str:
    """Part (c)'s table."""
    lines = []
    for r in rows:
        blocks = "scan" if r["scan"] else "unrolled"
        head = [blocks, r["attention"], "on" if r["remat"] else "off", str(r["batch"])]
        if r["status"] != "ok":
            lines.append([*head, r["status"], *[""] * 6])
            continue
        flops = r.get("flops")
        lines.append([*head, "ok", f"{r['step_s'] * 1e3:.1f}", f"{r['examples_per_s']:.1f}",
                      f"{r['compile_s']:.1f}", gib(r.get("peak_bytes")),
                      "n/a" if not flops else f"{flops / 1e9:.4g}",
                      pct(r.get("mfu")) if flops else r.get("flops_status", "n/a")])
    return table(["blocks", "attention", "remat", "batch", "status", "step (ms)", "examples/s",
                  "compile (s)", "peak device memory (GiB)", "model GFLOP/step", "MFU"], lines)


def header(check: Check) -> list[str]:
    """The file's title, provenance, device and command lines."""
    from contrastive_jax.training.run.provenance import provenance_line

    rec = check.record
    lines = ["# Accelerator check", ""]
    if rec is None:
        lines.append("Provenance: unknown (the first worker gave no record).")
    else:
        fraction = rec.get("memory_fraction_env")
        lines += [provenance_line(rec), "",
                  f"Device: {rec['device_count']} x {rec['device_kind']}, platform "
                  f"{rec['platform']}, JAX allocator limit {gib(rec.get('bytes_limit'))} GiB"
                  + (f" ({fraction})" if fraction else "") + "."]
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return [*lines, "", f"Command: `PYTHONPATH=. {check.command}` "
            f"({'smoke sizes' if check.args.smoke else 'full sizes'}, budget "
            f"{check.args.budget_s:.0f} s; written {date}, {check.elapsed():.0f} s after the "
            "start). Method: `benchmarks/accelerator_check.py`'s docstring."]


def section_a(check: Check, rows: list[dict]) -> list[str]:
    """Part (a): how it was measured, and its table."""
    sizes, rec = check.sizes, check.record
    device = "the default device" if rec is None else (
        f"{rec['default_device_kind']} ({rec['platform']})")
    return [
        f"## (a) Correctness: float32 on {device} vs float64 on the CPU", "",
        f"N = {sizes['a_n']}, d = {sizes['a_d']} (MoCo: queue {sizes['a_queue']}), random "
        "normal embeddings (fixed seeds); CLIP log-scale log(1/0.07), SigLIP log-scale log 10 "
        "and bias -10, NT-Xent temperature 0.1, MoCo temperature 0.07; tiled block "
        f"{sizes['block_size']}. Reference: `impl=\"autodiff\"` in float64 on the CPU. "
        "Relative error: `|v - v64| / |v64|` for the value, `max|g - g64| / max|g64|` for the "
        "gradients (the largest over the embedding arguments; over the scalars). `default`: "
        "JAX's default matmul precision" + ("; `highest`: under "
        "`jax.default_matmul_precision(\"highest\")`" if "highest" in sizes["precisions"]
                                          else "") + ". MoCo's one impl is reverse mode through "
        "its dense form (gradients w.r.t. the queries and the temperature; keys and queue are "
        "under stop_gradient).", "", table_a(rows)]


def section_b(check: Check, rows: list[dict]) -> list[str]:
    """Part (b): how it was measured, and its table."""
    sizes = check.sizes
    block = f"{sizes['block_size']}" + ("" if check.args.smoke else " (`DEFAULT_BLOCK_SIZE`)")
    return [
        "## (b) Speed and memory: tiled vs textbook dense loss, forward + backward", "",
        f"float32, d = {sizes['b_d']}, `jax.value_and_grad` w.r.t. both embeddings, default "
        f"matmul precision; median of up to {sizes['b_runs']} runs after a warm-up (fewer when "
        "a run is long); each row in a fresh process; peak = the device's `peak_bytes_in_use` "
        "over that process (inputs, compiled program, runs; `n/a` where the device reports "
        "none, the CPU); inputs = its `bytes_in_use` before compiling (x and y). `textbook`: "
        "`benchmarks/loss_bench.py`'s dense loss (normalise, `s x y^T`, optax's cross-entropy "
        "both ways / `-mean log_sigmoid`), autodiff; `tiled`: the library's default impl, "
        f"block {block}. Useful TFLOP/s counts the 3 N x N x d matmuls of a dense pass (a "
        "tiled pass does 4).", "", table_b(rows)]


def section_c(check: Check, rows: list[dict]) -> list[str]:
    """Part (c): the model, how it was measured, and its table."""
    sizes = check.sizes
    vit, text = sizes["towers"]
    return [
        "## (c) CLIP train step on one chip", "",
        "Model: the pod template's dual encoder (`configs/clip_vit_b16_pod.py`): ViT image "
        f"{vit['image_size']}, patch {vit['patch']}, width {vit['width']}, depth "
        f"{vit['depth']}, heads {vit['heads']}; text vocab {text['vocab_size']}, "
        f"{text['max_tokens']} tokens, width {text['width']}, depth {text['depth']}, heads "
        f"{text['heads']}; embed {sizes['embed_dim']}{params_text(rows)}. bf16 compute, "
        "float32 parameters, AdamW (optax), tiled CLIP loss; uint8 images normalised on the "
        f"device, random int32 tokens; median of up to {sizes['steps']} steps after a warm-up. "
        f"Batch: the largest of {sizes['batches']} that fits the first configuration "
        "(descending on OOM), then the others at that batch or below. Compile = lowering + XLA "
        "compilation. Model FLOPs: XLA's cost analysis of the *lowered* step (unrolled blocks, "
        "no remat, XLA attention, dense `autodiff` CLIP loss: forward, backward, loss and "
        "AdamW) at the same batch; MFU = model FLOPs / (step time x the chip's dense bf16 "
        f"peak, {peak_text(rows)}).", "", table_c(rows)]


def markdown(check: Check) -> str:
    """The whole file: provenance, command, the three tables with how they were made."""
    by = {p: [r for r in check.rows if r["part"] == p] for p in "abc"}
    return "\n".join([*header(check), "", *section_a(check, by["a"]), "",
                      *section_b(check, by["b"]), "", *section_c(check, by["c"]), ""])


def params_text(rows: list[dict]) -> str:
    """``; 141.5 M parameters`` as the rows carry it (empty if none ran)."""
    count = next((r["params"] for r in rows if r.get("params")), None)
    return "" if count is None else f"; {count / 1e6:.1f} M parameters"


def peak_text(rows: list[dict]) -> str:
    """The chip's peak FLOP/s as the rows carry it."""
    peak = next((r["peak_flops"] for r in rows if r.get("peak_flops")), None)
    return "n/a for this device" if peak is None else f"{peak / 1e12:.0f} TFLOP/s"


def write_outputs(check: Check) -> None:
    """Write the table and the raw rows."""
    out = check.args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "accelerator_check.md").write_text(markdown(check))
    raw = {"provenance": check.record, "command": check.command, "smoke": check.args.smoke,
           "budget_s": check.args.budget_s, "elapsed_s": check.elapsed(), "rows": check.rows}
    (out / "accelerator_check.json").write_text(json.dumps(raw, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Parse the command line; run the worker or the whole check."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help="folder for accelerator_check.md and .json (required)")
    parser.add_argument("--budget_s", type=float, default=330.0,
                        help="seconds for the whole check (parts a, b, c share it)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, same code paths")
    parser.add_argument("--batches", type=int, nargs="+", default=None,
                        help="batch sizes to try in (c), largest first")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        worker(json.loads(args.worker))
        return 0
    if args.out is None:
        parser.error("--out DIR is required (the folder for accelerator_check.md)")
    check = Check(args, argv)
    check.say(f"accelerator check ({'smoke' if args.smoke else 'full'}), budget "
              f"{args.budget_s:.0f} s, writing {args.out / 'accelerator_check.md'}")
    for name, run in (("a", run_part_a), ("b", run_part_b), ("c", run_part_c)):
        try:
            run(check)
        except Exception as err:  # the parent's own bug: record it, go on with the next part
            check.add({"part": name, "status": failure(err), "loss": "-", "impl": "-",
                       "precision": "-", "n": 0, "block": None, "scan": True,
                       "attention": "-", "remat": False, "batch": 0, "label": "-"})
    write_outputs(check)
    print("\n" + markdown(check), flush=True)
    check.say(f"done; wrote {args.out / 'accelerator_check.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
