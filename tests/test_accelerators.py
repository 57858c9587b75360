"""Launch targets: slice names and GPU specs become chips, hosts, memory; bad ones say how."""

import pytest

from contrastive_jax.accelerators import (
    GPUS,
    TPUS,
    GiB,
    gpu_cluster,
    gpu_memory_fraction,
    tpu_slice,
)
from contrastive_jax.errors import ConfigError


@pytest.mark.parametrize("name, chips, hosts, hbm_gib, kind", [
    ("v4-8", 4, 1, 32, "TPU v4"),
    ("v4-32", 16, 4, 32, "TPU v4"),  # v4 names count TensorCores, 2 per chip
    ("v4-256", 128, 32, 32, "TPU v4"),
    ("v5p-128", 64, 16, 95, "TPU v5p"),
    ("v5litepod-8", 8, 1, 16, "TPU v5e"),  # v5e and v6e names count chips
    ("v5e-64", 64, 16, 16, "TPU v5e"),
    ("v5litepod-256", 256, 64, 16, "TPU v5e"),
    ("v6e-4", 4, 1, 32, "TPU v6e"),
    ("V6E-256", 256, 64, 32, "TPU v6e"),
])
def test_slice_names_become_chips_hosts_and_memory(name, chips, hosts, hbm_gib, kind):
    target = tpu_slice(name)
    assert (target.chips, target.hosts, target.memory, target.kind) == (
        chips, hosts, hbm_gib * GiB, kind)
    assert target.usable == target.memory and target.peak_flops > 1e14


@pytest.mark.parametrize("name, message", [
    ("v3-8", "unknown TPU slice 'v3-8'"),
    ("v4_256", "unknown TPU slice"),
    ("v4-12", r"TPU v4 slices are named by their TensorCores, 2 per chip; valid sizes \[8, 16"),
    ("v6e-2", r"TPU v6e slices are named by their chips; valid sizes \[1, 4, 8"),
])
def test_an_unknown_slice_says_what_is_valid(name, message):
    with pytest.raises(ConfigError, match=message):
        tpu_slice(name)


def test_gpu_specs_name_nodes_gpus_and_memory():
    named = gpu_cluster("4x8:h100", memory_fraction=0.75)
    assert (named.chips, named.hosts, named.memory, named.peak_flops) == (32, 4, *GPUS["h100"])
    assert named.usable == int(0.75 * GPUS["h100"][0])
    sized = gpu_cluster("2x4:40GiB", memory_fraction=0.5)
    assert (sized.chips, sized.hosts, sized.memory, sized.peak_flops) == (8, 2, 40 * GiB, None)
    assert sized.usable == 20 * GiB
    assert gpu_cluster("1x8:80gb", memory_fraction=1.0).memory == 80 * 10**9


@pytest.mark.parametrize("spec, message", [
    ("8x8", "gives no memory per GPU"),
    ("8:h100", "bad GPU spec"),
    ("0x8:h100", "bad GPU spec"),
    ("8x8:v100", "unknown GPU 'v100'"),
])
def test_a_bad_gpu_spec_says_how_to_write_it(spec, message):
    with pytest.raises(ConfigError, match=message):
        gpu_cluster(spec, memory_fraction=0.75)


def test_the_gpu_memory_fraction_is_jaxs():
    assert gpu_memory_fraction({}) == 0.75  # JAX preallocates 75% by default
    assert gpu_memory_fraction({"XLA_PYTHON_CLIENT_MEM_FRACTION": ".9"}) == 0.9
    assert gpu_memory_fraction({"XLA_CLIENT_MEM_FRACTION": ".5",
                                "XLA_PYTHON_CLIENT_MEM_FRACTION": ".9"}) == 0.5
    with pytest.raises(ConfigError, match="not a fraction"):
        gpu_memory_fraction({"XLA_PYTHON_CLIENT_MEM_FRACTION": "90"})


def test_every_generation_lists_sizes_that_fill_whole_hosts():
    for gen in TPUS.values():
        for size in gen.sizes:
            target = tpu_slice(f"{next(k for k, g in TPUS.items() if g is gen)}-{size}")
            assert target.chips == target.hosts * 4 or target.hosts == 1
