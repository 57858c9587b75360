"""Launch targets: a TPU slice name or a GPU cluster spec, as chips, hosts, memory and peak FLOP/s.

TPU slice names count differently by generation ([Cloud TPU docs], "TPU versions"):

- **v4** and **v5p** count TensorCores, two per chip: ``v4-256`` is 128 chips on 32 hosts
  (4 chips per host); JAX sees one device per chip (megacore).
- **v5e** (``v5litepod-N``, also written ``v5e-N``) and **v6e** (``v6e-N``) count chips: 4 chips
  per host, except the single-host slices of 1, 4 or 8 chips.

A GPU cluster is ``NODESxGPUS:MEMORY``: ``4x8:80GiB`` (memory per GPU in GiB) or ``4x8:h100``
(a GPU of :data:`GPUS`). JAX preallocates a fraction of each GPU's memory and keeps to it
(75% unless ``XLA_CLIENT_MEM_FRACTION`` / ``XLA_PYTHON_CLIENT_MEM_FRACTION`` says otherwise:
JAX's "GPU memory allocation" guide), so a GPU target's usable memory is that fraction.

A TPU slice is also a topology the TPU compiler knows (:func:`tpu_topology`: ``v4-256`` is
``v4:4x4x8`` with one JAX device per chip, "megacore"; ``v5e-256`` is ``v5e:16x16``), so the plan
can compile for it on a CPU host (:mod:`contrastive_jax.plan.tpu_compiler`); ``slices`` of
them joined over the data-centre network (multi-slice) multiply the chips and hosts.

Peak FLOP/s are the vendors' dense bf16 figures per chip (Cloud TPU system architecture pages;
NVIDIA A100, H100 and H200 SXM datasheets); the plan's step time divides the step's FLOPs by a
stated fraction of them (model-FLOPs utilisation), and the trainer's progress line divides the
model FLOP/s it measures by the peak of the chip it runs on (:func:`device_peak_flops`, from
JAX's ``device_kind``).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping

from contrastive_jax.errors import ConfigError

GiB = 2**30
MiB = 2**20


@dataclasses.dataclass(frozen=True)
class TpuGeneration:
    """One TPU generation: how its slice names count, its memory and peak per chip."""

    name: str
    counts_cores: bool  # the slice name counts TensorCores (2 per chip), not chips
    sizes: tuple[int, ...]  # the numbers a slice name may carry
    single_host_chips: int  # slices up to this many chips are one host
    hbm: int  # bytes per chip
    peak_bf16: float  # dense FLOP/s per chip
    hbm_bandwidth: float  # bytes/s per chip (Cloud TPU system architecture pages)
    topology_prefix: str  # the TPU compiler's name of the generation: "v4" in "v4:4x4x8"


_V4_SIZES = (8, 16, 32, 64, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)
_V5P_SIZES = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 6144, 8192, 12288)
_POD_SIZES = (1, 4, 8, 16, 32, 64, 128, 256)
TPUS = {
    "v4": TpuGeneration("TPU v4", True, _V4_SIZES, 4, 32 * GiB, 275e12, 1200e9, "v4"),
    "v5p": TpuGeneration("TPU v5p", True, _V5P_SIZES, 4, 95 * GiB, 459e12, 2765e9, "v5p"),
    "v5e": TpuGeneration("TPU v5e", False, _POD_SIZES, 8, 16 * GiB, 197e12, 819e9, "v5e"),
    "v6e": TpuGeneration("TPU v6e", False, _POD_SIZES, 8, 32 * GiB, 918e12, 1640e9, "v6e"),
}
# chips -> the slice's torus (Cloud TPU docs' default topologies): v4 and v5p in 3D, v5e and
# v6e in 2D
_TORUS_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8",
             256: "4x8x8", 512: "8x8x8", 768: "8x8x12", 1024: "8x8x16", 1536: "8x12x16",
             2048: "8x16x16", 3072: "8x16x24", 4096: "16x16x16", 6144: "16x16x24"}
_TORUS_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16",
             256: "16x16"}
TPU_ALIASES = {"v5litepod": "v5e"}
CHIPS_PER_HOST = 4  # every multi-host slice of these generations
# GPUs by name: memory as nvidia-smi reports it (MiB), dense bf16 FLOP/s (SXM parts)
GPUS = {
    "a100-40": (40960 * MiB, 312e12),
    "a100-80": (81920 * MiB, 312e12),
    "h100": (81559 * MiB, 989e12),
}
# JAX's device_kind of each chip (as jax.devices()[0].device_kind reads), the start of the
# string -> dense bf16 FLOP/s per chip; the first match wins (longer prefixes first)
DEVICE_KIND_PEAKS = (
    ("TPU v6 lite", 918e12), ("TPU v6e", 918e12), ("TPU v5 lite", 197e12), ("TPU v5e", 197e12),
    ("TPU v5p", 459e12), ("TPU v5", 459e12), ("TPU v4", 275e12),
    ("NVIDIA H200", 989e12), ("NVIDIA H100", 989e12), ("NVIDIA GH200", 989e12),
    ("NVIDIA A100", 312e12),
)
JAX_GPU_MEMORY_FRACTION = 0.75  # JAX's default preallocation on a GPU
MEMORY_FRACTION_VARIABLES = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")


@dataclasses.dataclass(frozen=True)
class Target:
    """Where a config will run: ``chips`` JAX devices on ``hosts`` hosts."""

    name: str  # as the user wrote it
    kind: str  # "TPU v4", ..., "GPU (h100)"
    chips: int
    hosts: int
    memory: int  # bytes per chip
    usable_fraction: float  # of ``memory`` that JAX will use (1 on TPU)
    peak_flops: float | None  # dense bf16 FLOP/s per chip, None when unknown
    generation: str | None = None  # a key of TPUS for a TPU slice, None for GPUs
    slices: int = 1  # TPU slices joined over the data-centre network (multi-slice)

    @property
    def usable(self) -> int:
        """Bytes per chip that the program may use."""
        return int(self.memory * self.usable_fraction)


def tpu_slice(name: str, slices: int = 1) -> Target:
    """``v4-256`` -> 128 chips on 32 hosts, 32 GiB each (``slices`` of them: that many times
    the chips and hosts). An unknown generation or size is a :class:`ConfigError` listing the
    valid ones."""
    match = re.fullmatch(r"(v4|v5p|v5e|v5litepod|v6e)-(\d+)", name.strip().lower())
    if not match:
        raise ConfigError(f"unknown TPU slice {name!r}: write GENERATION-SIZE with GENERATION "
                          f"one of {sorted(TPUS) + sorted(TPU_ALIASES)}, e.g. v4-256, "
                          "v5litepod-64, v6e-256")
    key, size = TPU_ALIASES.get(match[1], match[1]), int(match[2])
    gen = TPUS[key]
    if size not in gen.sizes:
        counted = "TensorCores, 2 per chip" if gen.counts_cores else "chips"
        raise ConfigError(f"TPU slice {name!r}: {gen.name} slices are named by their "
                          f"{counted}; valid sizes {list(gen.sizes)}")
    if slices < 1:
        raise ConfigError(f"--slices must be >= 1; got {slices}")
    chips = size // 2 if gen.counts_cores else size
    hosts = 1 if chips <= gen.single_host_chips else chips // CHIPS_PER_HOST
    return Target(name, gen.name, chips * slices, hosts * slices, gen.hbm, 1.0, gen.peak_bf16,
                  key, slices)


@dataclasses.dataclass(frozen=True)
class TpuTopology:
    """A slice as the TPU compiler names it (``jax.experimental.topologies.
    get_topology_desc``'s arguments)."""

    name: str  # "v4:4x4x8"
    chip_config: str  # "megacore": one JAX device per v4/v5p chip; "default" otherwise
    chips_per_host_bounds: tuple[int, int, int]
    slices: int


def tpu_topology(target: Target) -> TpuTopology:
    """The torus of a TPU ``target`` (:func:`tpu_slice`), per slice: ``v4-256`` ->
    ``v4:4x4x8`` (megacore), ``v5e-8`` -> ``v5e:2x4`` on one host."""
    if target.generation is None:
        raise ConfigError(f"{target.name} is not a TPU slice; the TPU compiler plans TPU "
                          "slices only (--slice=...)")
    gen = TPUS[target.generation]
    chips = target.chips // target.slices
    torus = (_TORUS_3D if gen.counts_cores else _TORUS_2D).get(chips)
    if torus is None:
        raise ConfigError(f"no known torus for {chips} chips of {gen.name}")
    if gen.counts_cores:
        bounds = (2, 2, 1)
    else:  # single-host slices keep all their chips on the host
        bounds = {1: (1, 1, 1), 4: (2, 2, 1), 8: (2, 4, 1)}.get(chips, (2, 2, 1))
    return TpuTopology(f"{gen.topology_prefix}:{torus}",
                       "megacore" if gen.counts_cores else "default", bounds, target.slices)


def gpu_memory_fraction(environ: Mapping[str, str] | None = None) -> float:
    """The fraction of each GPU's memory JAX will use: ``XLA_CLIENT_MEM_FRACTION`` (or its old
    name ``XLA_PYTHON_CLIENT_MEM_FRACTION``) when set, else JAX's default 0.75."""
    environ = os.environ if environ is None else environ
    for variable in MEMORY_FRACTION_VARIABLES:
        raw = environ.get(variable)
        if raw:
            try:
                value = float(raw)
            except ValueError:
                value = -1.0
            if not 0 < value <= 1:
                raise ConfigError(f"{variable}={raw!r} is not a fraction in (0, 1]")
            return value
    return JAX_GPU_MEMORY_FRACTION


def gpu_cluster(spec: str, memory_fraction: float | None = None) -> Target:
    """``4x8:h100`` or ``4x8:80GiB`` -> 32 GPUs on 4 hosts. A spec without memory, or with a GPU
    name not in :data:`GPUS`, is a :class:`ConfigError` saying how to write it."""
    match = re.fullmatch(r"(\d+)x(\d+)(?::(.+))?", spec.strip().lower())
    how = f"write NODESxGPUS:MEMORY, e.g. 4x8:80GiB, or NODESxGPUS:NAME with NAME in {list(GPUS)}"
    if not match or int(match[1]) < 1 or int(match[2]) < 1:
        raise ConfigError(f"bad GPU spec {spec!r}: {how}")
    nodes, per_node, memory = int(match[1]), int(match[2]), match[3]
    if memory is None:
        raise ConfigError(f"GPU spec {spec!r} gives no memory per GPU: {how}")
    fraction = gpu_memory_fraction() if memory_fraction is None else memory_fraction
    if memory in GPUS:
        size, peak = GPUS[memory]
        kind = f"GPU ({memory})"
    else:
        amount = re.fullmatch(r"(\d+(?:\.\d+)?)(gib|gb)?", memory)
        if not amount or float(amount[1]) <= 0:
            raise ConfigError(f"GPU spec {spec!r}: unknown GPU {memory!r}; {how}")
        size = int(float(amount[1]) * (GiB if amount[2] != "gb" else 10**9))
        peak, kind = None, "GPU"
    return Target(spec, kind, nodes * per_node, nodes, size, fraction, peak)


def device_peak_flops(device_kind: str) -> float | None:
    """The dense bf16 FLOP/s of one chip of JAX's ``device_kind`` (``"TPU v4"``, ``"NVIDIA
    H100 80GB HBM3"``, ...), or ``None`` for a kind without a published figure here (the CPU:
    its MFU is "n/a")."""
    for prefix, peak in DEVICE_KIND_PEAKS:
        if device_kind.startswith(prefix):
            return peak
    return None
