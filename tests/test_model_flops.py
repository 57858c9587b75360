"""Model FLOPs, TFLOP/s per chip and MFU (contrastive_jax.training.step.model_flops,
run/progress.py).

The count is XLA's for the model's computation: the same for a config with scanned towers,
remat and accumulation as for its plain form, and for a ViT/text dual encoder within 10% of
the closed form of its matmuls (forward ``2 x`` multiply-adds, backward twice that), which a
count of the scanned program (its loop body once) or of the remat'd one would miss by far;
the progress line's rates follow their formulas exactly.
"""

import jax
import pytest
from test_train import load_config

from contrastive_jax.mesh import make_mesh
from contrastive_jax.training.run.progress import Progress
from contrastive_jax.training.step import model_flops

B = 32


def pod_tiny(depth: int = 4, width: int = 64):
    """The pod template's tiny run with 4 blocks of width 64 a tower (matmuls dominate)."""
    config = load_config("clip_vit_b16_pod.py:tiny,tokenizer=x")
    config.data.batch_size = B
    for tower in (config.model.sample_encoder, config.model.text_encoder):
        tower.update({"depth": depth, "width": width, "features": width})
    return config


def batch_shapes(config) -> dict:
    from contrastive_jax.plan import example_shapes

    return {k: jax.ShapeDtypeStruct((B, *shape), dtype)
            for k, (shape, dtype) in example_shapes(config).items()}


def matmul_flops(config) -> float:
    """The towers' and the loss's matmuls of one step, by hand: per token and block the q, k,
    v, out and MLP projections and the two attention products, the patch embedding, the
    output layers and projections, the B x B logits; forward 2 FLOPs per multiply-add,
    backward twice the forward."""
    vit, text = config.model.sample_encoder, config.model.text_encoder

    def tower(width, depth, tokens, heads_dim_total, hidden):
        per_token = depth * (4 * width * width + 2 * width * hidden + 2 * tokens * width)
        return 2 * tokens * per_token

    patches = (vit.image_size // vit.patch) ** 2
    image = tower(vit.width, vit.depth, patches, vit.width, vit.mlp_ratio * vit.width)
    image += 2 * patches * vit.patch ** 2 * 3 * vit.width  # the patch convolution
    image += 2 * vit.width * vit.features + 2 * vit.features * config.model.embed_dim
    words = tower(text.width, text.depth, text.max_tokens, text.width,
                  text.mlp_ratio * text.width)
    words += 2 * text.width * text.features + 2 * text.features * config.model.embed_dim
    logits = 2 * B * config.model.embed_dim  # per example: its row of the B x B logits
    return 3 * B * (image + words + logits)


def test_scan_remat_and_accumulation_do_not_change_the_count():
    mesh = make_mesh({"data": 8})
    plain = pod_tiny()
    plain.model.sample_encoder.scan = plain.model.text_encoder.scan = False
    plain.model.remat = False
    lean = pod_tiny()  # the template: scanned, remat, and here 2 micro-batches, ring loss
    lean.accumulation_steps = 2
    assert lean.model.remat and lean.model.sample_encoder.scan and lean.loss.strategy == "ring"
    counted = [model_flops.step_flops(c, mesh, batch_shapes(c), 10) for c in (plain, lean)]
    assert counted[0] == counted[1]
    by_hand = matmul_flops(plain)
    assert 1.0 <= counted[0] / by_hand <= 1.1, (counted[0], by_hand)
    # the template's program as it runs, counted by XLA: its scanned blocks once each
    as_run = model_flops.step_flops(lean, mesh, batch_shapes(lean), 10, as_model=False)
    assert as_run < 0.5 * counted[0]


def test_the_rates_are_their_formulas():
    progress = Progress.__new__(Progress)  # the arithmetic alone: no writers
    progress.batch, progress.chips = 4096, 8
    progress.model_flops, progress.peak_flops = 3.2e15, 275e12
    got = progress.timing(steps=20, seconds=10.0)
    assert got["step_s"] == pytest.approx(0.5)
    assert got["examples_per_s"] == pytest.approx(20 * 4096 / 10)
    assert got["examples_per_s_per_chip"] == pytest.approx(20 * 4096 / 10 / 8)
    assert got["model_tflops_per_chip"] == pytest.approx(3.2e15 / 8 / 0.5 / 1e12)
    assert got["mfu"] == pytest.approx(3.2e15 / 8 / 0.5 / 275e12)
    progress.peak_flops = None  # the CPU: no peak, no MFU
    assert "mfu" not in progress.timing(20, 10.0)
    progress.model_flops = None  # not counted: no TFLOP/s either
    assert set(progress.timing(20, 10.0)) == {"step_s", "examples_per_s",
                                              "examples_per_s_per_chip"}


def test_peaks_by_device_kind():
    from contrastive_jax.accelerators import device_peak_flops

    assert device_peak_flops("TPU v4") == 275e12
    assert device_peak_flops("TPU v5 lite") == 197e12
    assert device_peak_flops("TPU v5p") == 459e12
    assert device_peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert device_peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert device_peak_flops(jax.devices()[0].device_kind) is None  # this CPU
