"""The plan of one train step: its bytes per device, from a compile with abstract inputs.

:func:`plan` compiles the train step of a run (:func:`planned`: a config resolved on a mesh,
the data never read) ahead of time, with the state built by ``jax.eval_shape`` and placed by
``config.sharding``, and a batch of :func:`example_shapes`, and returns a :class:`Plan`:
parameters, optimiser state, the other state, the batch and XLA's temporaries per device, and
the step's FLOPs. On a mesh of fake CPU devices XLA:CPU compiles it; on a mesh of a TPU
slice's devices (:func:`contrastive_jax.plan.tpu_compiler.topology_devices`) the TPU compiler
does, and the plan holds its numbers (generated code, the memory it says a chip has, its cost
analysis), or its refusal when the step does not fit. The command line, what it prints and how
far to trust each compiler: :mod:`contrastive_jax.plan.command`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, TextIO

from contrastive_jax.accelerators import GiB
from contrastive_jax.errors import ConfigError
from contrastive_jax.interrupts import activity
from contrastive_jax.training.data.example_preprocessing import decodes_images

if TYPE_CHECKING:
    from contrastive_jax.plan.tpu_compiler import Cost
    from contrastive_jax.training.run_spec import RunSpec

# accelerator memory per chip (HBM), bytes: the chips a plan without a target compares with
CHIPS = {"TPU v4": 32 * GiB, "TPU v5e": 16 * GiB, "TPU v5p": 95 * GiB, "TPU v6e": 32 * GiB,
         "A100 80GB": 80 * GiB, "H100": 80 * GiB}
HEADROOM = 0.9  # a plan fits a chip when it needs at most this fraction of its memory
DEFAULT_MFU = 0.4  # the model-FLOPs utilisation the step time is stated at
# Images per CPU-second of the pod template's input pipeline (uint8, reduced JPEG decode; the
# best row of experiments/results/image_input_bench.md, 2 cores of the 2026-12-02 machine).
IMAGES_PER_CORE_SECOND = 211.6
# A stream of shards (data.source = "shards") against that pipeline, images per CPU-second
# measured side by side (experiments/results/image_input_stream.md, 2026-12-07, another
# machine than the table above, so as ratios; 2 worker processes each): tars on the
# local disk 395.9 / 424.3, tars in a bucket (loopback GCS server, its own CPU not counted)
# 388.9 / 424.3 (medians of 3 rounds).
STREAM_RELATIVE_RATE = {"local": 395.9 / 424.3, "gs": 388.9 / 424.3}
STATUS_EVERY_S = 15.0


@dataclasses.dataclass
class Plan:
    """Bytes per device of one train step (see :func:`plan`), and its FLOPs."""

    devices: int
    global_batch: int
    accumulation_steps: int
    params: int
    opt_state: int
    other_state: int
    batch: int
    temporaries: int
    arguments: int  # everything the step reads (state + batch), as XLA counts it
    outputs_not_aliased: int  # outputs that do not reuse a donated input buffer
    compile_s: float
    flops: float | None = None  # XLA's count for the per-device program (loop bodies once)
    compiler: str = "XLA:CPU"  # or "TPU" (libtpu's compiler, for the slice's devices)
    generated_code: int = 0  # the TPU program's code, held in HBM (0 for XLA:CPU: host code)
    peak: int | None = None  # the TPU compiler's peak of live buffers (peak_memory_in_bytes)
    usable: int | None = None  # bytes of a chip the TPU compiler lets a program use
    refused: str | None = None  # the TPU compiler's refusal (RESOURCE_EXHAUSTED), if it did
    cost: Cost | None = None  # the TPU compiler's cost analysis
    laid_out: int | None = None  # state + batch in the TPU's tiled layouts (= arguments)

    @property
    def total(self) -> int:
        """Peak estimate: the step's inputs, its new outputs, its temporaries and (on TPU) its
        code. For a step the TPU compiler refused: the state and batch with the temporaries it
        said it needed (outputs unknown)."""
        return (self.arguments + self.outputs_not_aliased + self.temporaries
                + self.generated_code)

    def fits(self, chip_bytes: int) -> bool:
        return self.total <= HEADROOM * chip_bytes


def example_shapes(config) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{feature: (per-example shape, dtype)}`` of a training batch, from the model config.

    The sample encoder's input (``config.input_key``) is what its class's ``input_shape``
    declares for its block (the encoder protocol, docs/architecture.md: a ViT
    ``(image_size, image_size, in_channels)``, a signal CNN ``(length, in_channels)``, an MLP
    ``(in_features,)``, a ResNet the data's ``data.preprocess.image_size``). Images come as
    uint8 with the ``image_text`` and ``image`` preprocessings (the host sends uint8, the device
    normalises; ``image`` with ``views`` > 1 sends ``(views, S, S, 3)``), float32 otherwise.
    Dual encoders add ``text_key``: the text tower's ``input_shape``, int32.
    A ``loss.positive_ids`` feature is ``()`` int32.
    """
    from contrastive_jax.training.models import encoder_input_shape as declared

    model = config.model
    preprocess = config.data.get("preprocess") or {}
    shape = declared(model.get("sample_encoder") or model.get("encoder"),
                     preprocess.get("image_size"))
    decoded = decodes_images(preprocess)
    views = preprocess.get("views", 1) if preprocess.get("name") == "image" else 1
    if decoded and len(shape) == 3 and views > 1:  # the views cropped on the host
        shape = (views, *shape)
    shapes = {config.input_key: (shape, "uint8" if decoded and len(shape) >= 3
                                 else "float32")}
    if model.get("name") == "dual_encoder":
        shapes[config.get("text_key", "caption")] = (declared(model.text_encoder), "int32")
    if config.loss.get("positive_ids"):
        shapes[config.loss.positive_ids] = ((), "int32")
    return shapes


