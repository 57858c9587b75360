"""BatchNorm over groups of the batch (training/models/encoders/ghost_batch_norm.py) against
nnx.BatchNorm run on each group, and MoCo's shuffled keys (training/methods/momentum_contrast.py)
against a by-hand per-group key encoder, in float64; docs/training.md ("SimCLR and MoCo at
ImageNet scale") claims exactly these."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from contrastive_jax.errors import ConfigError
from contrastive_jax.mesh import make_mesh
from contrastive_jax.training import augmentations
from contrastive_jax.training.methods import LossSettings, MethodContext
from contrastive_jax.training.methods.momentum_contrast import MoCo, _view, shuffled_order
from contrastive_jax.training.models import architecture_block, build_model
from contrastive_jax.training.models.encoders.ghost_batch_norm import GhostBatchNorm

C = 3


def _norms(groups: int, **kwargs):
    """A GhostBatchNorm and a plain nnx.BatchNorm with the same (random) scale and bias."""
    ghost = GhostBatchNorm(C, groups=groups, momentum=0.9, epsilon=1e-5, rngs=nnx.Rngs(0),
                           **kwargs)
    plain = nnx.BatchNorm(C, momentum=0.9, epsilon=1e-5, rngs=nnx.Rngs(0), **kwargs)
    rng = np.random.default_rng(1)
    scale, bias = rng.normal(size=C) + 1.0, rng.normal(size=C)
    for module in (ghost, plain):
        module.scale[...] = jnp.asarray(scale, module.scale[...].dtype)
        module.bias[...] = jnp.asarray(bias, module.bias[...].dtype)
        dtype = kwargs.get("param_dtype", jnp.float32)  # the statistics' too
        module.mean = nnx.BatchStat(jnp.asarray([0.5, -0.2, 0.1], dtype))
        module.var = nnx.BatchStat(jnp.asarray([2.0, 0.5, 1.5], dtype))
    return ghost, plain


@pytest.mark.parametrize("shape,groups", [((12, 5, 4, C), 3), ((8, C), 4), ((6, 2, 2, C), 6)])
def test_each_group_is_normalised_as_a_batchnorm_of_its_own(shape, groups):
    """Training mode: the output equals nnx.BatchNorm applied to each group of ``B / G``
    consecutive examples (to 1e-12, float64), the running mean and variance move by the groups'
    mean statistics (the mean of the per-group BatchNorms' new statistics), and the gradients
    with respect to the input, scale and bias equal the per-group BatchNorms'."""
    with jax.enable_x64(True):
        x = jnp.asarray(np.random.default_rng(2).normal(2.0, 3.0, size=shape))
        w = jnp.asarray(np.random.default_rng(3).normal(size=shape))
        ghost, plain = _norms(groups, param_dtype=jnp.float64)
        size = shape[0] // groups

        def ghost_loss(x, module):
            return jnp.sum(module(x, use_running_average=False) * w)

        def plain_loss(x, module):
            parts = []
            for g in range(groups):
                part = nnx.clone(module)  # each group's BatchNorm from the same start
                parts.append((part(x[g * size:(g + 1) * size], use_running_average=False),
                              part))
            y = jnp.concatenate([p for p, _ in parts])
            stats = [(m.mean[...], m.var[...]) for _, m in parts]
            return jnp.sum(y * w), (y, stats)

        y = ghost(x, use_running_average=False)
        want_y, stats = plain_loss(x, plain)[1]
        np.testing.assert_allclose(np.asarray(y), np.asarray(want_y), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.asarray(ghost.mean[...]),
                                   np.mean([np.asarray(m) for m, _ in stats], 0), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(ghost.var[...]),
                                   np.mean([np.asarray(v) for _, v in stats], 0), rtol=1e-12)
        assert not np.allclose(np.asarray(y), np.asarray(plain(x, use_running_average=False)))

        ghost2, plain2 = _norms(groups, param_dtype=jnp.float64)
        gx, gm = nnx.grad(ghost_loss, argnums=(0, 1))(x, ghost2)
        px, pm = nnx.grad(lambda x, m: plain_loss(x, m)[0], argnums=(0, 1))(x, plain2)
        np.testing.assert_allclose(np.asarray(gx), np.asarray(px), rtol=1e-10, atol=1e-12)
        for name in ("scale", "bias"):
            np.testing.assert_allclose(np.asarray(getattr(gm, name)[...]),
                                       np.asarray(getattr(pm, name)[...]), rtol=1e-10)


def test_one_group_and_evaluation_are_nnx_batchnorm():
    """``groups = 1`` is nnx.BatchNorm's own call (the same outputs and statistics, bit for
    bit); in evaluation every group count uses the running statistics, as nnx.BatchNorm."""
    x = jnp.asarray(np.random.default_rng(4).normal(size=(8, 4, C)), jnp.float32)
    ghost, plain = _norms(1)
    np.testing.assert_array_equal(np.asarray(ghost(x, use_running_average=False)),
                                  np.asarray(plain(x, use_running_average=False)))
    np.testing.assert_array_equal(np.asarray(ghost.var[...]), np.asarray(plain.var[...]))
    ghost, plain = _norms(4)
    np.testing.assert_array_equal(np.asarray(ghost(x, use_running_average=True)),
                                  np.asarray(plain(x, use_running_average=True)))
    np.testing.assert_array_equal(np.asarray(ghost.mean[...]),
                                  np.float32([0.5, -0.2, 0.1]))  # unmoved


def test_bad_group_counts_say_what_to_change():
    for bad in (0, -2, 2.5, True, "4"):
        with pytest.raises(ConfigError, match=r"bn_groups must be an int >= 1"):
            GhostBatchNorm(C, groups=bad, rngs=nnx.Rngs(0))
    ghost, _ = _norms(4)
    with pytest.raises(ConfigError, match=r"a batch of 6 examples does not split into "
                                          r"bn_groups = 4 groups.*multiple of bn_groups"):
        ghost(jnp.ones((6, C)), use_running_average=False)
    with pytest.raises(ConfigError, match=r"bn_groups must be an int >= 1"):
        build_model(architecture_block({"name": "projected_encoder", "encoder": {
            "name": "resnet", "in_channels": 3, "widths": (4,), "bn_groups": 0},
            "head": {"hidden": 4, "out": 4, "layers": 2, "batch_norm": False}}), nnx.Rngs(0))


def _moco_model(groups: int):
    block = {"name": "projected_encoder",
             "encoder": {"name": "resnet", "in_channels": 3, "widths": (4, 8), "features": 6,
                         "bn_groups": groups},
             "head": {"hidden": 8, "out": 5, "layers": 2, "batch_norm": False}}
    return build_model(architecture_block(block), nnx.Rngs(0))


def test_moco_keys_are_encoded_in_shuffled_groups():
    """With ``bn_groups = 2`` MoCo's key encoder sees view 2 in :func:`shuffled_order`: each
    returned key (put back in the batch's order) equals the key encoder with one BatchNorm per
    group run by hand on the examples that order puts in its group (float64, 1e-12), its
    BatchNorm statistics the groups' mean; the order is a permutation that depends on the
    examples' keys only; without groups nothing is shuffled."""
    b = 8
    with jax.enable_x64(True):
        model = _moco_model(2)
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        params, rest = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), (params, rest))
        method = MoCo(loss_settings=None, queue_size=16, shuffle_keys=True)
        ctx = MethodContext(loss=LossSettings(name="moco", temperature=0.2),
                            mesh=make_mesh({"data": 1}, jax.devices()[:1]), input_key="image",
                            text_key="caption", graphdef=graphdef,
                            augment=ml_collections.FrozenConfigDict(
                                augmentations.recipe_augment_config("moco_v2", 8)))
        extra = {"key_params": params, "key_rest": rest}
        keys = jax.random.split(jax.random.key(5), b)
        batch = {"image": jnp.asarray(np.random.default_rng(6).uniform(size=(b, 8, 8, 3)))}
        targets, new_extra = method.targets(batch, keys, extra, ctx)

        order = np.asarray(shuffled_order(keys))
        assert sorted(order.tolist()) == list(range(b)) and order.tolist() != list(range(b))
        np.testing.assert_array_equal(np.asarray(shuffled_order(keys[::-1])), b - 1 - order)

        from contrastive_jax.training.methods.base import example_keys
        aug_keys, dropout_keys = example_keys(keys)
        v2 = _view(batch["image"], aug_keys, 1, ctx)
        plain_def = nnx.split(_moco_model(1), nnx.Param, ...)[0]
        want = np.zeros((b, 5))
        means = []
        for group in (order[:b // 2], order[b // 2:]):
            plain = nnx.merge(plain_def, params, rest, copy=True)
            k, _ = plain(v2[group], train=True, dropout_keys=dropout_keys[group])
            want[group] = np.asarray(k)
            means.append(np.asarray(plain.encoder.stem_norm.mean[...]))
        np.testing.assert_allclose(np.asarray(targets["keys"]), want, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(
            np.asarray(new_extra["key_rest"]["encoder"]["stem_norm"]["mean"][...]),
            np.mean(means, 0), rtol=1e-12)
        unshuffled = MoCo(loss_settings=None, queue_size=16).targets(batch, keys, extra, ctx)
        assert not np.allclose(np.asarray(unshuffled[0]["keys"]), want)
