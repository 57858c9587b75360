"""Every test runs with 8 CPU devices, set before JAX initialises its backend."""

import os
import pathlib
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
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


def _session_env(name: str, value: str):
    """Set the environment variable ``name`` to ``value`` for the session, then restore it."""
    old = os.environ.get(name)
    os.environ[name] = value
    yield value
    if old is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = old


@pytest.fixture(scope="session", autouse=True)
def data_dir(tmp_path_factory):
    """One TFDS data dir for the session (never the user's cache); datasets build on first use."""
    yield from _session_env("CONTRASTIVE_JAX_DATA_DIR", str(tmp_path_factory.mktemp("datasets")))


@pytest.fixture(scope="session", autouse=True)
def compilation_cache(tmp_path_factory):
    """The command line's persistent compilation cache for this session's subprocesses (never
    the user's cache); later runs of the same quick configs reuse the compiled steps."""
    yield from _session_env("CONTRASTIVE_JAX_COMPILATION_CACHE",
                            str(tmp_path_factory.mktemp("jax_compilation_cache")))
