"""The environment of a test's child process (``python -m contrastive_jax.main``, a worker)."""

import os


def child_environment(devices: int | None = None, xla_defaults: bool = False) -> dict[str, str]:
    """``os.environ`` for a child process: JAX's default of one CPU device (or ``devices`` fake
    ones) whatever this process has, and the suite's other XLA flags (tests/conftest.py's
    optimisation level), so that numbers compared across processes come from the same compile.
    ``xla_defaults``: without the suite's optimisation level, to compile as a user's run does
    (for a digest recorded by such a run)."""
    drop = ("--xla_force_host_platform_device_count",
            *(("--xla_backend_optimization_level",) if xla_defaults else ()))
    flags = [flag for flag in os.environ.get("XLA_FLAGS", "").split() if not flag.startswith(drop)]
    if devices is not None:
        flags.append(f"--xla_force_host_platform_device_count={devices}")
    return {**os.environ, "XLA_FLAGS": " ".join(flags)}
