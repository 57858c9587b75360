"""What the plan prints: the bytes-per-device table, the verdict against chips or one target,
the search's candidates, the speed at a stated model-FLOPs utilisation, and, for a config with
remat, the same step planned without it (:func:`remat_check`)."""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Mapping, Sequence

from contrastive_jax.accelerators import GiB, Target
from contrastive_jax.interrupts import activity
from contrastive_jax.plan.search import Search, paste, with_overrides
from contrastive_jax.plan.step_plan import (
    CHIPS,
    HEADROOM,
    IMAGES_PER_CORE_SECOND,
    STREAM_RELATIVE_RATE,
    Plan,
    example_shapes,
    plan,
    planned,
)


def _size(n: float) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB / 10 else f"{n / 2**20:.2f} MiB"


def memory_lines(p: Plan | Sequence[Plan]) -> list[str]:
    """The bytes-per-device table: one column per compiler (XLA:CPU, the TPU compiler) when
    given several plans of the same step."""
    plans = [p] if isinstance(p, Plan) else list(p)

    def gib(n: int | None) -> str:
        if n is None:
            return f"{'-':>12s}"
        return f"{n / GiB:8.2f} GiB" if n >= GiB / 10 else f"{n / 2**20:8.2f} MiB"

    def row(label: str, values: list[int | None]) -> str:
        return f"  {label:34s}" + "".join(f"{gib(v):>16s}" for v in values)

    def named(q: Plan) -> str:
        return "TPU compiler" if q.compiler == "TPU" else "XLA:CPU"

    tpu = any(q.compiler == "TPU" for q in plans)
    lines = [f"{'per device':36s}" + "".join(f"{named(q):>16s}" for q in plans),
             row("parameters", [q.params for q in plans]),
             row("optimiser state", [q.opt_state for q in plans]),
             row("other state (BN, queue, ...)", [q.other_state for q in plans]),
             row("batch", [q.batch for q in plans])]
    if tpu:
        lines.append(row("arguments as laid out (tiles)",
                         [q.arguments if q.refused is None else None for q in plans]))
    lines.append(row("step temporaries", [q.temporaries for q in plans]))
    if tpu:
        lines += [row("generated code (in HBM)",
                      [q.generated_code if q.compiler == "TPU" else None for q in plans]),
                  row("peak of live buffers (TPU)", [q.peak for q in plans])]
    lines.append(row("total (in + new out + temp" + (" + code)" if tpu else ")"),
                     [q.total for q in plans]))
    for q in plans:
        if q.refused is not None:
            lines.append(f"  the TPU compiler refused the step: {q.refused} (the total is the "
                         "state and batch with the temporaries it said it needed)")
    return lines


def headline(p: Plan, config_name: str, target: Target | None = None) -> str:
    """The plan's first line: the config, where it runs, the batch and the compile time."""
    per_device = p.global_batch // p.devices
    micro = (f", {p.accumulation_steps} micro-batches of {per_device // p.accumulation_steps}"
             if p.accumulation_steps > 1 else "")
    where = f"{p.devices} devices"
    if target is not None:
        chips, hosts = target.chips // target.slices, target.hosts // target.slices
        where = (f"{target.kind} {target.name} ({chips} chip{'s' if chips > 1 else ''} on "
                 f"{hosts} host{'s' if hosts > 1 else ''}, {_size(target.memory)} each)"
                 if target.kind.startswith("TPU") else
                 f"{target.chips} GPUs ({target.kind}, {target.hosts} node"
                 f"{'s' if target.hosts > 1 else ''}, {_size(target.memory)} each)")
        if target.slices > 1:
            where += (f" x {target.slices} slices over the data-centre network "
                      f"({target.chips} chips in all)")
    by = "by the TPU compiler (libtpu) on this CPU" if p.compiler == "TPU" else "by XLA:CPU"
    return (f"memory plan: {config_name} on {where}, global batch {p.global_batch} "
            f"({per_device} per device{micro}); compiled in {p.compile_s:.0f} s {by}")


