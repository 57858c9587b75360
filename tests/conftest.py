"""Every test runs with 8 CPU devices, set before JAX initialises its backend."""

import os
import pathlib
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# XLA:CPU's LLVM backend at -O0: the suite is compile-bound (two thirds of its time was XLA:CPU
# compiling), and -O0 cuts that by a third. Only the LLVM code generation of each fused kernel
# changes; XLA's own passes (fusion, SPMD partitioning, collectives, buffer assignment, remat)
# are the default ones, so every number asserted here (float64 equalities, bit-identical
# resumes, compiled collectives and temporaries) is checked on the same program. Subprocesses
# inherit it. An XLA_FLAGS that already sets the level wins (run the suite at -O2 with
# XLA_FLAGS=--xla_backend_optimization_level=2).
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_backend_optimization_level=0").strip()
# The experiment scripts import their helpers as ``common`` (experiments/common/).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "experiments"))
# The benchmarks' measurement tools (benchmarks/traffic.py) are imported by their module name.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))

import jax
import pytest
from hypothesis import settings

jax.config.update("jax_num_cpu_devices", 8)

# Each new shape compiles; keep property tests to a handful of examples and never time them.
settings.register_profile("ci", max_examples=8, deadline=None, derandomize=True)
settings.load_profile("ci")

# Programs that take longer than this to compile go to the run's persistent cache.
MIN_COMPILE_SECONDS = 0.0


def _run_folder(config) -> pathlib.Path:
    """This test run's base temporary folder, the same for every xdist worker of the run."""
    base = config._tmp_path_factory.getbasetemp()
    return base.parent if hasattr(config, "workerinput") else base  # worker: <base>/popen-gwN


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    """One TFDS data dir and one persistent compilation cache for the whole test run (never the
    user's), shared by this process, every other xdist worker and every subprocess of the run:
    each dataset is prepared once (concurrent prepares wait for one another), and a program
    compiled once (the quick configs' train steps, the evaluation passes) is loaded, not
    compiled again, by a later ``train_and_evaluate`` or command line with the same program
    (the cache key covers the program, shapes, shardings, flags and versions)."""
    run = _run_folder(config)
    for name, folder in (("CONTRASTIVE_JAX_DATA_DIR", "datasets"),
                         ("CONTRASTIVE_JAX_COMPILATION_CACHE", "jax_compilation_cache")):
        path = run / folder
        path.mkdir(parents=True, exist_ok=True)
        os.environ[name] = str(path)
    jax.config.update("jax_compilation_cache_dir", os.environ["CONTRASTIVE_JAX_COMPILATION_CACHE"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
