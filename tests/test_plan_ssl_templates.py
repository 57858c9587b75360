"""The plan of the SimCLR and MoCo ImageNet templates: the two host crops of each example, MoCo's
queue and key encoder in the state, and the benchmark's epoch arithmetic
(benchmarks/plan_ssl_templates.py). XLA:CPU only, on the 8 fake devices."""

import pytest
from test_train import load_config

from contrastive_jax.accelerators import GiB
from contrastive_jax.mesh import make_mesh
from contrastive_jax.plan import example_shapes, plan, planned
from contrastive_jax.plan.report import TWO_VIEW_EXAMPLES_PER_CORE_SECOND, host_input
from contrastive_jax.training.step.state_sharding import bytes_per_device
from contrastive_jax.training.step.train_state import abstract_state

TEMPLATES = ("simclr_resnet50_imagenet", "moco_v2_resnet50_imagenet", "moco_v3_vit_imagenet")
# torchvision's ResNet-50 without its classifier (25,557,032 - 2048 x 1000 - 1000), and MoCo
# v2's MLP head 2048 -> 2048 -> 128 with biases
RESNET50_TRUNK = 23_508_032
MOCO_V2_HEAD = 2048 * 2048 + 2048 + 2048 * 128 + 128


@pytest.mark.parametrize("template", TEMPLATES)
def test_each_example_is_two_uint8_crops_and_the_host_rate_is_the_two_view_one(template):
    """Every template sends each example as two 224-px uint8 crops (the input workers' random
    resized crops), and the plan's host cores count a decode and two crops: the measured
    two-view rate."""
    config = load_config(f"{template}.py")
    assert example_shapes(config) == {"image": ((2, 224, 224, 3), "uint8")}
    assert host_input(config).examples_per_core_s == pytest.approx(
        TWO_VIEW_EXAMPLES_PER_CORE_SECOND, rel=1e-12)


def extra_bytes(config, mesh) -> tuple[dict[str, int], int, int]:
    """``({extra leaf: bytes per device}, params bytes, BatchNorm statistics bytes)``."""
    spec = planned(config, mesh)
    _, state, _, shardings = abstract_state(spec.config, spec.steps, spec.method, mesh)
    extra = {k: bytes_per_device(state.extra[k], shardings.extra[k]) for k in state.extra}
    return (extra, bytes_per_device(state.params, shardings.params),
            bytes_per_device(state.rest, shardings.rest))


def test_mocos_queue_and_key_encoder_are_in_the_plans_state():
    """MoCo v2 as shipped: the key encoder is a float32 copy of the 27,966,656 parameters
    (ResNet-50's trunk and the MLP head) and of the BatchNorm statistics, and the queue is
    65,536 keys of 128 float32 (32 MiB), each replicated. The tiny variant compiled: XLA's
    arguments are exactly the plan's state and batch (the queue and the key encoder among
    them), the batch (16, 2, 32, 32, 3) uint8 split over 8 devices."""
    mesh = make_mesh({"data": 8})
    full = load_config("moco_v2_resnet50_imagenet.py")
    extra, params, rest = extra_bytes(full, mesh)
    assert params == 4 * (RESNET50_TRUNK + MOCO_V2_HEAD)
    assert extra == {"key_params": params, "key_rest": rest, "queue": 65536 * 128 * 4,
                     "queue_pointer": 4}

    tiny = load_config("moco_v2_resnet50_imagenet.py:tiny=True")
    p = plan(planned(tiny, mesh))
    extra, params, rest = extra_bytes(tiny, mesh)
    assert (p.params, tiny.moco.queue_size, tiny.model.head.out) == (params, 64, 8)
    # rest + extra (key params and statistics, queue, pointer) + step, rng (2 x uint32),
    # skipped, skipped_in_a_row
    assert p.other_state == rest + (params + rest + 64 * 8 * 4 + 4) + 4 + 8 + 4 + 4
    assert p.batch == 16 // 8 * 2 * 32 * 32 * 3
    assert p.arguments == p.params + p.opt_state + p.other_state + p.batch


def test_the_benchmark_states_epochs_from_the_plans_step_time():
    """The benchmark's row from a plan record: FLOPs per example from the per-chip count,
    an epoch ceil(1,281,167 / 4096) = 313 steps, the template's 100 epochs 31,279 steps, the
    search's answer with its total; a GPU target is planned by XLA:CPU, a slice by the
    compiler asked for, with the overrides as --config flags."""
    import plan_ssl_templates as bench

    record = {"template": "simclr_resnet50_imagenet", "variant": "", "target_name": "v4-32",
              "target": {"chips": 16, "hosts": 4, "kind": "TPU v4"}, "compiler": "TPU",
              "global_batch": 4096, "arguments": GiB, "temporaries": 30 * GiB,
              "total": 31 * GiB, "usable_bytes": 30.75 * GiB, "refused": "out of memory",
              "fits_target": False, "compile_s": 100.0, "command_s": 400.0,
              "compilers": {"TPU": {}},
              "search": {"tried": [{"overrides": {"accumulation_steps": 2}, "total": 17 * GiB,
                                    "temporaries": 15 * GiB}],
                         "answer": {"accumulation_steps": 2}},
              "speed": {"flops_per_chip": 12e12, "mfu": 0.4, "step_s": 0.1,
                        "host_cores": 20.5}}
    row = bench.summary(record)
    assert row["gflop_per_example"] == pytest.approx(12e12 * 16 / 4096 / 1e9)
    assert (row["per_chip"], row["epoch_steps"], row["epochs"]) == (256, 313, 100.0)
    assert row["epoch_s"] == pytest.approx(31.3)
    assert row["run_h"] == pytest.approx(0.1 * 31279 / 3600)
    line = bench.table([row]).splitlines()[2]
    assert line.startswith("| simclr_resnet50_imagenet | v4-32 (16, 4) | 4,096 (256) | "
                           "TPU compiler | 1.00 / 30.00 / 31.00 (refused) | 30.75 | "
                           "no; accumulation_steps=2 (17.00 GiB) | 46.9 | 0.100 | 31 s | "
                           "0.9 h (100) | 21 | 400 |")
    assert bench.is_gpu("1x8:h100") and not bench.is_gpu("v5e-64")
    gpu = bench.command("moco_v3_vit_imagenet", "1x8:h100", "both", 0.4, "plan.json",
                        overrides=("model.encoder.scan=False",))
    assert gpu[3:] == ["--config=configs/moco_v3_vit_imagenet.py", "--gpus=1x8:h100",
                       "--compiler=cpu", "--mfu=0.4", "--json=plan.json",
                       "--config.model.encoder.scan=False"]
    assert bench.command("simclr_resnet50_imagenet", "v4-32", "both", 0.5, "p.json",
                         "tiny=True")[3:6] == [
        "--config=configs/simclr_resnet50_imagenet.py:tiny=True", "--slice=v4-32",
        "--compiler=both"]