def report(p: Plan, config_name: str, chips: Mapping[str, int] = CHIPS) -> str:
    """The plan as a table: bytes per device, and which chips it fits (at most
    :data:`HEADROOM` of their memory)."""
    lines = [headline(p, config_name), "", *memory_lines(p), ""]
    for chip, size in chips.items():
        verdict = "fits" if p.fits(size) else "does NOT fit"
        lines.append(f"  {chip:10s} {size / GiB:5.0f} GiB: {verdict} "
                     f"({100 * p.total / size:.0f}% of its memory)")
    lines.append("")
    lines.append(caveat(p))
    return "\n".join(lines)


_CAVEAT = ("The temporaries are XLA:CPU's compile of the same partitioned step: the TPU/GPU "
           "compilers fuse and lay out differently, so treat them as an estimate and keep "
           f"headroom (a chip 'fits' at <= {HEADROOM:.0%} of its memory).")
_TPU_CAVEAT = ("The memory is the TPU compiler's (libtpu, the compiler a TPU runs) for this "
               "slice's chips, compiled on this CPU: the program's own buffers, tiled as on the "
               "chip; the runtime's own allocations are not in it, so a chip 'fits' at <= "
               f"{HEADROOM:.0%} of the memory the compiler says is usable.")


def caveat(p: Plan) -> str:
    """How far to trust the plan's memory: the compiler that gave it."""
    return _TPU_CAVEAT if p.compiler == "TPU" else _CAVEAT


# Examples per CPU-second of the ``image`` preprocessing's training input, ImageNet-size JPEGs
# at 224 (experiments/results/image_input_views.md, "examples/s per core", 2 shared cores of
# the 2026-12-07 machine): decode + two random resized crops (views = 2, bilinear: the SimCLR
# family's input, (a)), decode + one crop, and decode + shorter side 256 + centre crop ((b)).
TWO_VIEW_EXAMPLES_PER_CORE_SECOND = 534.6
ONE_VIEW_EXAMPLES_PER_CORE_SECOND = 718.6
CENTRE_256_EXAMPLES_PER_CORE_SECOND = 593.3
_CLIP_TABLE = "experiments/results/image_input_bench.md"
_STREAM_TABLE = "experiments/results/image_input_stream.md"  # the stream beside array_record
_VIEWS_TABLE = "experiments/results/image_input_views.md"


@dataclasses.dataclass(frozen=True)
class HostInput:
    """What one training example costs the input workers: examples per core-second, and the
    host work and table that rate comes from."""

    examples_per_core_s: float
    work: str


def host_input(config, images: bool = True) -> HostInput | None:
    """The host work per training example of ``config`` and its measured rate.

    ``data.preprocess.name = "image"`` (the SimCLR family, ImageNet-size JPEGs): with
    ``crop = "random"``, a decode and ``views`` random resized crops, at ``1 / r = d + v c``
    per example, ``d`` and ``c`` (a decode, a crop) solved from the measured one- and two-view
    rates (so ``views`` = 1 and 2 are those rows); with ``crop = "center"``, a decode, resize
    and centre crop. ``"image_text"``: one decode and crop (:data:`IMAGES_PER_CORE_SECOND`,
    the pod template's table; from a stream of shards, that rate times the stream's measured
    ratio to it, :data:`STREAM_RELATIVE_RATE`, for tars on ``gs://`` or local ones); another
    image input (``images``) counts at that rate too;
    ``None`` without images.
    """
    preprocess = dict((config.get("data") or {}).get("preprocess") or {})
    name = preprocess.get("name", "standard")
    size = preprocess.get("image_size", 224)
    if name == "image" and preprocess.get("crop", "center") == "random":
        views = int(preprocess.get("views", 1))
        crop = 1 / TWO_VIEW_EXAMPLES_PER_CORE_SECOND - 1 / ONE_VIEW_EXAMPLES_PER_CORE_SECOND
        decode = 1 / ONE_VIEW_EXAMPLES_PER_CORE_SECOND - crop
        rate = 1 / (decode + views * crop)
        return HostInput(rate, f"decode + {views} random resized crop{'s' * (views > 1)} at "
                               f"{size}: {_VIEWS_TABLE}")
    if name == "image":
        return HostInput(CENTRE_256_EXAMPLES_PER_CORE_SECOND,
                         f"decode + resize + centre crop at {size}: {_VIEWS_TABLE}")
    data = config.get("data") or {}
    if data.get("source", "tfds") == "shards" and (name == "image_text" or images):
        where = "gs" if "gs://" in str(data.get("shards", "")) else "local"
        ratio = STREAM_RELATIVE_RATE[where]
        return HostInput(IMAGES_PER_CORE_SECOND * ratio,
                         f"decode + 1 crop, streamed from {'gs://' if where == 'gs' else 'local'}"
                         f" tars ({ratio:.2f}x the prepared data's rate): {_STREAM_TABLE}")
    if name == "image_text" or images:
        return HostInput(IMAGES_PER_CORE_SECOND, f"decode + 1 crop: {_CLIP_TABLE}")
    return None


