"""The TPU compiler on a CPU host: a slice's devices, its usable memory, a compile's bytes, and
a compile refused for memory read as a figure.

``pip install "jax[tpu]==<the installed jax>"`` brings libtpu, whose compiler runs without a
TPU: ``jax.experimental.topologies.get_topology_desc(platform="tpu", ...)`` describes the
devices of a slice that is not here, and a program lowered with shardings on a mesh of them
compiles as it would on the slice (MaxText's ``train_compile.py`` checks a config's memory this
way). The plan (:mod:`contrastive_jax.plan.step_plan`) compiles the trainer's step so, and
reads the compiler's own numbers: arguments, outputs, temporaries, generated code, and the
memory it says a chip has for them (:func:`usable_hbm`: 30.75 GiB of a v4's 32, 15.75 of a
v5e's 16, 95.74 of a v5p's 95, 31.25 of a v6e's 32, libtpu 0.0.42). A program that does not
fit is refused (``RESOURCE_EXHAUSTED: ... HLO temporaries (52.82G) exceeds available HBM
(30.75G)``): :func:`compile_or_refusal` returns the refusal's figures instead of raising, so
the plan reports "does not fit" with the compiler's number and its search can go on.

The compiler's cost analysis (``flops``, ``bytes accessed``, ``optimal_seconds``) counts a
loop's body once, like XLA:CPU's: :func:`cost_of` says whether the program has loops
(a scanned tower, accumulation), where its totals are not the step's.

libtpu is about 700 MB installed; the trainer does not need it (the test extra installs it).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import re
from typing import Any

from contrastive_jax.accelerators import Target, TpuTopology, tpu_topology
from contrastive_jax.errors import ConfigError

# libtpu's environment on a host without a TPU: several processes may load it at once (pytest
# -n 2; it takes a lockfile otherwise), and no worker hostnames or accelerator type to look up
# (unset, libtpu prints warnings about both)
LIBTPU_ENVIRONMENT = {"ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "TPU_WORKER_HOSTNAMES": "localhost",
                      "TPU_ACCELERATOR_TYPE": "v4-8", "TPU_SKIP_MDS_QUERY": "1"}
_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_SIZE = r"(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?"


def install_line() -> str:
    """The pip command that brings libtpu for the installed JAX."""
    import jax

    return f'pip install "jax[tpu]=={jax.__version__}"'


def available() -> bool:
    """Whether libtpu (the TPU compiler) is installed."""
    return importlib.util.find_spec("libtpu") is not None


def require() -> None:
    """A :class:`ConfigError` with the install line when libtpu is not installed."""
    if not available():
        raise ConfigError(f"--compiler=tpu needs libtpu, the TPU compiler (about 700 MB, not "
                          f"needed to train): {install_line()}; or plan with --compiler=cpu")


@functools.cache
def devices_of(topology: TpuTopology) -> tuple:
    """The JAX devices of ``topology`` as the TPU compiler describes them (cached); a
    topology libtpu does not know is a :class:`ConfigError`."""
    from jax.experimental import topologies

    require()
    for key, value in LIBTPU_ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    try:
        described = topologies.get_topology_desc(
            platform="tpu", topology_name=topology.name, chip_config_name=topology.chip_config,
            chips_per_host_bounds=topology.chips_per_host_bounds, num_slices=topology.slices)
    except Exception as err:  # libtpu's errors are JaxRuntimeError / RuntimeError
        raise ConfigError(f"the TPU compiler does not know the topology {topology.name} "
                          f"({topology.chip_config}, {topology.slices} slice(s)): "
                          f"{str(err).splitlines()[0]}; choose another --slice") from None
    return tuple(described.devices)


def topology_devices(target: Target) -> list:
    """The JAX devices of a TPU ``target`` (one per chip; slice-major over ``slices``), as the
    TPU compiler sees them: usable in a ``Mesh`` for ``lower(...).compile()``, not for
    running."""
    devices = list(devices_of(tpu_topology(target)))
    if len(devices) != target.chips:
        raise ConfigError(f"the TPU compiler gives {len(devices)} devices for {target.name}, "
                          f"not its {target.chips} chips")
    return devices


def size_in_bytes(number: str, unit: str) -> int:
    """``("30.75", "G")`` -> bytes (XLA writes sizes in powers of 1024)."""
    return int(float(number) * _UNITS[unit.upper()])


@dataclasses.dataclass(frozen=True)
class MemoryRefusal:
    """A compile the TPU compiler refused for memory: what it needed and what it has, per chip
    (``None`` where the message does not say)."""

    needed: int | None  # bytes: the HLO temporaries, or with ``whole`` everything "used"
    available: int | None  # bytes the compiler says a chip has for them
    message: str  # the compiler's first line
    whole: bool = False  # ``needed`` counts the arguments and outputs too


def memory_refusal(err: BaseException) -> MemoryRefusal | None:
    """The figures of a compile refused for memory (``RESOURCE_EXHAUSTED``), else ``None``."""
    text = str(err)
    if "RESOURCE_EXHAUSTED" not in text:
        return None
    line = next((ln for ln in text.splitlines() if "RESOURCE_EXHAUSTED" in ln), text)
    for pattern, whole in ((rf"temporaries \({_SIZE}\) exceeds available HBM \({_SIZE}\)", False),
                           (rf"Used {_SIZE} of {_SIZE} hbm", True)):
        match = re.search(pattern, text)
        if match:
            return MemoryRefusal(size_in_bytes(match[1], match[2]),
                                 size_in_bytes(match[3], match[4]), line.strip(), whole)
    return MemoryRefusal(None, None, line.strip())


def compile_or_refusal(lowered) -> Any:
    """``lowered.compile()`` by the TPU compiler, or the :class:`MemoryRefusal` when it
    refuses the program for memory (any other error propagates)."""
    try:
        return lowered.compile()
    except Exception as err:
        refused = memory_refusal(err)
        if refused is None:
            raise
        return refused


@functools.cache
def _usable(devices: tuple) -> int | None:
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    # a program whose temporaries (a 2^18 x 2^18 float32 matrix: 256 GiB) fit no chip
    mesh = Mesh(list(devices[:1]), ("one",))
    x = jax.ShapeDtypeStruct((2**18, 128), jnp.float32, sharding=NamedSharding(mesh, P()))
    result = compile_or_refusal(jax.jit(lambda a: jnp.sort(a @ a.T, axis=0) @ a).lower(x))
    return result.available if isinstance(result, MemoryRefusal) else None


def usable_hbm(devices) -> int | None:
    """Bytes of a chip the TPU compiler lets a program use (its "available HBM"), read from
    its refusal of a program too large for any chip; ``None`` if it does not say."""
    return _usable(tuple(devices))


def laid_out_bytes(shape: tuple[int, ...], bits: int, layout) -> int:
    """Bytes of one array of ``shape`` (elements of ``bits`` bits) in a TPU ``layout`` (a
    ``jax`` ``Layout``: ``major_to_minor`` order and ``tiling``): the dimensions in memory order
    with the minor ones padded to the first tile (``(8, 128)`` for most 2-D arrays, ``(128,)``
    for a vector or a scalar). The later tiles of a narrow type (``(2, 1)`` for bfloat16)
    divide the first and add nothing."""
    dims = [shape[i] for i in layout.major_to_minor] if layout.major_to_minor else []
    tile = tuple(layout.tiling[0]) if layout.tiling else ()
    dims = [1] * max(0, len(tile) - len(dims)) + dims
    for k, t in enumerate(tile):
        i = len(dims) - len(tile) + k
        dims[i] = -(-dims[i] // t) * t
    elements = 1
    for d in dims:
        elements *= d
    bits = layout.sub_byte_element_size_in_bits or bits
    return -(-elements * bits // 8)


def arguments_laid_out(compiled, arguments) -> int | None:
    """The bytes per chip of ``arguments`` (the abstract inputs ``compiled`` was lowered with,
    placed by their shardings) in the layouts the compiler chose (:func:`laid_out_bytes`);
    ``None`` when this JAX gives no layouts."""
    import jax
    import numpy as np

    try:
        formats = compiled.input_formats[0]
    except AttributeError:  # older JAX: input_layouts
        formats = getattr(compiled, "input_layouts", (None,))[0]
    leaves = jax.tree.leaves(arguments)
    layouts = jax.tree.leaves(formats)
    if formats is None or len(layouts) != len(leaves):
        return None
    total = 0
    for leaf, fmt in zip(leaves, layouts, strict=True):
        layout = getattr(fmt, "layout", fmt)
        shape = leaf.sharding.shard_shape(leaf.shape)
        total += laid_out_bytes(tuple(shape), np.dtype(leaf.dtype).itemsize * 8, layout)
    return total


@dataclasses.dataclass(frozen=True)
class Cost:
    """The TPU compiler's cost analysis of one step's program, per chip."""

    flops: float
    bytes_accessed: float
    optimal_seconds: float | None  # the compiler's own estimate (negative on most steps)
    loops: bool  # the program has while loops, whose bodies the totals count once

    def roofline_s(self, peak_flops: float, hbm_bandwidth: float) -> float | None:
        """``max(flops / peak, bytes accessed / HBM bandwidth)``: the least time the chip
        can take for this program (perfect overlap, every byte read once per fusion as the
        compiler counts it); ``None`` for a program with loops (its totals are a body's)."""
        if self.loops:
            return None
        return max(self.flops / peak_flops, self.bytes_accessed / hbm_bandwidth)


def cost_of(compiled) -> Cost | None:
    """The whole program's :class:`Cost` from ``compiled.cost_analysis()`` (None when the
    compiler gives none)."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):  # older JAX: one dict per program
        analysis = analysis[0] if analysis else None
    if not analysis or "flops" not in analysis:
        return None
    optimal = analysis.get("optimal_seconds")
    return Cost(float(analysis["flops"]), float(analysis.get("bytes accessed", 0.0)),
                None if optimal is None else float(optimal), has_loops(compiled.as_text()))


def has_loops(hlo_text: str) -> bool:
    """Whether optimised HLO text has a ``while`` instruction."""
    return re.search(r"\swhile\(", hlo_text) is not None