@contextlib.contextmanager
def compiling(what: str, stream: TextIO | None = None,
              every: float = STATUS_EVERY_S) -> Iterator[None]:
    """A status line on ``stream`` (stderr) while a compile runs: ``plan: compiling WHAT``
    at the start, the elapsed time every ``every`` seconds, ``compiled in N s`` at the end
    (not when the block raises). Inside, a Ctrl-C says ``interrupted (SIGINT) while compiling
    WHAT`` (:func:`contrastive_jax.interrupts.activity`)."""
    stream = sys.stderr if stream is None else stream
    start = time.perf_counter()
    done = threading.Event()

    def tick() -> None:
        while not done.wait(every):
            print(f"plan: still compiling {what}: {time.perf_counter() - start:.0f} s",
                  file=stream, flush=True)

    with activity(f"compiling {what}"):
        print(f"plan: compiling {what} ...", file=stream, flush=True)
        thread = threading.Thread(target=tick, daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
        print(f"plan: compiled {what} in {time.perf_counter() - start:.0f} s", file=stream,
              flush=True)


def planned(config, mesh) -> RunSpec:
    """The run the plan compiles: ``config`` resolved on ``mesh``
    (:func:`~contrastive_jax.training.run_spec.resolve`: the trainer's checks at start) without
    reading the data: ``total_steps``, or 1000 steps (the schedule's length does not change
    memory)."""
    from contrastive_jax.training.run_spec import resolve

    return resolve(config, mesh=mesh, steps=int(config.get("total_steps") or 1000))


def on_tpu(mesh) -> bool:
    """Whether ``mesh`` is made of TPU devices (a slice described by the TPU compiler)."""
    return mesh.devices.flat[0].platform == "tpu"


def plan(spec: RunSpec, *, status: TextIO | None = None) -> Plan:
    """Compile the train step of the run ``spec`` (:func:`planned`) on its mesh with abstract
    inputs; the bytes per device.

    The state is built with ``jax.eval_shape`` (shapes only) and placed by ``config.sharding``;
    the batch is ``data.batch_size`` rows of :func:`example_shapes` split over ``data``.
    On fake CPU devices XLA:CPU compiles with
    :data:`~contrastive_jax.training.models.remat.CPU_COMPILER_OPTIONS`; on a TPU slice's
    devices the TPU compiler compiles with its defaults, and a step it refuses for memory is a
    plan with ``refused`` set and its figure as the temporaries.
    With ``status`` (a stream), a status line says what compiles (:func:`compiling`).
    """
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from contrastive_jax.mesh import DATA_AXIS
    from contrastive_jax.plan import tpu_compiler
    from contrastive_jax.training.models.remat import CPU_COMPILER_OPTIONS
    from contrastive_jax.training.step.model_flops import flops_of
    from contrastive_jax.training.step.state_sharding import bytes_per_device
    from contrastive_jax.training.step.train_state import abstract_state
    from contrastive_jax.training.step.train_step import compiled_step

    config, mesh, method, steps = spec.config, spec.mesh, spec.method, spec.steps
    accumulation = spec.accumulation_steps
    graphdef, state, tx, shardings = abstract_state(config, steps, method, mesh)
    rows = config.data.batch_size
    batch_sharding = NamedSharding(mesh, P(DATA_AXIS))
    batch = {k: jax.ShapeDtypeStruct((rows, *shape), dtype, sharding=batch_sharding)
             for k, (shape, dtype) in example_shapes(config).items()}
    step = compiled_step(config, mesh, graphdef, state, tx, steps, method)
    tpu = on_tpu(mesh)
    remat = config.model.get("remat")
    unrolled = any(config.model[t].get("scan") is False
                   for t in ("sample_encoder", "text_encoder", "encoder") if t in config.model)
    what = (f"the train step for {mesh.devices.size} {'TPU chips' if tpu else 'devices'} "
            f"(accumulation_steps={accumulation}"
            f"{', remat' if remat is True else f', remat={remat}' if remat else ''}"
            f"{', unrolled towers' if unrolled else ''}, "
            f"{(config.get('sharding') or {}).get('params', 'replicated')} parameters)"
            + (" with the TPU compiler" if tpu else ""))
    start = time.perf_counter()
    with compiling(what, status) if status is not None else contextlib.nullcontext():
        lowered = step.lower(state, batch)
        if tpu:
            compiled = tpu_compiler.compile_or_refusal(lowered)
        else:  # keep remat's barriers, as the TPU and GPU compilers do (XLA:CPU undoes remat)
            compiled = lowered.compile(compiler_options=CPU_COMPILER_OPTIONS)
    seconds = time.perf_counter() - start
    part = {name: getattr(state, name) for name in ("params", "opt_state")}
    other = {name: getattr(state, name) for name in ("rest", "extra", "step", "rng", "skipped",
                                                     "skipped_in_a_row")}
    sizes = dict(params=bytes_per_device(part["params"], shardings.params),
                 opt_state=bytes_per_device(part["opt_state"], shardings.opt_state),
                 other_state=bytes_per_device(other, {k: getattr(shardings, k) for k in other}),
                 batch=bytes_per_device(batch, jax.tree.map(lambda b: b.sharding, batch)))
    common = dict(devices=int(mesh.devices.size), global_batch=rows,
                  accumulation_steps=accumulation, compile_s=seconds, **sizes)
    if tpu:
        common.update(compiler="TPU", usable=tpu_compiler.usable_hbm(mesh.devices.flat))
    if isinstance(compiled, tpu_compiler.MemoryRefusal):
        arguments = sum(sizes.values())
        needed = (compiled.needed or 0) - (arguments if compiled.whole else 0)
        return Plan(temporaries=max(0, needed), arguments=arguments,
                    outputs_not_aliased=0, refused=compiled.message,
                    **{**common, "usable": compiled.available or common["usable"]})
    memory = compiled.memory_analysis()
    if memory is None:
        raise ConfigError("this JAX build reports no memory analysis for compiled programs")
    result = Plan(temporaries=int(memory.temp_size_in_bytes),
                  arguments=int(memory.argument_size_in_bytes),
                  outputs_not_aliased=max(0, int(memory.output_size_in_bytes)
                                          - int(memory.alias_size_in_bytes)),
                  flops=flops_of(compiled), **common)
    if tpu:
        result.generated_code = int(memory.generated_code_size_in_bytes)
        result.peak = int(getattr(memory, "peak_memory_in_bytes", 0)) or None
        result.cost = tpu_compiler.cost_of(compiled)
        result.laid_out = tpu_compiler.arguments_laid_out(compiled, (state, batch))
    return result