@dataclasses.dataclass
class Speed:
    """The step's time and input rate on a target at a stated model-FLOPs utilisation."""

    flops_per_chip: float
    mfu: float
    step_s: float | None  # None when the target's peak is unknown
    examples_per_s_per_host: float | None
    host_cores: float | None  # for an image input, at the host input's rate
    host_examples_per_core_s: float | None = None
    host_work: str | None = None

    @classmethod
    def of(cls, p: Plan, flops: float, target: Target, mfu: float,
           images: bool | HostInput | None) -> Speed:
        """``images``: the host input (:func:`host_input`); ``True`` is one decode and crop
        per example (:data:`IMAGES_PER_CORE_SECOND`), ``False`` / ``None`` no image input."""
        if images is True:
            images = HostInput(IMAGES_PER_CORE_SECOND, f"decode + 1 crop: {_CLIP_TABLE}")
        host = images or None
        if target.peak_flops is None:
            return cls(flops, mfu, None, None, None)
        step_s = flops / (mfu * target.peak_flops)
        per_host = p.global_batch / step_s / target.hosts
        if host is None:
            return cls(flops, mfu, step_s, per_host, None)
        return cls(flops, mfu, step_s, per_host, per_host / host.examples_per_core_s,
                   host.examples_per_core_s, host.work)


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
    with activity("counting the step's model FLOPs (a compile)"):
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


def remat_check(config, mesh, budget: float, flops_mesh=None,
                compile_plan=None) -> RematCheck:
    """Compile ``config`` without remat (on ``mesh``: fake CPU devices or a TPU slice's;
    ``compile_plan(config, mesh)``, default :func:`plan` of :func:`planned`) and count its FLOPs
    with and without it (on ``flops_mesh``, CPU devices; default ``mesh``)."""
    if compile_plan is None:
        def compile_plan(c, m):
            return plan(planned(c, m), status=sys.stderr)
    without = compile_plan(with_overrides(config, {"model.remat": False}), mesh)
    flops_mesh = mesh if flops_mesh is None else flops_mesh
    return RematCheck(without.total, without.total <= budget, per_chip_flops(config, flops_mesh),
                      per_chip_flops(config, flops_mesh, keep_remat=True))


def remat_lines(check: RematCheck, usable: int) -> list[str]:
    """What the plan without remat says: the bytes, the verdict, the FLOPs remat costs."""
    verdict = ("it fits without remat too: drop it to save the recomputation "
               "(--config.model.remat=False)" if check.fits_without else
               "it does not fit without remat as it is: keep it, or see --choose (unrolled "
               "towers or more micro-batches may fit without it)")
    lines = ["", "remat (model.remat):",
             f"  without remat the step needs {_size(check.total_without)} per chip "
             f"({100 * check.total_without / usable:.0f}% of the usable memory): {verdict}"]
    if check.extra is not None:
        lines.append(f"  remat's recomputation: {check.flops_with_remat_per_chip / 1e12:.2f} "
                     f"TFLOP per chip per step against the model's "
                     f"{check.model_flops_per_chip / 1e12:.2f} (+{100 * check.extra:.0f}%)")
    return lines


