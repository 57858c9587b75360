"""The suite's XLA flags, and the environment of a test's child processes.

The suite is compile-bound: most of its time was XLA:CPU compiling small programs once each.
Two flags of XLA:CPU's code generation cut that by about half (measured 2026-12-02 on 2 cores:
the whole suite 17 -> 10 minutes): LLVM at -O0 (``xla_backend_optimization_level``) and the
classic elemental emitters instead of the MLIR fusion emitters (``xla_cpu_use_fusion_emitters``).
A third, ``xla_cpu_parallel_codegen_split_count=1``, compiles each program's LLVM module as one
piece instead of splitting it for parallel code generation: on 2 cores, both busy with the
suite's two workers, the split parts only add work (measured 2026-12-06: test_accumulation,
test_remat and test_state_sharding 133 -> 119 CPU-s). Like -O0 it changes the last bits of some
results (a 6-step SimCLR run's parameter digest differs), never a program's HLO.
All three change only how each fused kernel becomes machine code; XLA's HLO passes (fusion, SPMD
partitioning, collectives, buffer assignment, remat) run as by default, so the numbers the
tests assert (float64 equalities, bit-identical resumes across processes, compiled collectives
and temporaries) are checked on the same programs. Numbers that must match a run made with the
default flags (a committed checkpoint's digest) run their child with
``child_environment(xla_defaults=True)``.
"""

import os
import subprocess
import sys

SUITE_XLA_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false",
                   "--xla_cpu_parallel_codegen_split_count=1")


def _name(flag: str) -> str:
    return flag.split("=", 1)[0]


def _known_to_xla(flags: list[str]) -> bool:
    """Whether this jaxlib's XLA accepts ``flags`` (it aborts on an unknown one: a newer
    jaxlib may have dropped a flag, and the suite must still run)."""
    probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices('cpu')"],
                           env={**os.environ, "JAX_PLATFORMS": "cpu",
                                "XLA_FLAGS": " ".join(flags)},
                           capture_output=True, timeout=120)
    return probe.returncode == 0


def add_suite_xla_flags() -> None:
    """Add to ``XLA_FLAGS`` each suite flag that the environment does not already set (one the
    user set wins: ``XLA_FLAGS=--xla_backend_optimization_level=2`` runs the suite at -O2) and
    that this jaxlib knows. Call before JAX initialises its backend; children inherit it."""
    flags = os.environ.get("XLA_FLAGS", "").split()
    missing = [f for f in SUITE_XLA_FLAGS if not any(_name(f) == _name(g) for g in flags)]
    if not missing:
        return
    if not _known_to_xla(flags + missing):
        missing = [f for f in missing if _known_to_xla([*flags, f])]
    os.environ["XLA_FLAGS"] = " ".join(flags + missing)


def child_environment(devices: int | None = None, xla_defaults: bool = False) -> dict[str, str]:
    """``os.environ`` for a child process: JAX's default of one CPU device (or ``devices`` fake
    ones) whatever this process has, and the suite's XLA flags, so that numbers compared across
    processes come from the same compile. ``xla_defaults``: without the suite's flags, to
    compile as a user's run does (for a digest recorded by such a run), and with the command
    lines' own one-second threshold of the persistent compilation cache."""
    drop = {"--xla_force_host_platform_device_count"}
    if xla_defaults:
        drop |= {_name(f) for f in SUITE_XLA_FLAGS}
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if _name(f) not in drop]
    if devices is not None:
        flags.append(f"--xla_force_host_platform_device_count={devices}")
    env = {**os.environ, "XLA_FLAGS": " ".join(flags)}
    if xla_defaults:
        env.pop("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", None)
    return env
