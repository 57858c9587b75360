"""Every test runs with 8 CPU devices, set before JAX initialises its backend."""

import os
import pathlib
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The suite's XLA:CPU code-generation flags (why, and what they do not change:
# tests/xla_environment.py), before JAX initialises its backend; children inherit them.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from xla_environment import add_suite_xla_flags

add_suite_xla_flags()
# Every child process (python -m contrastive_jax.main, ...) keeps and loads even the programs
# that compile in under a second (the command lines' threshold otherwise, compilation_cache.py):
# at the suite's XLA flags most of a child's programs are such, and a child's start-up then
# loads them instead of compiling them again (the SimCLR quick run: 5.5 s -> 4.5 s).
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# The experiment scripts import their helpers as ``common`` (experiments/common/).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "experiments"))
# The benchmarks' measurement tools (benchmarks/traffic.py) are imported by their module name.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

# Each new shape compiles; keep property tests to a handful of examples and never time them.
settings.register_profile("ci", max_examples=8, deadline=None, derandomize=True)
settings.load_profile("ci")

# Programs that take longer than this to compile go to the run's persistent cache (from the
# test processes; the child processes keep every program, above). Below it are the eager
# operations and initialisers, thousands of programs of a few milliseconds each: writing each
# to the cache cost more than compiling it again where another process needs it (back to
# back, 0.1 s against 0, two pairs: six heavy files 248 and 248 s -> 240 and 232 s).
MIN_COMPILE_SECONDS = 0.1


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


@pytest.fixture(scope="session")
def mock_imagenet(tmp_path_factory) -> str:
    """A data dir with the mock ``imagenet2012`` (64 train and 32 validation JPEGs of four
    classes: ``python -m contrastive_jax.training.data.prepare --mock imagenet2012``), once
    per test process."""
    from contrastive_jax.training.data.prepare import main as prepare_main

    data_dir = tmp_path_factory.mktemp("mock_imagenet")
    assert prepare_main(["--mock", "imagenet2012", f"--data_dir={data_dir}"]) == 0
    return str(data_dir)
