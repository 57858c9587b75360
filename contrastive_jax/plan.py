"""Memory and speed plan before launch: will this config fit on that pod, and how fast?

    python -m contrastive_jax.plan --config=configs/clip_vit_b16_pod.py --slice=v4-256
    python -m contrastive_jax.plan --config=configs/clip_vit_b16_pod.py --gpus=4x8:h100
    python -m contrastive_jax.plan --config=configs/clip_vit_b16_pod.py --devices=128

turns the target into chips, hosts and memory per chip (:mod:`contrastive_jax.accelerators`:
TPU v4 and v5p slice names count TensorCores, ``v4-256`` is 128 chips), compiles the config's
train step ahead of time on that many fake CPU devices, with abstract inputs (no parameter is
initialised, no data is read), and prints what one chip holds: parameters, optimiser state, the
other state (BatchNorm statistics, MoCo's queue), the batch, and the compiled step's
temporaries; whether that fits with at least 10% headroom; the step's FLOPs per chip, its time at
a stated model-FLOPs utilisation (``--mfu``), the examples per second each host must deliver and
the host CPU cores that takes for an image-text input. On a GPU target the usable memory is the
fraction JAX preallocates (75% unless ``XLA_CLIENT_MEM_FRACTION`` says otherwise).

When the config does not fit, the plan searches: it compiles candidates to find the smallest
``accumulation_steps`` that fits (the divisors of the per-chip batch, starting from the one the
first plan predicts: usually two compiles), then,
if even one example per micro-batch does not fit, the same with FSDP and with remat, and prints
the ``--config...`` overrides to paste. A status line on stderr says what is compiling and for
how long (a compile of the pod template for 128 chips takes about 40 s on 2 cores).

The state bytes follow exactly from the shapes and ``config.sharding``
(:mod:`contrastive_jax.training.step.state_sharding`); the temporaries are XLA:CPU's for the same
partitioned program, an approximation of the accelerator's (the TPU and GPU compilers fuse,
lay out and rematerialise differently, and bf16 may be emulated on CPU), so leave headroom.
The step is compiled with :data:`~contrastive_jax.training.models.remat.CPU_COMPILER_OPTIONS`,
which keeps rematerialisation as the accelerators do (XLA:CPU would otherwise undo it).
The speed section's FLOPs are the step's model FLOPs per chip: XLA's count of the step without
remat, accumulation, scanned layers or tiled losses
(:mod:`contrastive_jax.training.step.model_flops`; the compiled program counts a scanned
tower's loop body once), divided by the chips, and the step time is those at the stated
model-FLOPs utilisation. Planned for a target, a config with remat is also compiled without
it: the plan says whether the step fits without remat and what the recomputation costs (the
FLOPs of the step with it, counted the same way), so that remat stays on only where it is
needed.

Exit status 2 with one line ``error: ...`` for a config that cannot be compiled (a batch that
does not divide over the devices, an unknown setting), an unknown slice name, a GPU spec
without memory, or a batch that no candidate fits, as the trainer would say at start.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, TextIO

from absl import flags, logging

from contrastive_jax.accelerators import GiB, Target, gpu_cluster, tpu_slice
from contrastive_jax.errors import ConfigError
from contrastive_jax.plan_search import Search, find_fit, paste, with_overrides

if TYPE_CHECKING:
    from contrastive_jax.training.run_spec import RunSpec

# accelerator memory per chip (HBM), bytes: the chips a plan without a target compares with
CHIPS = {"TPU v4": 32 * GiB, "TPU v5e": 16 * GiB, "TPU v5p": 95 * GiB, "TPU v6e": 32 * GiB,
         "A100 80GB": 80 * GiB, "H100": 80 * GiB}
HEADROOM = 0.9  # a plan fits a chip when it needs at most this fraction of its memory
DEFAULT_MFU = 0.4  # the model-FLOPs utilisation the step time is stated at
# Images per CPU-second of the pod template's input pipeline (uint8, reduced JPEG decode; the
# best row of experiments/results/image_input_bench.md, 2 cores of the 2026-12-02 machine).
IMAGES_PER_CORE_SECOND = 211.6
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

    @property
    def total(self) -> int:
        """Peak estimate: the step's inputs, its new outputs and its temporaries."""
        return self.arguments + self.outputs_not_aliased + self.temporaries

    def fits(self, chip_bytes: int) -> bool:
        return self.total <= HEADROOM * chip_bytes


