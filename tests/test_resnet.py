"""The ImageNet ResNets (encoders/resnet.py): sizes, torchvision's layout, the width multiplier,
zero-initialised residuals, remat, bf16, and the errors of bad settings. Equality with
torchvision's forward given the same weights: tests/test_resnet_torchvision.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models import build_encoder, with_defaults
from contrastive_jax.training.models.encoders.resnet import (
    DEPTHS,
    TOTAL_STRIDE,
    Bottleneck,
    ResNet,
)


def parameter_count(**settings) -> int:
    """Parameters of ``ResNet(**settings)``, from shapes alone (nothing allocated)."""
    abstract = nnx.eval_shape(lambda: ResNet(**settings, rngs=nnx.Rngs(0)))
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


# torchvision's resnet{18,34,50,101,152} parameter counts (its model cards: 11,689,512,
# 21,797,672, 25,557,032, 44,549,160, 60,192,808) less the 1000-way fc layer (513,000 for
# 512 features, 2,049,000 for 2048)
TORCHVISION_WITHOUT_FC = {18: 11_176_512, 34: 21_284_672, 50: 23_508_032, 101: 42_500_160,
                          152: 58_143_808}


@pytest.mark.parametrize("depth", sorted(DEPTHS))
def test_each_depth_has_torchvisions_parameter_count_and_features(depth):
    """Every depth builds torchvision's network: the same number of parameters (fc excluded)
    and 512 (basic) or 2048 (bottleneck) pooled features."""
    assert parameter_count(depth=depth) == TORCHVISION_WITHOUT_FC[depth]
    abstract = nnx.eval_shape(lambda: ResNet(depth=depth, rngs=nnx.Rngs(0)))
    assert abstract.features == (512 if depth < 50 else 2048)
    assert len(abstract.blocks) == sum(DEPTHS[depth][1])


def test_width_multiplier_scales_every_layer_as_simclrs_wide_resnets():
    """SimCLR's ResNet-50 (2x) and (4x) ([SimCLR] Table B.1: 94M and 375M parameters): every
    convolution's channels scaled, so the pooled features are 2048 w; with a linear layer of
    ``features`` outputs on top."""
    assert parameter_count(depth=50, width_multiplier=2) == 93_907_072
    assert round(parameter_count(depth=50, width_multiplier=4) / 1e6) == 375
    wide = nnx.eval_shape(lambda: ResNet(depth=50, width_multiplier=2, features=128,
                                         rngs=nnx.Rngs(0)))
    assert wide.pooled_features == 4096 and wide.features == 128
    assert wide.stem.kernel.shape == (7, 7, 3, 128)


def test_forward_shapes_strides_and_the_bottleneck_stride_on_its_3x3():
    """Total stride 32 (a 64 x 64 image reaches the last stage as 2 x 2), the stride of a
    down-sampling bottleneck on its 3x3 convolution (torchvision's v1.5), output features."""
    model = ResNet(depth=50, rngs=nnx.Rngs(0))
    first_of_stage2 = model.blocks[3]
    assert isinstance(first_of_stage2, Bottleneck)
    assert first_of_stage2.conv1.strides in (1, (1, 1))
    assert first_of_stage2.conv2.strides in (2, (2, 2))
    assert first_of_stage2.project.strides in (2, (2, 2))
    x = jax.random.normal(jax.random.key(0), (2, 64, 96, 3))
    trace = []
    h = nnx.relu(model.stem_norm(model.stem(x), use_running_average=True))
    h = nnx.max_pool(h, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    for block in model.blocks:
        h = block(h, train=False)
        trace.append(h.shape[1:])
    assert trace[-1] == (64 // TOTAL_STRIDE, 96 // TOTAL_STRIDE, 2048)
    out = model(x, train=False)
    np.testing.assert_allclose(out, jnp.mean(h, axis=(1, 2)), rtol=1e-6)


def test_zero_init_residual_starts_every_block_as_its_shortcut():
    """``zero_init_residual``: the last BatchNorm of each block has scale 0, so a block
    without a projection returns ``relu(x)`` (x itself after a ReLU) and the training-mode
    forward still moves the statistics."""
    model = ResNet(depth=18, zero_init_residual=True, rngs=nnx.Rngs(0))
    plain = ResNet(depth=18, rngs=nnx.Rngs(0))
    assert np.all(model.blocks[0].norm2.scale[...] == 0)
    assert np.all(plain.blocks[0].norm2.scale[...] == 1)
    x = nnx.relu(jax.random.normal(jax.random.key(0), (2, 8, 8, 64)))
    np.testing.assert_array_equal(model.blocks[1](x, train=True), x)
    assert not np.allclose(plain.blocks[1](x, train=True), x)


def test_remat_and_bfloat16_compute_the_same_function():
    """Each block rematerialised: the same loss and gradients (float32); bf16 compute: within
    bf16's rounding of the float32 features, BatchNorm statistics kept float32."""
    x = jax.random.normal(jax.random.key(0), (4, 32, 32, 3))

    def loss_and_grad(**settings):
        model = ResNet(depth=18, rngs=nnx.Rngs(0), **settings)

        def loss(model):
            return jnp.sum(model(x, train=True).astype(jnp.float32) ** 2)

        return nnx.value_and_grad(loss)(model)

    (value, grads), (value_r, grads_r) = (loss_and_grad(),
                                          loss_and_grad(remat_policy="nothing_saveable"))
    np.testing.assert_allclose(value_r, value, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(grads_r), jax.tree.leaves(grads), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    half = ResNet(depth=18, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    out = half(x, train=False)
    assert out.dtype == jnp.bfloat16 and half.stem_norm.mean[...].dtype == jnp.float32
    full = ResNet(depth=18, rngs=nnx.Rngs(0))(x, train=False)
    error = np.linalg.norm(np.asarray(out, np.float32) - full) / np.linalg.norm(full)
    assert 1e-4 < error < 0.02  # bf16's rounding, not float32's


@pytest.mark.parametrize("settings,message", [
    ({"depth": 42}, r"ResNet depth 42 does not exist; use one of \[18, 34, 50, 101, 152\]"),
    ({"depth": 50, "width_multiplier": 0}, "width_multiplier must be an int >= 1"),
    ({"depth": 50, "width_multiplier": 1.5}, "width_multiplier must be an int >= 1"),
    ({"width_multiplier": 2}, "width_multiplier and stem apply to the ImageNet ResNet: set"),
    ({"depth": 18, "stem": "tiny"}, r"stem must be one of \['imagenet', 'cifar'\]"),
])
def test_bad_settings_say_what_to_change(settings, message):
    with pytest.raises(ConfigError, match=message):
        build_encoder({"name": "resnet", **settings}, nnx.Rngs(0))


def test_an_image_smaller_than_the_total_stride_is_refused_at_the_config_and_the_call():
    """The plan and the trainer read the input shape from the config (an error before
    anything is built); a direct call with a smaller image says the same."""
    block = with_defaults({"name": "resnet", "depth": 50})
    assert ResNet.input_shape(block, 32) == (32, 32, 3)
    with pytest.raises(ConfigError, match="image_size = 16 is too small; use images of at "
                                          "least 32 pixels"):
        ResNet.input_shape(block, 16)
    model = ResNet(depth=18, rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match="images of 16x40 are too small"):
        model(jnp.ones((1, 16, 40, 3)), train=False)


def test_the_cifar_stem_keeps_32_pixel_images_at_4x4_in_the_last_stage():
    """SimCLR's CIFAR ResNet ([SimCLR] Appendix B.9): a 3x3 stride-1 stem, no max pool, so
    total stride 8; the rest of the network (and its parameters but the stem's) unchanged."""
    cifar = ResNet(depth=18, stem="cifar", rngs=nnx.Rngs(0))
    assert cifar.stem.kernel.shape == (3, 3, 3, 64)
    assert (parameter_count(depth=18) - parameter_count(depth=18, stem="cifar")
            == (7 * 7 - 3 * 3) * 3 * 64)
    h = nnx.relu(cifar.stem_norm(cifar.stem(jnp.ones((1, 32, 32, 3))), use_running_average=True))
    for block in cifar.blocks:
        h = block(h, train=False)
    assert h.shape == (1, 4, 4, 512)
    assert ResNet.input_shape(with_defaults({"name": "resnet", "depth": 18, "stem": "cifar"}),
                              8) == (8, 8, 3)
