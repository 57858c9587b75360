"""Memory plan before launch: will this config fit on that pod?

    python -m contrastive_jax.plan --config=configs/clip_vit_b16_pod.py --devices=256

compiles the config's train step ahead of time on ``--devices`` fake CPU devices, with abstract
inputs (no parameter is initialised, no data is read), and prints what one device holds:
parameters, optimiser state, the other state (BatchNorm statistics, MoCo's queue), the batch,
and the compiled step's temporaries; then, against named accelerators, whether that fits
(:data:`CHIPS`). The state bytes follow exactly from the shapes and ``config.sharding``
(:mod:`contrastive_jax.training.step.state_sharding`); the temporaries are XLA:CPU's for the same
partitioned program, an approximation of the accelerator's (the TPU and GPU compilers fuse,
lay out and rematerialise differently, and bf16 may be emulated on CPU), so leave headroom.
The step is compiled with :data:`~contrastive_jax.training.models.remat.CPU_COMPILER_OPTIONS`,
which keeps rematerialisation as the accelerators do (XLA:CPU would otherwise undo it).

Exit status 2 with one line ``error: ...`` for a config that cannot be compiled (a batch that
does not divide over the devices, an unknown setting), as the trainer would say at start.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Mapping, Sequence

from absl import app, flags, logging

from contrastive_jax.errors import ConfigError, ContrastiveJaxError

GiB = 2**30
# accelerator memory per chip (HBM), bytes
CHIPS = {"TPU v4": 32 * GiB, "TPU v5e": 16 * GiB, "TPU v5p": 95 * GiB, "TPU v6e": 32 * GiB,
         "A100 80GB": 80 * GiB, "H100": 80 * GiB}
HEADROOM = 0.9  # a plan fits a chip when it needs at most this fraction of its memory


@dataclasses.dataclass
class Plan:
    """Bytes per device of one train step (see :func:`plan`)."""

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

    @property
    def total(self) -> int:
        """Peak estimate: the step's inputs, its new outputs and its temporaries."""
        return self.arguments + self.outputs_not_aliased + self.temporaries

    def fits(self, chip_bytes: int) -> bool:
        return self.total <= HEADROOM * chip_bytes