def example_shapes(config) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{feature: (per-example shape, dtype)}`` of a training batch, from the model config.

    The sample encoder's input (``config.input_key``) is what its class's ``input_shape``
    declares for its block (the encoder protocol, docs/architecture.md: a ViT
    ``(image_size, image_size, in_channels)``, a signal CNN ``(length, in_channels)``, an MLP
    ``(in_features,)``, a ResNet the data's ``data.preprocess.image_size``). Images come as
    uint8 with the ``image_text`` preprocessing (the host sends uint8, the device normalises),
    float32 otherwise. Dual encoders add ``text_key``: the text tower's ``input_shape``, int32.
    A ``loss.positive_ids`` feature is ``()`` int32.
    """
    from contrastive_jax.training.models import ENCODERS, with_defaults

    def declared(block, image_size=None) -> tuple[int, ...]:
        block = with_defaults(block)
        if block.get("name") not in ENCODERS:
            raise ConfigError(f"unknown encoder {block.get('name')!r}; valid: {sorted(ENCODERS)}")
        return tuple(ENCODERS[block["name"]].input_shape(block, image_size))

    model = config.model
    preprocess = config.data.get("preprocess") or {}
    shape = declared(model.get("sample_encoder") or model.get("encoder"),
                     preprocess.get("image_size"))
    image_text = preprocess.get("name") == "image_text"
    shapes = {config.input_key: (shape, "uint8" if image_text and len(shape) == 3
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
    at the start, the elapsed time every ``every`` seconds, ``compiled in N s`` at the end."""
    stream = sys.stderr if stream is None else stream
    start = time.perf_counter()
    done = threading.Event()
    print(f"plan: compiling {what} ...", file=stream, flush=True)

    def tick() -> None:
        while not done.wait(every):
            print(f"plan: still compiling {what}: {time.perf_counter() - start:.0f} s",
                  file=stream, flush=True)

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        print(f"plan: compiled {what} in {time.perf_counter() - start:.0f} s", file=stream,
              flush=True)


def _flops(compiled) -> float | None:
    """XLA's FLOP count of a compiled program (a dict, or a one-element list on older JAX)."""
    try:
        cost = compiled.cost_analysis()
    except Exception:  # a backend without cost analysis
        return None
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    value = (cost or {}).get("flops")
    return float(value) if value is not None and value >= 0 else None


def planned(config, mesh) -> RunSpec:
    """The run the plan compiles: ``config`` resolved on ``mesh``
    (:func:`~contrastive_jax.training.run_spec.resolve`: the trainer's checks at start) without
    reading the data: ``total_steps``, or 1000 steps (the schedule's length does not change
    memory)."""
    from contrastive_jax.training.run_spec import resolve

    return resolve(config, mesh=mesh, steps=int(config.get("total_steps") or 1000))


def plan(spec: RunSpec, *, status: TextIO | None = None) -> Plan:
    """Compile the train step of the run ``spec`` (:func:`planned`) on its mesh with abstract
    inputs; the bytes per device.

    The state is built with ``jax.eval_shape`` (shapes only) and placed by ``config.sharding``;
    the batch is ``data.batch_size`` rows of :func:`example_shapes` split over ``data``.
    With ``status`` (a stream), a status line says what compiles (:func:`compiling`).
    """
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from contrastive_jax.mesh import DATA_AXIS
    from contrastive_jax.training.models.remat import CPU_COMPILER_OPTIONS
    from contrastive_jax.training.step.state_sharding import bytes_per_device, state_shardings
    from contrastive_jax.training.step.train_state import create_state
    from contrastive_jax.training.step.train_step import compiled_step

    config, mesh, method, steps = spec.config, spec.mesh, spec.method, spec.steps
    accumulation = spec.accumulation_steps
    built = {}

    def build():
        built["graphdef"], state, built["tx"] = create_state(config, steps, method)
        return state

    abstract = jax.eval_shape(build)
    shardings = state_shardings(config.get("sharding"), mesh, abstract)
    state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                         abstract, shardings)
    rows = config.data.batch_size
    batch_sharding = NamedSharding(mesh, P(DATA_AXIS))
    batch = {k: jax.ShapeDtypeStruct((rows, *shape), dtype, sharding=batch_sharding)
             for k, (shape, dtype) in example_shapes(config).items()}
    step = compiled_step(config, mesh, built["graphdef"], state, built["tx"], steps, method)
    what = (f"the train step for {mesh.devices.size} devices (accumulation_steps="
            f"{accumulation}{', remat' if config.model.get('remat') else ''}, "
            f"{(config.get('sharding') or {}).get('params', 'replicated')} parameters)")
    start = time.perf_counter()
    with compiling(what, status) if status is not None else contextlib.nullcontext():
        # keep remat's barriers, as the TPU and GPU compilers do (XLA:CPU would undo remat)
        compiled = step.lower(state, batch).compile(compiler_options=CPU_COMPILER_OPTIONS)
    seconds = time.perf_counter() - start
    memory = compiled.memory_analysis()
    if memory is None:
        raise ConfigError("this JAX build reports no memory analysis for compiled programs")
    part = {name: getattr(state, name) for name in ("params", "opt_state")}
    other = {name: getattr(state, name) for name in ("rest", "extra", "step", "rng", "skipped",
                                                     "skipped_in_a_row")}
    return Plan(
        devices=int(mesh.devices.size), global_batch=rows,
        accumulation_steps=accumulation,
        params=bytes_per_device(part["params"], shardings.params),
        opt_state=bytes_per_device(part["opt_state"], shardings.opt_state),
        other_state=bytes_per_device(other, {k: getattr(shardings, k) for k in other}),
        batch=bytes_per_device(batch, jax.tree.map(lambda b: b.sharding, batch)),
        temporaries=int(memory.temp_size_in_bytes),
        arguments=int(memory.argument_size_in_bytes),
        outputs_not_aliased=max(0, int(memory.output_size_in_bytes)
                                - int(memory.alias_size_in_bytes)),
        compile_s=seconds, flops=_flops(compiled))


