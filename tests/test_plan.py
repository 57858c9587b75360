"""The memory plan (python -m contrastive_jax.plan): exact state bytes, a clear error."""

import subprocess
import sys

import pytest
from test_train import REPO, load_config

from contrastive_jax.errors import ConfigError
from contrastive_jax.mesh import make_mesh
from contrastive_jax.plan import CHIPS, example_shapes, plan, report


def block_params(w: int, r: int) -> int:
    """A pre-LN Transformer block: two LayerNorms, q/k/v/out projections, the MLP."""
    return 2 * 2 * w + 4 * (w * w + w) + (w * r * w + r * w) + (r * w * w + w)


def dual_encoder_params(model) -> int:
    """The parameter count of the pod template's dual encoder, from its config alone."""
    v, t = model.sample_encoder, model.text_encoder
    w, p = v.width, v.patch
    vit = (p * p * v.in_channels * w + w + (v.image_size // p) ** 2 * w
           + v.depth * block_params(w, v.mlp_ratio) + 2 * w + w * v.features + v.features)
    u = t.width
    text = (t.vocab_size * u + t.max_tokens * u + t.depth * block_params(u, t.mlp_ratio)
            + 2 * u + u * t.features + t.features)
    return vit + text + (v.features + t.features) * model.embed_dim + 1  # + log-scale


def test_plan_counts_the_parameters_exactly_replicated_and_fsdp():
    """Parameter bytes per device: 4 x the analytic count replicated; under FSDP with every
    leaf split (widths divisible by 8) an eighth of it, plus the scalar log-scale whole.
    Optimiser state is AdamW's two moments (+ its counters), the batch the rows of one
    device."""
    config = load_config("clip_vit_b16_pod.py:tiny")
    assert config.sharding.params == "fsdp"  # the template's setting
    config.sharding.params = "replicated"
    mesh = make_mesh({"data": 8})
    count = dual_encoder_params(config.model)
    replicated = plan(config, mesh)
    assert replicated.params == 4 * count
    assert 2 * 4 * count <= replicated.opt_state <= 2 * 4 * count + 64
    size = config.model.sample_encoder.image_size
    rows = config.data.batch_size // 8
    assert replicated.batch == rows * (size * size * 3 * 4 + config.model.text_encoder.max_tokens
                                       * 4)
    assert replicated.temporaries > 0 and replicated.total > replicated.params
    config.sharding.params = "fsdp"  # tiny: min_size 0, every leaf split
    fsdp = plan(config, mesh)
    assert fsdp.params == 4 * ((count - 1) // 8 + 1)
    assert fsdp.opt_state <= replicated.opt_state / 8 + 64
    assert fsdp.arguments < replicated.arguments
    text = report(fsdp, "tiny")
    assert "fits" in text and all(chip in text for chip in CHIPS)


def test_plan_refuses_a_batch_that_does_not_divide():
    config = load_config("clip_vit_b16_pod.py:tiny")
    config.data.batch_size = 12
    with pytest.raises(ConfigError, match="does not divide by the 8"):
        plan(config, make_mesh({"data": 8}))


def test_plan_command_line_says_what_to_change():
    """The command on a config that cannot be compiled: exit 2, one ``error:`` line."""
    result = subprocess.run(
        [sys.executable, "-m", "contrastive_jax.plan", "--devices=8",
         f"--config={REPO / 'configs' / 'clip_vit_b16_pod.py'}:tiny",
         "--config.data.batch_size=12"], capture_output=True, text=True, timeout=300,
        cwd=REPO)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "multiple of 8" in errors[0], result.stderr[-2000:]


def test_example_shapes_follow_the_model():
    config = load_config("clip_vit_b16_pod.py")
    assert example_shapes(config) == {"image": ((224, 224, 3), "float32"),
                                      "caption": ((32,), "int32")}
    simclr = load_config("simclr_mnist1d.py")
    shapes = example_shapes(simclr)
    assert shapes[simclr.input_key][0] == (simclr.model.encoder.length, 1)
