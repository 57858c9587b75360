"""Memory and speed plan before launch: will this config fit on that pod, and how fast?

    python -m contrastive_jax.plan --config=configs/clip_vit_b16_pod.py --slice=v4-256
    python -m contrastive_jax.plan --config=configs/clip_vit_b16_pod.py --slice=v5e-256 --choose
    python -m contrastive_jax.plan --config=configs/clip_vit_b16_pod.py --gpus=4x8:h100
    python -m contrastive_jax.plan --config=configs/clip_vit_b16_pod.py --devices=128

turns the target into chips, hosts and memory per chip (:mod:`contrastive_jax.accelerators`:
TPU v4 and v5p slice names count TensorCores, ``v4-256`` is 128 chips; ``--slices=N``: N such
slices joined over the data-centre network), compiles the config's train step ahead of time
with abstract inputs (no parameter is initialised, no data is read), and prints what one chip
holds: parameters, optimiser state, the other state (BatchNorm statistics, MoCo's queue), the
batch, and the compiled step's temporaries; whether that fits with at least 10% headroom; the
step's FLOPs per chip, its time at a stated model-FLOPs utilisation (``--mfu``), the examples
per second each host must deliver and the host CPU cores that takes for an image-text input.

Which compiler (``--compiler``). For a TPU slice with libtpu installed (``pip install
"jax[tpu]==<the installed jax>"``, about 700 MB; the test extra has it) the default is the TPU
compiler itself, run on this CPU for the slice's own devices
(:mod:`contrastive_jax.plan.tpu_compiler`): its arguments in the chip's tiled layouts, its
temporaries and generated code, against the memory it says a chip has (30.75 GiB of a v4's 32);
a step it refuses for memory is reported as not fitting with its figure. ``--compiler=cpu``
(the default for GPUs, fake CPU devices, or without libtpu) compiles on as many fake CPU devices
as the target has chips with XLA:CPU, whose temporaries approximate the accelerator's (about 2x
the TPU compiler's on the pod template: docs/benchmarks.md); it is compiled with
:data:`~contrastive_jax.training.models.remat.CPU_COMPILER_OPTIONS`, which keeps
rematerialisation as the accelerators do. ``--compiler=both`` prints the two side by side (the
TPU compiler's is the verdict). On a GPU target the usable memory is the fraction JAX
preallocates (75% unless ``XLA_CLIENT_MEM_FRACTION`` says otherwise).

When the config does not fit, the plan searches: it compiles candidates to find the smallest
``accumulation_steps`` that fits (the divisors of the per-chip batch, starting from the one the
first plan predicts: usually two compiles), then, if even one example per micro-batch does not
fit, the same with FSDP and with remat, and prints the ``--config...`` overrides to paste.
``--choose`` ranks every combination of remat (off, a policy that saves the matmuls, full),
scanned or unrolled towers, replicated or FSDP parameters and, with
``--allow_patch_dropout=P``, patch dropout, each at the smallest accumulation that fits, by the
FLOPs the chips execute (:mod:`contrastive_jax.plan.choice`), and prints the best as overrides.
Each program is compiled once per command. A status line on stderr says what is compiling and
for how long (the pod template for 128 chips: about 40 s with XLA:CPU, 100-400 s with the TPU
compiler, on 2 cores).

The state bytes follow exactly from the shapes and ``config.sharding``
(:mod:`contrastive_jax.training.step.state_sharding`). The speed section's FLOPs are the step's
model FLOPs per chip: XLA's count of the step without remat, accumulation, scanned layers or
tiled losses (:mod:`contrastive_jax.training.step.model_flops`, always on CPU devices; a
compiled program counts a loop's body once), divided by the chips, and the step time is those
at the stated model-FLOPs utilisation. With the TPU compiler the plan also prints its cost
analysis, and a roofline time (FLOPs at peak against bytes at the HBM bandwidth) only for a step
without loops, where the analysis covers the whole step. Planned for a target, a config with
remat is also compiled without it: the plan says whether the step fits without remat and what
the recomputation costs, so that remat stays on only where it is needed.

``--json=PATH`` also writes the plan as JSON (bytes per device by each compiler, the target's
verdict, the search, the choice, the speed, the run's provenance), atomically: a temporary file
renamed over PATH. PATH is checked before anything is compiled: a folder, a path whose folder is
missing or is a file, a folder where no file can be created, an empty ``--json=`` are each an
error at once.

Exit status 2 with one line ``error: ...`` for what the user must change: a config that
cannot be compiled (a batch that does not divide over the devices, an unknown setting: as the
trainer would say at start), an unknown slice name, a topology the TPU compiler does not know,
``--compiler=tpu`` without libtpu (with the install line) or for a GPU or CPU target,
``--slices`` without ``--slice``, a GPU spec without memory, a batch that no candidate fits, an
unusable ``--json`` path, or a ``--json`` write that the system refused after the compile
(disk full, file-size limit: the tables are printed, PATH is left as it was). Exit status 130
with one line ``interrupted (SIGINT) while compiling ...: nothing more was written`` for
Ctrl-C, at once, during a compile too (:mod:`contrastive_jax.interrupts`).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import sys
from collections.abc import Callable, Sequence

from absl import flags, logging

from contrastive_jax.accelerators import Target, gpu_cluster, tpu_slice
from contrastive_jax.errors import STORAGE_ERRNOS, ConfigError, storage_cause
from contrastive_jax.plan import tpu_compiler
from contrastive_jax.plan.choice import Choice, choice_lines, choose, settings_key
from contrastive_jax.plan.report import (
    Speed,
    host_input,
    per_chip_flops,
    remat_check,
    report,
    roofline_s,
    target_report,
    usable_bytes,
    uses_remat,
)
from contrastive_jax.plan.search import find_fit, with_overrides
from contrastive_jax.plan.step_plan import (
    CHIPS,
    DEFAULT_MFU,
    HEADROOM,
    Plan,
    example_shapes,
    plan,
    planned,
)

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
_JSON = flags.DEFINE_string("json", "", "Also write the plan (bytes per device, verdict, speed) "
                            "to this JSON file, checked before anything is compiled.")
_CHIPS = flags.DEFINE_list("chips", [], f"Chips to compare with (default: {', '.join(CHIPS)}).")
_COMPILER = flags.DEFINE_enum(
    "compiler", "auto", ["auto", "tpu", "cpu", "both"],
    "Which compiler plans the step: tpu (libtpu's TPU compiler, on this CPU; a --slice only), "
    "cpu (XLA:CPU on fake CPU devices), both (side by side), auto (tpu for a --slice when "
    "libtpu is installed, else cpu).")
_SLICES = flags.DEFINE_integer("slices", 1, "TPU slices joined over the data-centre network "
                               "(multi-slice): the mesh spans all their chips.")
_CHOOSE = flags.DEFINE_bool("choose", False, "Rank the settings that fit (remat, scanned "
                            "towers, FSDP, accumulation, --allow_patch_dropout) by the FLOPs "
                            "the chips execute and print the best as --config overrides.")
_ALLOW_PATCH_DROPOUT = flags.DEFINE_float(
    "allow_patch_dropout", None, "With --choose: a patch dropout the search may add to the "
    "image tower (it changes the model's training: FLIP).")


def target_from_flags() -> Target | None:
    """The ``--slice`` (``--slices`` of it) or ``--gpus`` target (at most one), checked
    against ``--devices``."""
    if _SLICE.value and _GPUS.value:
        raise ConfigError("give --slice or --gpus, not both")
    if _SLICES.value != 1 and not _SLICE.value:
        raise ConfigError(f"--slices={_SLICES.value} joins TPU slices: give --slice=... too "
                          "(a GPU cluster's nodes are --gpus=NODESxGPUS)")
    target = (tpu_slice(_SLICE.value, _SLICES.value) if _SLICE.value else
              gpu_cluster(_GPUS.value) if _GPUS.value else None)
    if target is not None and _DEVICES.value is not None and _DEVICES.value != target.chips:
        raise ConfigError(f"--devices={_DEVICES.value} but {target.name} has {target.chips} "
                          "chips; drop --devices")
    if not 0 < _MFU.value <= 1:
        raise ConfigError(f"--mfu must be a fraction in (0, 1]; got {_MFU.value}")
    return target


def compilers_from_flags(target: Target | None) -> tuple[str, ...]:
    """The compilers that plan the step, in the report's order (the last one's plan is the
    verdict): ``("cpu",)``, ``("tpu",)`` or ``("cpu", "tpu")``. ``--compiler=tpu``/``both``
    without a TPU slice, or without libtpu installed, is a :class:`ConfigError`."""
    choice = _COMPILER.value
    tpu = target is not None and target.generation is not None
    if choice in ("tpu", "both"):
        if not tpu:
            what = "a GPU cluster" if target is not None else "fake CPU devices"
            raise ConfigError(f"--compiler={choice} compiles for a TPU slice, not {what}: "
                              "give --slice=... or use --compiler=cpu")
        tpu_compiler.require()
        return ("cpu", "tpu") if choice == "both" else ("tpu",)
    if choice == "auto" and tpu:
        if tpu_compiler.available():
            return ("tpu",)
        print(f"plan: libtpu (the TPU compiler) is not installed, so XLA:CPU estimates the "
              f"memory; for the TPU compiler's own numbers: {tpu_compiler.install_line()}",
              file=sys.stderr)
    return ("cpu",)


def json_path_from_flags() -> str:
    """``--json``, checked before any work (:func:`~contrastive_jax.training.run.workdir.
    json_output.unwritable`); "" when not given. An empty ``--json=`` or a path the plan
    could not write is a :class:`ConfigError` saying what to change."""
    from contrastive_jax.training.run.workdir import json_output

    path = _JSON.value
    if not path.strip():
        if flags.FLAGS["json"].present:
            raise ConfigError("--json is empty; give the file to write the plan to, or leave "
                              "--json out")
        return ""
    problem = json_output.unwritable(path)
    if problem is not None:
        raise ConfigError(f"--json={path}: {problem}")
    return path


# what to do when the --json write is refused for one of these (the others: another path)
_WRITE_FIXES = {e: STORAGE_ERRNOS[e] for e in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)}


def write_json(path: str, record: dict) -> None:
    """Write ``record`` to ``path`` (:func:`~contrastive_jax.training.run.workdir.json_output.
    write_atomic`); a write the system refuses (disk full, file-size limit, ...) is a
    :class:`ConfigError` naming the reason and the fix, ``path`` left as it was."""
    from contrastive_jax.training.run.workdir import json_output

    try:
        json_output.write_atomic(path, record)
    except OSError as err:
        cause = storage_cause(err) or err
        reason = cause.strerror or str(cause)
        fix = _WRITE_FIXES.get(cause.errno, "choose another --json path")
        raise ConfigError(f"--json={path}: the plan could not be written ({reason}: {fix}); "
                          "the tables above are complete, and the file was left as it "
                          "was") from err


def _plan(argv: Sequence[str]) -> None:
    """Plan ``--config`` for ``--slice``/``--gpus`` (or on ``--devices`` fake CPU devices) and
    print the tables."""
    import jax

    json_path = json_path_from_flags()  # before any work: not found after a long compile
    target = target_from_flags()
    compilers = compilers_from_flags(target)
    if _CHOOSE.value and target is None:
        raise ConfigError("--choose ranks settings for a target: give --slice=... or --gpus=...")
    if _ALLOW_PATCH_DROPOUT.value is not None and not _CHOOSE.value:
        raise ConfigError("--allow_patch_dropout is a choice for --choose; add --choose")
    if _ALLOW_PATCH_DROPOUT.value is not None and not 0 <= _ALLOW_PATCH_DROPOUT.value < 1:
        raise ConfigError(f"--allow_patch_dropout is the fraction of image patches dropped, in "
                          f"[0, 1); got {_ALLOW_PATCH_DROPOUT.value}")
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
    axes = dict(config.get("mesh", {"data": -1}))
    cpu_mesh = make_mesh(axes)  # XLA:CPU's, and the model-FLOPs count's
    meshes = {"cpu": cpu_mesh}
    if "tpu" in compilers:
        meshes["tpu"] = make_mesh(axes, devices=tpu_compiler.topology_devices(target))
    name = flags.FLAGS["config"].serialize().partition("=")[2]
    compile_plan = plan_cache()
    plans = {c: compile_plan(config, meshes[c]) for c in compilers}
    result = plans[compilers[-1]]
    record = {**dataclasses.asdict(result), "total": result.total, "compiler": result.compiler,
              "compilers": {plans[c].compiler: {**dataclasses.asdict(plans[c]),
                                                "total": plans[c].total} for c in compilers}}
    if target is None:
        print(report(result, name, chips))
        record["fits"] = {chip: result.fits(size) for chip, size in chips.items()}
    else:
        record.update(target_plan(config, meshes[compilers[-1]], result, name, target,
                                  _MFU.value, _SEARCH.value, cpu_mesh,
                                  [plans[c] for c in compilers[:-1]], compile_plan))
        if _CHOOSE.value:
            ranked = choose_settings(config, meshes[compilers[-1]], cpu_mesh, result, target,
                                     _ALLOW_PATCH_DROPOUT.value, compile_plan)
            record["choice"] = ranked.record()
    if json_path:
        from contrastive_jax.training.run.provenance import provenance

        write_json(json_path, {**record, "provenance": provenance()})
    if target is not None and record["fits_target"] is False and _SEARCH.value and \
            record["search"]["answer"] is None:
        raise ConfigError(f"{name} does not fit {target.name} even with one example per "
                          "micro-batch, FSDP and remat; use a larger slice (more chips) or a "
                          "smaller data.batch_size")


def plan_cache() -> Callable[[object, object], Plan]:
    """``compile_plan(config, mesh)``: :func:`plan` of :func:`planned` with the status line,
    each program compiled once per command (the search, the remat check and ``--choose`` ask
    for some of the same configs; they differ from the command's config only in the settings
    :func:`~contrastive_jax.plan.choice.settings_key` names)."""
    plans: dict[tuple, Plan] = {}

    def compile_plan(config, mesh) -> Plan:
        key = (settings_key(config), id(mesh))
        if key not in plans:
            plans[key] = plan(planned(config, mesh), status=sys.stderr)
        return plans[key]

    return compile_plan


def target_plan(config, mesh, result: Plan, name: str, target: Target, mfu: float,
                search: bool, flops_mesh=None, others: Sequence[Plan] = (),
                compile_plan: Callable[[object, object], Plan] | None = None) -> dict:
    """Print the plan against ``target`` (searching for a fit on ``mesh`` when it does not fit
    and ``search``; model FLOPs counted on ``flops_mesh``, CPU devices, default ``mesh``;
    ``others``: the step by the other compiler, shown beside; ``compile_plan``: a
    :func:`plan_cache`'s); the JSON record's target fields."""
    flops_mesh = mesh if flops_mesh is None else flops_mesh
    compile_plan = compile_plan or plan_cache()
    usable = usable_bytes(result, target)
    budget = HEADROOM * usable
    fits = result.total <= budget
    found = find_fit(config, mesh, budget, result, compile_plan) if not fits and search else None
    final = (found.answer if found is not None and found.answer is not None else {})
    chosen = with_overrides(config, final) if final else config
    flops = per_chip_flops(chosen, flops_mesh)
    images = any(len(shape) >= 3 for shape, _ in example_shapes(config).values())
    speed = Speed.of(result, flops, target, mfu, host_input(config, images)) if flops else None
    remat = (remat_check(chosen, mesh, budget, flops_mesh, compile_plan) if uses_remat(chosen)
             else None)
    print(target_report(result, name, target, found, speed, remat, others))
    return {"target": dataclasses.asdict(target), "usable_bytes": usable,
            "roofline_s": roofline_s(result, target),
            "fits_target": fits,
            "remat": None if remat is None else dataclasses.asdict(remat),
            "search": None if found is None else {
                "tried": [{"overrides": o, "total": r.total, "temporaries": r.temporaries}
                          for o, r in found.tried],
                "answer": found.answer},
            "speed": None if speed is None else dataclasses.asdict(speed)}


def choose_settings(config, mesh, flops_mesh, result: Plan, target: Target,
                    allow_patch_dropout: float | None,
                    compile_plan: Callable[[object, object], Plan] | None = None) -> Choice:
    """Rank the settings for ``target`` (:func:`contrastive_jax.plan.choice.choose`): memory
    compiled on ``mesh`` (``compile_plan``: a :func:`plan_cache`'s), executed FLOPs counted on
    ``flops_mesh``; print the table."""
    compile_plan = compile_plan or plan_cache()
    budget = HEADROOM * usable_bytes(result, target)
    ranked = choose(config, result.global_batch // result.devices, budget,
                    lambda c: per_chip_flops(c, flops_mesh, keep_remat=True),
                    lambda c: compile_plan(c, mesh), allow_patch_dropout, known=result,
                    devices=result.devices)
    print("\n".join(choice_lines(ranked)))
    return ranked


def main(argv: Sequence[str] | None = None) -> None:
    """The command line (``argv``: its arguments, ``sys.argv[1:]`` when None) through
    :func:`contrastive_jax.command_line.run_command`: help with the config files, ``--jax_*`` flags,
    the project's errors as ``error: ...`` and exit status 2."""
    from contrastive_jax import command_line
    from contrastive_jax.main import parse_trainer_flags  # defines --config

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    names = ("config", *(f.name for f in (_DEVICES, _SLICE, _SLICES, _GPUS, _COMPILER, _MFU,
                                          _SEARCH, _CHOOSE, _ALLOW_PATCH_DROPOUT, _JSON,
                                          _CHIPS)))
    sys.exit(command_line.run_command(command_line.Command(
        program="python -m contrastive_jax.plan", doc=__doc__, flag_names=names,
        required=("config",), parse=parse_trainer_flags, configs=True), _plan, argv))