# --------------------------------------------------------------------------------- report
def _size(n: float) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB / 10 else f"{n / 2**20:.2f} MiB"


def memory_lines(p: Plan) -> list[str]:
    """The bytes-per-device table."""
    def gib(n: int) -> str:
        return f"{n / GiB:8.2f} GiB" if n >= GiB / 10 else f"{n / 2**20:8.2f} MiB"

    return ["per device                     ",
            f"  parameters                   {gib(p.params)}",
            f"  optimiser state              {gib(p.opt_state)}",
            f"  other state (BN, queue, ...) {gib(p.other_state)}",
            f"  batch                        {gib(p.batch)}",
            f"  step temporaries (XLA:CPU)   {gib(p.temporaries)}",
            f"  total (inputs + new outputs + temporaries) {gib(p.total).strip()}"]


def headline(p: Plan, config_name: str, target: Target | None = None) -> str:
    """The plan's first line: the config, where it runs, the batch and the compile time."""
    per_device = p.global_batch // p.devices
    micro = (f", {p.accumulation_steps} micro-batches of {per_device // p.accumulation_steps}"
             if p.accumulation_steps > 1 else "")
    where = f"{p.devices} devices"
    if target is not None:
        where = (f"{target.kind} {target.name} ({target.chips} chips on {target.hosts} "
                 f"host{'s' if target.hosts > 1 else ''}, {_size(target.memory)} each)"
                 if target.kind.startswith("TPU") else
                 f"{target.chips} GPUs ({target.kind}, {target.hosts} node"
                 f"{'s' if target.hosts > 1 else ''}, {_size(target.memory)} each)")
    return (f"memory plan: {config_name} on {where}, global batch {p.global_batch} "
            f"({per_device} per device{micro}); compiled in {p.compile_s:.0f} s on CPU")


def report(p: Plan, config_name: str, chips: Mapping[str, int] = CHIPS) -> str:
    """The plan as a table: bytes per device, and which chips it fits (at most
    :data:`HEADROOM` of their memory)."""
    lines = [headline(p, config_name), "", *memory_lines(p), ""]
    for chip, size in chips.items():
        verdict = "fits" if p.fits(size) else "does NOT fit"
        lines.append(f"  {chip:10s} {size / GiB:5.0f} GiB: {verdict} "
                     f"({100 * p.total / size:.0f}% of its memory)")
    lines.append("")
    lines.append(_CAVEAT)
    return "\n".join(lines)


