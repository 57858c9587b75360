"""Every test runs with 8 CPU devices, set before JAX initialises its backend."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
from hypothesis import settings

jax.config.update("jax_num_cpu_devices", 8)

# Each new shape compiles; keep property tests to a handful of examples and never time them.
settings.register_profile("ci", max_examples=8, deadline=None, derandomize=True)
settings.load_profile("ci")
