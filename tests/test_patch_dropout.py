"""Patch dropout (``model.sample_encoder.patch_dropout = p``, FLIP; docs/training.md "Cheaper
training"): in training each example keeps ``max(1, round((1 - p) P))`` of its ``P`` patch
tokens, chosen from its own key, the class token always kept; evaluation never drops.

Here: the selection against a slow per-example reference; a ViT's output in training depends
only on the example and its key (so micro-batches and device counts give the batch's result;
the whole train step with patch dropout is checked equal under K micro-batches, 1 vs 8 devices
and the ring and tiled losses in tests/test_accumulation.py, and scanned vs unrolled with remat
and FSDP in tests/test_scanned_layers.py, whose towers drop half their patches); evaluation is
the model without it; the FLOPs follow the kept tokens; bad settings say what to change.
"""

import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl import flags
from flax import nnx
from ml_collections import config_flags

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models import build_encoder
from contrastive_jax.training.models.dropout import (
    PATCH_DROPOUT_SITE,
    drop_patches,
    kept_patches,
)

TEMPLATE = pathlib.Path(__file__).resolve().parents[1] / "configs" / "clip_vit_b16_pod.py"
VIT = {"name": "vit", "image_size": 16, "patch": 4, "in_channels": 1, "width": 16, "depth": 2,
       "heads": 2, "mlp_ratio": 2, "features": 8}


def test_kept_patches_rounds_and_keeps_at_least_one():
    assert [kept_patches(196, p) for p in (0.0, 0.5, 0.75, 0.9)] == [196, 98, 49, 20]
    assert kept_patches(4, 0.5) == 2 and kept_patches(4, 0.99) == 1


@pytest.mark.parametrize("prefix", [0, 1])
def test_each_example_keeps_the_patches_of_its_smallest_draws_in_order(prefix):
    """Against a loop over examples: ``u = uniform(fold_in(key_b, SITE), (P,))``, the ``kept``
    patches of smallest ``u`` in their original order, after the untouched prefix."""
    patches, kept, width = 9, 4, 3
    h = jnp.asarray(np.random.default_rng(0).standard_normal((5, prefix + patches, width)))
    keys = jax.random.split(jax.random.key(1), 5)
    got = np.asarray(drop_patches(h, keys, kept, prefix))
    assert got.shape == (5, prefix + kept, width)
    for b in range(5):
        u = np.asarray(jax.random.uniform(jax.random.fold_in(keys[b], PATCH_DROPOUT_SITE),
                                          (patches,)))
        index = sorted(np.argsort(u)[:kept])
        want = np.concatenate([np.asarray(h[b, :prefix]),
                               np.asarray(h[b, prefix:])[index]])
        np.testing.assert_array_equal(got[b], want)
    other = np.asarray(drop_patches(h, jax.random.split(jax.random.key(2), 5), kept, prefix))
    assert not np.array_equal(got, other)  # another key, another subset
    with pytest.raises(ConfigError, match=r"one key per example: keys of shape \(5,\)"):
        drop_patches(h, None, kept, prefix)


def jitted(model):
    """``f(x, keys, train)``: the module's call, compiled (eager NNX calls run op by op)."""
    graphdef, state = nnx.split(model)

    @functools.partial(jax.jit, static_argnames="train")
    def apply(state, x, keys, train):
        return nnx.merge(graphdef, state)(x, train=train, dropout_keys=keys)

    return lambda x, keys, train: np.asarray(apply(state, x, keys, train=train))


@pytest.mark.parametrize("class_token", [False, True])
def test_a_vit_with_patch_dropout_is_per_example_and_evaluation_keeps_every_patch(class_token):
    """Float64: in training, each example's output is the one it has alone with its key (the
    batch of 6 against 6 batches of 1); in evaluation, the output of the same parameters
    without patch dropout; training with and without it differ."""
    settings = {**VIT, "class_token": class_token, "pre_norm": class_token,
                "pool": "token" if class_token else "mean"}
    with jax.enable_x64(True):
        masked = jitted(build_encoder({**settings, "patch_dropout": 0.75}, nnx.Rngs(0),
                                      dtype=jnp.float64))
        plain = jitted(build_encoder(settings, nnx.Rngs(0), dtype=jnp.float64))
        x = jnp.asarray(np.random.default_rng(0).uniform(0, 1, (6, 16, 16, 1)))
        keys = jax.random.split(jax.random.key(3), 6)
        batch = masked(x, keys, train=True)
        for b in range(6):
            alone = masked(x[b:b + 1], keys[b:b + 1], train=True)
            np.testing.assert_allclose(alone[0], batch[b], rtol=1e-12, atol=1e-14)
        np.testing.assert_array_equal(masked(x, keys, train=False), plain(x, keys, train=False))
        assert np.abs(batch - plain(x, keys, train=True)).max() > 1e-3


def test_the_flops_of_a_training_pass_follow_the_kept_tokens():
    """XLA's count of a training forward pass at p = 0.75 (4 of 16 patches): under 0.35x of
    p = 0's, and the evaluation pass is p = 0's."""
    def flops(p, train):
        model = build_encoder({**VIT, "depth": 4, "width": 32, "patch_dropout": p}, nnx.Rngs(0))
        graphdef, state = nnx.split(model)

        def forward(state, x, keys):
            return nnx.merge(graphdef, state)(x, train=train, dropout_keys=keys)

        x = jnp.zeros((8, 16, 16, 1))
        keys = jax.random.split(jax.random.key(0), 8)
        return jax.jit(forward).lower(state, x, keys).cost_analysis()["flops"]

    full = flops(0.0, True)
    assert flops(0.75, True) < 0.35 * full
    assert flops(0.75, False) == full


@pytest.mark.parametrize("value", [1.0, -0.1, True, "half"])
def test_a_rate_outside_zero_to_one_says_what_to_set(value):
    with pytest.raises(ConfigError, match=r"patch_dropout .* must lie in \[0, 1\) \(0: off\)"):
        build_encoder({**VIT, "patch_dropout": value}, nnx.Rngs(0))


def test_patch_dropout_on_a_tower_without_patches_is_refused():
    with pytest.raises(ConfigError, match="encoder 'resnet' has no patch tokens to drop; "
                                          "remove its 'patch_dropout' setting"):
        build_encoder({"name": "resnet", "in_channels": 1, "widths": (4,),
                       "patch_dropout": 0.5}, nnx.Rngs(0))


def load_config(spec: str):
    """``configs/clip_vit_b16_pod.py[:variant]`` as ``--config`` loads it (a locked copy)."""
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, flag_values=values, lock_config=True)
    values(["main", f"--config={spec}"])
    return values.config


def test_the_pod_template_variant_sets_it_and_the_tuning_override_clears_it():
    config = load_config(f"{TEMPLATE}:patch_dropout=0.5")
    assert config.model.sample_encoder.patch_dropout == 0.5
    assert load_config(str(TEMPLATE)).model.sample_encoder.patch_dropout == 0.0  # written out
    config.model.sample_encoder.patch_dropout = 0  # what the tuning phase's override sets
    assert config.model.sample_encoder.patch_dropout == 0.0  # the field is a float
    low = load_config(f"{TEMPLATE}:res=112")  # CLIPA's low resolution: 49 patches
    assert low.model.sample_encoder.image_size == low.data.preprocess.image_size == 112
    from test_train import load_config as get_config  # the config file's own ConfigError

    with pytest.raises(ConfigError, match=r"res='big': give the image size in pixels"):
        get_config("clip_vit_b16_pod.py:res=big")