_CAVEAT = ("The temporaries are XLA:CPU's compile of the same partitioned step: the TPU/GPU "
           "compilers fuse and lay out differently, so treat them as an estimate and keep "
           f"headroom (a chip 'fits' at <= {HEADROOM:.0%} of its memory).")


@dataclasses.dataclass
class Speed:
    """The step's time and input rate on a target at a stated model-FLOPs utilisation."""

    flops_per_chip: float
    mfu: float
    step_s: float | None  # None when the target's peak is unknown
    examples_per_s_per_host: float | None
    host_cores: float | None  # for an image input, at IMAGES_PER_CORE_SECOND

    @classmethod
    def of(cls, p: Plan, flops: float, target: Target, mfu: float, images: bool) -> Speed:
        if target.peak_flops is None:
            return cls(flops, mfu, None, None, None)
        step_s = flops / (mfu * target.peak_flops)
        per_host = p.global_batch / step_s / target.hosts
        return cls(flops, mfu, step_s, per_host,
                   per_host / IMAGES_PER_CORE_SECOND if images else None)


def uses_remat(config) -> bool:
    """Whether any tower of ``config`` is rematerialised (``model.remat``: True, a policy, or
    one entry per tower)."""
    remat = config.model.get("remat", False)
    if hasattr(remat, "values"):
        return any(v is not False for v in remat.values())
    return remat is not False


def per_chip_flops(config, mesh, keep_remat: bool = False) -> float | None:
    """The model FLOPs of one step per chip (``keep_remat``: with the recomputation)."""
    import jax

    from contrastive_jax.training.step.model_flops import step_flops

    shapes = {k: jax.ShapeDtypeStruct((config.data.batch_size, *shape), dtype)
              for k, (shape, dtype) in example_shapes(config).items()}
    total = step_flops(config, mesh, shapes, int(config.get("total_steps") or 1000),
                       keep_remat=keep_remat)
    return None if total is None else total / mesh.devices.size


@dataclasses.dataclass
class RematCheck:
    """A config with remat, planned without it: whether it fits, and what remat costs."""

    total_without: int  # bytes per chip of the step without remat
    fits_without: bool
    model_flops_per_chip: float | None
    flops_with_remat_per_chip: float | None  # the step as the chips execute it

    @property
    def extra(self) -> float | None:
        """The recomputation as a fraction of the model FLOPs."""
        if not self.model_flops_per_chip or self.flops_with_remat_per_chip is None:
            return None
        return self.flops_with_remat_per_chip / self.model_flops_per_chip - 1


def remat_check(config, mesh, budget: float) -> RematCheck:
    """Compile ``config`` without remat and count its FLOPs with and without it."""
    without = plan(planned(with_overrides(config, {"model.remat": False}), mesh),
                   status=sys.stderr)
    return RematCheck(without.total, without.total <= budget, per_chip_flops(config, mesh),
                      per_chip_flops(config, mesh, keep_remat=True))


def remat_lines(check: RematCheck, usable: int) -> list[str]:
    """What the plan without remat says: the bytes, the verdict, the FLOPs remat costs."""
    verdict = ("it fits without remat too: drop it to save the recomputation "
               "(--config.model.remat=False)" if check.fits_without else
               "it does not fit without remat: keep it")
    lines = ["", "remat (model.remat):",
             f"  without remat the step needs {_size(check.total_without)} per chip "
             f"({100 * check.total_without / usable:.0f}% of the usable memory): {verdict}"]
    if check.extra is not None:
        lines.append(f"  remat's recomputation: {check.flops_with_remat_per_chip / 1e12:.2f} "
                     f"TFLOP per chip per step against the model's "
                     f"{check.model_flops_per_chip / 1e12:.2f} (+{100 * check.extra:.0f}%)")
    return lines