def usable_bytes(p: Plan, target: Target) -> int:
    """A chip's memory the plan compares with: what the TPU compiler says is usable, else the
    target's (:attr:`~contrastive_jax.accelerators.Target.usable`)."""
    return p.usable if p.compiler == "TPU" and p.usable else target.usable


def target_report(p: Plan, config_name: str, target: Target, search: Search | None,
                  speed: Speed | None, remat: RematCheck | None = None,
                  others: Sequence[Plan] = ()) -> str:
    """The plan against one target: the bytes (beside ``others``: the same step by the other
    compiler), the verdict (with the search when it did not fit), and the speed at the stated
    utilisation."""
    usable_b = usable_bytes(p, target)
    budget = HEADROOM * usable_b
    lines = [headline(p, config_name, target), "", *memory_lines([*others, p]), ""]
    usable = (f"{_size(target.usable)} usable = {target.usable_fraction:.0%} of "
              f"{_size(target.memory)} (JAX's GPU preallocation; XLA_CLIENT_MEM_FRACTION)"
              if target.usable_fraction < 1 else
              f"{_size(usable_b)} usable of {_size(target.memory)} (the TPU compiler's figure)"
              if usable_b != target.memory else _size(target.memory))
    fits = p.total <= budget
    lines.append(f"  {'fits' if fits else 'does NOT fit'}: {_size(p.total)} of {usable} "
                 f"({100 * p.total / usable_b:.0f}%; the plan asks <= {HEADROOM:.0%})")
    for other in others:
        verdict = "fits" if other.total <= budget else "does NOT fit"
        lines.append(f"  {other.compiler} says {_size(other.total)} ({verdict}; "
                     f"{other.total / max(p.total, 1):.2f}x the TPU compiler's)")
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
                             f"per host (at {speed.host_examples_per_core_s:.1f} examples per "
                             f"core-second, {speed.host_work})")
        lines += roofline_lines(p, target)
    if remat is not None:
        lines += remat_lines(remat, usable_b)
    lines += ["", caveat(p)]
    return "\n".join(lines)


def roofline_s(p: Plan, target: Target) -> float | None:
    """The step's roofline time on a chip of ``target`` from the TPU compiler's cost analysis
    (:meth:`~contrastive_jax.plan.tpu_compiler.Cost.roofline_s`): ``None`` without the
    analysis, for a GPU target, or for a step with loops."""
    from contrastive_jax.accelerators import TPUS

    if p.cost is None or target.generation is None:
        return None
    gen = TPUS[target.generation]
    return p.cost.roofline_s(gen.peak_bf16, gen.hbm_bandwidth)


def roofline_lines(p: Plan, target: Target) -> list[str]:
    """The TPU compiler's cost analysis of the step, and a roofline time where it is sound
    (a program without loops: :func:`roofline_s`)."""
    from contrastive_jax.accelerators import TPUS

    if p.cost is None or target.generation is None:
        return []
    gen = TPUS[target.generation]
    lines = [f"  TPU compiler's cost analysis {p.cost.flops / 1e12:.2f} TFLOP, "
             f"{p.cost.bytes_accessed / 1e9:.2f} GB of HBM accessed per chip"]
    roofline = roofline_s(p, target)
    if roofline is None:
        lines.append("  (the step has loops: a scanned tower, accumulation or a tiled loss, "
                     "whose bodies the analysis counts once, so no step time from it; the time "
                     "above is at the stated utilisation)")
    else:
        lines.append(f"  roofline (no step is faster) {roofline * 1e3:.3f} ms = max(FLOPs / "
                     f"{gen.peak_bf16 / 1e12:.0f} TFLOP/s, bytes / {gen.hbm_bandwidth / 1e9:.0f}"
                     " GB/s)")
    return lines
