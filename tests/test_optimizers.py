"""Optimisers from config: what is decayed, the temperature's own rate, the schedule."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from contrastive_jax.training.models import build_model
from contrastive_jax.training.parameter_paths import path_keys
from contrastive_jax.training.step.optimizers import (
    build_optimizer,
    decay_mask,
    schedule,
)


@pytest.fixture(scope="module")
def params():
    model = build_model({
        "name": "dual_encoder",
        "sample_encoder": {"name": "signal_cnn", "length": 8, "channels": (4,),
                           "kernel_sizes": (3,), "strides": (1,), "features": 8},
        "text_encoder": {"name": "text_transformer", "vocab_size": 10, "max_tokens": 4,
                         "width": 8, "depth": 1, "heads": 2, "features": 8},
        "embed_dim": 4, "siglip": True}, nnx.Rngs(0))
    return nnx.split(model, nnx.Param, ...)[1]


def named(tree):
    return {path_keys(p): v for p, v in jax.tree_util.tree_leaves_with_path(tree)}


def test_weight_decay_only_on_kernels_and_embeddings(params):
    mask = named(decay_mask(params))
    assert mask[("sample_encoder", "convs", 0, "kernel")]
    assert mask[("text_encoder", "tokens", "embedding")]
    assert not mask[("sample_encoder", "norms", 0, "scale")]
    assert not mask[("sample_encoder", "out", "bias")]
    assert not mask[("text_encoder", "positions")]
    assert not mask[("log_scale",)] and not mask[("bias",)]


@pytest.mark.parametrize("name", ["adamw", "lars", "sgd"])
def test_decay_and_temperature_rate(params, name):
    """Zero gradients: only decayed leaves move, each by lr * wd * w; the log-scale (with a
    gradient of 1 and its own Adam rate) moves by its rate exactly."""
    tx = build_optimizer({"name": name, "learning_rate": 0.1, "weight_decay": 0.5,
                          "temperature_lr": 0.01, "momentum": 0.0}, 10, params)
    grads = jax.tree.map(jnp.zeros_like, params)
    grads["log_scale"] = grads["log_scale"].replace(jnp.float32(1.0))
    updates, _ = tx.update(grads, tx.init(params), params)
    up, values, mask = named(updates), named(params), named(decay_mask(params))
    for path, u in up.items():
        if path == ("log_scale",):
            assert float(u) == pytest.approx(-0.01, rel=1e-4)  # Adam: first step = lr * sign
        elif mask[path] and name != "lars":
            np.testing.assert_allclose(u, -0.1 * 0.5 * values[path], rtol=1e-5, atol=1e-8)
        elif mask[path]:  # LARS scales the decay by its trust ratio; it still moves
            assert np.any(u != 0)
        else:
            assert np.all(u == 0), path


def test_warmup_then_cosine():
    lr = schedule(1.0, total_steps=100, warmup_steps=10, end_fraction=0.1)
    assert float(lr(0)) == 0.0 and float(lr(5)) == pytest.approx(0.5)
    assert float(lr(10)) == pytest.approx(1.0)
    assert float(lr(55)) == pytest.approx(0.1 + 0.9 * 0.5, rel=1e-5)  # half-way down
    assert float(lr(100)) == pytest.approx(0.1)


def test_gradient_clipping_and_errors(params):
    tx = build_optimizer({"name": "sgd", "learning_rate": 1.0, "momentum": 0.0,
                          "grad_clip_norm": 1.0}, 10, params)
    grads = jax.tree.map(lambda p: jnp.full_like(p, 10.0), params)
    updates, _ = tx.update(grads, tx.init(params), params)
    main = {k: v for k, v in named(updates).items() if k not in (("log_scale",), ("bias",))}
    assert float(optax.tree.norm(list(main.values()))) <= 1.0 + 1e-5
    with pytest.raises(ValueError, match=r"unknown optimizer settings.*lerning_rate"):
        build_optimizer({"lerning_rate": 1.0}, 10, params)
    with pytest.raises(ValueError, match="unknown optimizer 'adam'"):
        build_optimizer({"name": "adam"}, 10, params)
    with pytest.raises(ValueError, match="warmup_steps"):
        build_optimizer({"warmup_steps": 10}, 10, params)