def target_report(p: Plan, config_name: str, target: Target, search: Search | None,
                  speed: Speed | None, remat: RematCheck | None = None) -> str:
    """The plan against one target: the bytes, the verdict (with the search when it did not
    fit), and the speed at the stated utilisation."""
    budget = HEADROOM * target.usable
    lines = [headline(p, config_name, target), "", *memory_lines(p), ""]
    usable = (f"{_size(target.usable)} usable = {target.usable_fraction:.0%} of "
              f"{_size(target.memory)} (JAX's GPU preallocation; XLA_CLIENT_MEM_FRACTION)"
              if target.usable_fraction < 1 else _size(target.memory))
    fits = p.total <= budget
    lines.append(f"  {'fits' if fits else 'does NOT fit'}: {_size(p.total)} of {usable} "
                 f"({100 * p.total / target.usable:.0f}%; the plan asks <= {HEADROOM:.0%})")
    if target.usable_fraction < 1 and not fits and p.total <= HEADROOM * target.memory:
        lines.append(f"  it would fit with XLA_CLIENT_MEM_FRACTION=.95 "
                     f"({100 * p.total / target.memory:.0f}% of the whole memory)")
    if search is not None:
        lines += ["", "search (each candidate compiled):"]
        for overrides, result in search.tried:
            ok = result.total <= budget
            lines.append(f"  {paste(overrides):72s} {_size(result.total):>10s} "
                         f"{'fits' if ok else 'does not fit'}")
        if search.answer is not None:
            needs = [name for key, name in (("sharding.params", "FSDP"), ("model.remat", "remat"))
                     if key in search.answer]
            lines += ["", f"smallest that fits: accumulation_steps="
                          f"{search.answer['accumulation_steps']}"
                          + (f" (needs {' and '.join(needs)})" if needs else "")
                          + "; add to the command:",
                      f"  {paste(search.answer)}"]
    if speed is not None:
        lines += ["", f"speed at {speed.mfu:.0%} model-FLOPs utilisation (--mfu):",
                  f"  FLOPs per chip per step    {speed.flops_per_chip / 1e12:.2f} TFLOP "
                  "(model FLOPs: XLA's count of the step without remat, accumulation or "
                  "scanned layers)"]
        if speed.step_s is None:
            lines.append("  step time: unknown peak FLOP/s for this GPU (name it, e.g. "
                         "4x8:h100)")
        else:
            lines.append(f"  step time                  {speed.step_s:.3f} s at "
                         f"{speed.mfu:.0%} of {target.peak_flops / 1e12:.0f} TFLOP/s")
            lines.append(f"  examples/s                 {p.global_batch / speed.step_s:,.0f} "
                         f"in all, {speed.examples_per_s_per_host:,.0f} per host")
            if speed.host_cores is not None:
                lines.append(f"  host CPU cores for input   {math.ceil(speed.host_cores)} "
                             f"per host (at {IMAGES_PER_CORE_SECOND} images per core-second: "
                             "experiments/results/image_input_bench.md)")
    if remat is not None:
        lines += remat_lines(remat, target.usable)
    lines += ["", _CAVEAT]
    return "\n".join(lines)


_DEVICES = flags.DEFINE_integer("devices", None, "Fake CPU devices to plan for (the pod's "
                                "chips), compared with every chip of CHIPS; default 8.")
_SLICE = flags.DEFINE_string("slice", "", "A TPU slice to plan for: v4-256 (v4 and v5p names "
                             "count TensorCores, 2 per chip), v5litepod-64 or v5e-64, v6e-256.")
_GPUS = flags.DEFINE_string("gpus", "", "A GPU cluster to plan for: NODESxGPUS:MEMORY, e.g. "
                            "4x8:80GiB, or NODESxGPUS:NAME (a100-40, a100-80, h100).")
_MFU = flags.DEFINE_float("mfu", DEFAULT_MFU, "Model-FLOPs utilisation the step time is stated "
                          "at (a fraction of the chip's peak bf16 FLOP/s).")
_SEARCH = flags.DEFINE_bool("search", True, "When the config does not fit the target, compile "
                            "candidates to find the smallest accumulation_steps that fits.")
_JSON = flags.DEFINE_string("json", "", "Also write the plan (bytes per device) to this JSON file.")
_CHIPS = flags.DEFINE_list("chips", [], f"Chips to compare with (default: {', '.join(CHIPS)}).")


def target_from_flags() -> Target | None:
    """The ``--slice`` or ``--gpus`` target (at most one), checked against ``--devices``."""
    if _SLICE.value and _GPUS.value:
        raise ConfigError("give --slice or --gpus, not both")
    target = (tpu_slice(_SLICE.value) if _SLICE.value else
              gpu_cluster(_GPUS.value) if _GPUS.value else None)
    if target is not None and _DEVICES.value is not None and _DEVICES.value != target.chips:
        raise ConfigError(f"--devices={_DEVICES.value} but {target.name} has {target.chips} "
                          "chips; drop --devices")
    if not 0 < _MFU.value <= 1:
        raise ConfigError(f"--mfu must be a fraction in (0, 1]; got {_MFU.value}")
    return target