def example_shapes(config) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{feature: (per-example shape, dtype)}`` of a training batch, from the model config.

    The sample encoder's input (``config.input_key``): ViT ``(image_size, image_size,
    in_channels)``, signal CNN ``(length, in_channels)``, MLP ``(in_features,)``; ResNet needs
    ``data.preprocess.image_size``. Dual encoders add ``text_key``: ``(max_tokens,)`` int32.
    A ``loss.positive_ids`` feature is ``()`` int32.
    """
    model = config.model
    encoder = model.get("sample_encoder") or model.get("encoder")
    name = encoder["name"]
    if name == "vit":
        shape = (encoder["image_size"], encoder["image_size"], encoder.get("in_channels", 3))
    elif name == "signal_cnn":
        shape = (encoder["length"], encoder.get("in_channels", 1))
    elif name == "mlp":
        shape = (encoder["in_features"],)
    elif name == "resnet":
        size = config.data.get("preprocess", {}).get("image_size")
        if not size:
            raise ConfigError("the plan needs the ResNet's input size: set "
                              "data.preprocess.image_size")
        shape = (size, size, encoder.get("in_channels", 3))
    else:
        raise ConfigError(f"the plan does not know the input of encoder {name!r}")
    shapes = {config.input_key: (shape, "float32")}
    if model.get("name") == "dual_encoder":
        shapes[config.get("text_key", "caption")] = ((model.text_encoder["max_tokens"],),
                                                     "int32")
    if config.loss.get("positive_ids"):
        shapes[config.loss.positive_ids] = ((), "int32")
    return shapes


def plan(config, mesh) -> Plan:
    """Compile ``config``'s train step on ``mesh`` with abstract inputs; the bytes per device.

    The state is built with ``jax.eval_shape`` (shapes only) and placed by ``config.sharding``;
    the batch is ``data.batch_size`` rows of :func:`example_shapes` split over ``data``.
    Settings the trainer refuses at start are a :class:`ConfigError` here too.
    """
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from contrastive_jax.mesh import DATA_AXIS
    from contrastive_jax.training.methods import method_for
    from contrastive_jax.training.models.remat import CPU_COMPILER_OPTIONS
    from contrastive_jax.training.step.state_sharding import bytes_per_device, state_shardings
    from contrastive_jax.training.step.train_state import create_state
    from contrastive_jax.training.step.train_step import compiled_step
    from contrastive_jax.training.train import check_batch

    method = method_for(config)
    accumulation = check_batch(config, mesh)
    steps = int(config.get("total_steps") or 1000)  # the schedule does not change memory
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
    start = time.perf_counter()
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
        compile_s=seconds)


def report(p: Plan, config_name: str, chips: Mapping[str, int] = CHIPS) -> str:
    """The plan as a table: bytes per device, and which chips it fits (at most
    :data:`HEADROOM` of their memory)."""
    def gib(n: int) -> str:
        return f"{n / GiB:8.2f} GiB" if n >= GiB / 10 else f"{n / 2**20:8.2f} MiB"

    per_device = p.global_batch // p.devices
    micro = (f", {p.accumulation_steps} micro-batches of {per_device // p.accumulation_steps}"
             if p.accumulation_steps > 1 else "")
    lines = [f"memory plan: {config_name} on {p.devices} devices, global batch "
             f"{p.global_batch} ({per_device} per device{micro}); compiled in "
             f"{p.compile_s:.0f} s on CPU",
             "",
             "per device                     ",
             f"  parameters                   {gib(p.params)}",
             f"  optimiser state              {gib(p.opt_state)}",
             f"  other state (BN, queue, ...) {gib(p.other_state)}",
             f"  batch                        {gib(p.batch)}",
             f"  step temporaries (XLA:CPU)   {gib(p.temporaries)}",
             f"  total (inputs + new outputs + temporaries) {gib(p.total).strip()}",
             ""]
    for chip, size in chips.items():
        verdict = "fits" if p.fits(size) else "does NOT fit"
        lines.append(f"  {chip:10s} {size / GiB:5.0f} GiB: {verdict} "
                     f"({100 * p.total / size:.0f}% of its memory)")
    lines.append("")
    lines.append("The temporaries are XLA:CPU's compile of the same partitioned step: the TPU/GPU "
                 "compilers fuse and lay out differently, so treat them as an estimate and keep "
                 f"headroom (a chip 'fits' at <= {HEADROOM:.0%} of its memory).")
    return "\n".join(lines)


_DEVICES = flags.DEFINE_integer("devices", 8, "Fake CPU devices to plan for (the pod's chips).")
_JSON = flags.DEFINE_string("json", "", "Also write the plan (bytes per device) to this JSON file.")
_CHIPS = flags.DEFINE_list("chips", [], f"Chips to compare with (default: {', '.join(CHIPS)}).")


def main(argv: Sequence[str]) -> None:
    """Plan ``--config`` on ``--devices`` fake CPU devices and print the table."""
    if len(argv) > 1:
        raise ConfigError(f"unexpected arguments: {list(argv[1:])}")
    import jax

    if _DEVICES.value < 1:
        raise ConfigError(f"--devices must be >= 1; got {_DEVICES.value}")
    if not flags.FLAGS["verbosity"].present:  # optax and orbax log at INFO
        logging.set_verbosity(logging.WARNING)
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", _DEVICES.value)
    from contrastive_jax.main import load_config
    from contrastive_jax.mesh import make_mesh

    config = load_config()
    chips = {c: CHIPS[c] for c in _CHIPS.value if c in CHIPS} if _CHIPS.value else CHIPS
    unknown = [c for c in _CHIPS.value if c not in CHIPS]
    if unknown:
        raise ConfigError(f"unknown chips {unknown}; known: {sorted(CHIPS)}")
    mesh = make_mesh(dict(config.get("mesh", {"data": -1})))
    name = flags.FLAGS["config"].serialize().partition("=")[2]
    result = plan(config, mesh)
    print(report(result, name, chips))
    if _JSON.value:
        from contrastive_jax.training.run.workdir import json_output

        json_output.write_atomic(_JSON.value, {
            **dataclasses.asdict(result), "total": result.total,
            "fits": {chip: result.fits(size) for chip, size in chips.items()}})


def run() -> None:
    """``app.run(main)``; the project's errors as ``error: ...`` and exit status 2."""
    from contrastive_jax.main import parse_flags  # defines --config

    flags.mark_flags_as_required(["config"])
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    try:
        app.run(main, flags_parser=parse_flags)
    except ContrastiveJaxError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    run()

