"""Flax NNX models: shapes, inference vs training mode, padding, configs and their errors."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.methods import momentum_contrast as moco
from contrastive_jax.training.models import ENCODERS, build_encoder, build_model, with_defaults


def built(build, config: dict):
    """``build(config, nnx.Rngs(0))``, eagerly: one small program per parameter shape, shared
    with every other test of the process that initialises a parameter of that shape (a jitted
    initialisation would be one large program of random-number code per model)."""
    return build(config, nnx.Rngs(0))


@nnx.jit(static_argnames="train")
def apply(model, x, train: bool = False):
    """``model(x, train=train)`` as one program (BatchNorm's updated averages kept)."""
    return model(x, train=train)


def tiny_text(**kw):
    return {"name": "text_transformer", "vocab_size": 40, "max_tokens": 12, "width": 16,
            "depth": 1, "heads": 2, "features": 16, **kw}


@pytest.mark.parametrize("config,shape", [
    ({"name": "signal_cnn", "length": 40, "channels": (8, 8), "kernel_sizes": (5, 3),
      "strides": (2, 2), "features": 32}, (3, 40, 1)),
    ({"name": "signal_cnn", "length": 40, "channels": (8,), "kernel_sizes": (3,),
      "strides": (1,), "features": 32, "pool": "mean"}, (3, 40, 1)),
    ({"name": "resnet", "in_channels": 1, "widths": (8, 16), "features": 32}, (3, 8, 8, 1)),
    ({"name": "vit", "image_size": 8, "patch": 4, "in_channels": 3, "width": 16, "depth": 1,
      "heads": 2, "features": 32}, (3, 8, 8, 3)),
    ({"name": "mlp", "in_features": 5, "hidden": 16, "depth": 2, "features": 32}, (3, 5)),
])
def test_encoders_map_batches_to_features(config, shape):
    """Each encoder follows the protocol (docs/architecture.md, "Adding a tower"): its class
    declares one example's input shape for its block (the plan's batch), it maps a batch of
    that shape to ``(B, .features)``, and a wrong shape is an error naming what it expects."""
    encoder = built(build_encoder, config)
    image_size = shape[1] if config["name"] == "resnet" else None  # a ResNet's is the data's
    assert ENCODERS[config["name"]].input_shape(with_defaults(config), image_size) == shape[1:]
    x = jax.random.normal(jax.random.key(1), shape)
    out = apply(encoder, x)
    assert out.shape == (3, encoder.features) == (3, 32) and np.all(np.isfinite(out))
    assert not np.allclose(out[0], out[1])  # different inputs, different features
    with pytest.raises(ValueError, match="expects"):
        encoder(jnp.ones((3, *[s + 1 for s in shape[1:]])), train=False)


def test_every_encoder_declares_its_input_and_a_resnet_asks_for_the_datas_size():
    text = with_defaults(tiny_text())
    assert ENCODERS["text_transformer"].input_shape(text) == (12,)
    assert all(callable(getattr(cls, "input_shape", None)) for cls in ENCODERS.values())
    with pytest.raises(ConfigError, match=r"set data\.preprocess\.image_size"):
        ENCODERS["resnet"].input_shape(with_defaults({"name": "resnet"}))


def test_text_tower_masks_padding():
    tower = built(build_encoder, tiny_text())
    tokens = jnp.array([[2, 4, 8, 9, 3, 0, 0, 0, 0, 0, 0, 0]])
    a = apply(tower, tokens)
    # what sits at the padded positions (their position embeddings) cannot leak in ...
    tower.positions[...] = tower.positions[...].at[:, 5:].add(100.0)
    np.testing.assert_allclose(apply(tower, tokens), a, rtol=1e-5, atol=1e-5)
    # ... while a real token does change the output
    assert not np.allclose(apply(tower, tokens.at[0, 1].set(5)), a)
    with pytest.raises(ValueError, match="integers"):
        tower(tokens.astype(jnp.float32), train=False)


def test_batchnorm_uses_batch_statistics_in_training_only():
    model = built(build_model, {"name": "projected_encoder", "encoder": {
        "name": "signal_cnn", "length": 40, "channels": (4,), "kernel_sizes": (3,),
        "strides": (1,), "features": 8}, "head": {"hidden": 8, "out": 4}})
    x = jax.random.normal(jax.random.key(0), (16, 40, 1)) * 3 + 1
    single_train = apply(model, x[:1], train=True)[1]
    batch_train = apply(model, x, train=True)[1][:1]
    assert not np.allclose(single_train, batch_train)  # batch statistics differ
    mean = nnx.state(model, nnx.BatchStat)["encoder"]["norms"][0]["mean"][...]
    assert np.any(mean != 0)  # running averages moved
    features = nnx.jit(type(model).representations)(model, x)
    np.testing.assert_allclose(nnx.jit(type(model).representations)(model, x[:1]), features[:1],
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(apply(model, x)[1], features, rtol=1e-6)


def test_dual_encoder_temperature_and_siglip_bias():
    config = {"name": "dual_encoder",
              "sample_encoder": {"name": "mlp", "in_features": 4, "features": 8},
              "text_encoder": tiny_text(), "embed_dim": 6}
    clip = built(build_model, config)
    assert float(clip.log_scale[...]) == pytest.approx(math.log(1 / 0.07))
    assert clip.bias is None
    x, y = nnx.jit(lambda m, a, b: m(a, b, train=True))(
        clip, jnp.ones((2, 4)), jnp.ones((2, 12), jnp.int32))
    assert x.shape == y.shape == (2, 6)
    siglip = built(build_model, {**config, "siglip": True, "init_temperature": 0.1})
    assert float(siglip.bias[...]) == -10.0
    assert float(siglip.log_scale[...]) == pytest.approx(math.log(10.0))


def test_model_config_errors_name_what_is_valid():
    with pytest.raises(ValueError, match="unknown model 'simclr2'"):
        build_model({"name": "simclr2"}, nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"model.queue_size is a setting of the method now: "
                       r"set config.moco.queue_size"):
        build_model({"name": "projected_encoder", "queue_size": 4, "encoder": {}}, nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"unknown settings \['width'\]"):
        build_model({"name": "projected_encoder", "width": 4, "encoder": {}}, nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"unknown arguments.*valid"):
        build_encoder({"name": "mlp", "in_features": 3, "widht": 3}, nnx.Rngs(0))
    with pytest.raises(ValueError, match="unknown encoder"):
        build_encoder({"name": "resnet50"}, nnx.Rngs(0))


def test_moco_momentum_update_and_fifo_queue():
    key = {"w": jnp.full((3,), 1.0)}
    query = {"w": jnp.full((3,), 3.0)}
    np.testing.assert_allclose(moco.momentum_update(key, query, 0.99)["w"], 1.02, rtol=1e-6)
    np.testing.assert_allclose(moco.momentum_update(key, query, 1.0)["w"], 1.0)
    queue = jnp.zeros((6, 2))
    pointer = jnp.int32(0)
    for step in range(4):
        keys = jnp.full((2, 2), float(step + 1))
        queue, pointer = moco.enqueue(queue, pointer, keys)
    # FIFO: the 4th batch overwrote the 1st (rows 0-1), pointer wrapped to 2
    np.testing.assert_array_equal(queue[:, 0], [4, 4, 2, 2, 3, 3])
    assert int(pointer) == 2
    moco.check_queue_size(8, 4)
    with pytest.raises(ValueError, match="multiple of the global batch 4"):
        moco.check_queue_size(6, 4)
    init = moco.init_queue(jax.random.key(0), 5, 3)
    np.testing.assert_allclose(jnp.linalg.norm(init, axis=1), 1.0, rtol=1e-6)


def test_dropout_draws_each_example_from_its_own_key():
    """ExampleDropout: example b's mask depends only on keys[b] (a batch equals its halves),
    kept entries are scaled by 1 / (1 - rate), about rate of them are dropped, and the
    transformer towers drop nothing outside training."""
    from contrastive_jax.training.models.dropout import ExampleDropout

    drop = ExampleDropout(0.25)
    x = jnp.ones((64, 10, 8))
    keys = jax.random.split(jax.random.key(0), 64)
    train = jax.jit(lambda x, keys: drop(x, keys=keys, train=True))  # a program per shape
    y = train(x, keys)
    halves = jnp.concatenate([train(x[:32], keys[:32]), train(x[32:], keys[32:])])
    np.testing.assert_array_equal(y, halves)
    np.testing.assert_array_equal(np.unique(np.asarray(y)), np.float32([0.0, 1.0 / 0.75]))
    assert abs(float(jnp.mean(y == 0)) - 0.25) < 0.02
    assert not np.array_equal(y[0], y[1])  # examples draw independently
    np.testing.assert_array_equal(drop(x, keys=None, train=False), x)
    with pytest.raises(ConfigError, match=r"one key per example: keys of shape \(64,\)"):
        drop(x, keys=None, train=True)
    with pytest.raises(ConfigError, match=r"dropout rate must lie in \[0, 1\)"):
        ExampleDropout(1.0)