def _plan(argv: Sequence[str]) -> None:
    """Plan ``--config`` for ``--slice``/``--gpus`` (or on ``--devices`` fake CPU devices) and
    print the tables."""
    import jax

    target = target_from_flags()
    devices = target.chips if target is not None else (_DEVICES.value or 8)
    if devices < 1:
        raise ConfigError(f"--devices must be >= 1; got {devices}")
    if not flags.FLAGS["verbosity"].present:  # optax and orbax log at INFO
        logging.set_verbosity(logging.WARNING)
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", devices)
    from contrastive_jax.main import load_config
    from contrastive_jax.mesh import make_mesh

    config = load_config()
    chips = {c: CHIPS[c] for c in _CHIPS.value if c in CHIPS} if _CHIPS.value else CHIPS
    unknown = [c for c in _CHIPS.value if c not in CHIPS]
    if unknown:
        raise ConfigError(f"unknown chips {unknown}; known: {sorted(CHIPS)}")
    mesh = make_mesh(dict(config.get("mesh", {"data": -1})))
    name = flags.FLAGS["config"].serialize().partition("=")[2]
    result = plan(planned(config, mesh), status=sys.stderr)
    record = {**dataclasses.asdict(result), "total": result.total}
    if target is None:
        print(report(result, name, chips))
        record["fits"] = {chip: result.fits(size) for chip, size in chips.items()}
    else:
        record.update(target_plan(config, mesh, result, name, target, _MFU.value,
                                  _SEARCH.value))
    if _JSON.value:
        from contrastive_jax.training.run.provenance import provenance
        from contrastive_jax.training.run.workdir import json_output

        json_output.write_atomic(_JSON.value, {**record, "provenance": provenance()})
    if target is not None and record["fits_target"] is False and _SEARCH.value and \
            record["search"]["answer"] is None:
        raise ConfigError(f"{name} does not fit {target.name} even with one example per "
                          "micro-batch, FSDP and remat; use a larger slice (more chips) or a "
                          "smaller data.batch_size")


def target_plan(config, mesh, result: Plan, name: str, target: Target, mfu: float,
                search: bool) -> dict:
    """Print the plan against ``target`` (searching for a fit when it does not fit and
    ``search``); the JSON record's target fields."""
    budget = HEADROOM * target.usable
    fits = result.total <= budget
    found = find_fit(config, mesh, budget, result,
                     lambda c, m: plan(planned(c, m), status=sys.stderr)) \
        if not fits and search else None
    final = (found.answer if found is not None and found.answer is not None else {})
    chosen = with_overrides(config, final) if final else config
    flops = per_chip_flops(chosen, mesh)
    images = any(len(shape) == 3 for shape, _ in example_shapes(config).values())
    speed = Speed.of(result, flops, target, mfu, images) if flops else None
    remat = remat_check(chosen, mesh, budget) if uses_remat(chosen) else None
    print(target_report(result, name, target, found, speed, remat))
    return {"target": dataclasses.asdict(target), "usable_bytes": target.usable,
            "fits_target": fits,
            "remat": None if remat is None else dataclasses.asdict(remat),
            "search": None if found is None else {
                "tried": [{"overrides": o, "total": r.total, "temporaries": r.temporaries}
                          for o, r in found.tried],
                "answer": found.answer},
            "speed": None if speed is None else dataclasses.asdict(speed)}


def main(argv: Sequence[str] | None = None) -> None:
    """The command line (``argv``: its arguments, ``sys.argv[1:]`` when None) through
    :func:`contrastive_jax.command_line.run_command`: help with the config files, ``--jax_*`` flags,
    the project's errors as ``error: ...`` and exit status 2."""
    from contrastive_jax import command_line
    from contrastive_jax.main import parse_trainer_flags  # defines --config

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    names = ("config", *(f.name for f in (_DEVICES, _SLICE, _GPUS, _MFU, _SEARCH, _JSON,
                                          _CHIPS)))
    sys.exit(command_line.run_command(command_line.Command(
        program="python -m contrastive_jax.plan", doc=__doc__, flag_names=names,
        required=("config",), parse=parse_trainer_flags, configs=True), _plan, argv))


if __name__ == "__main__":
    main()

