"""Our ResNet (contrastive_jax.training.models.encoders.resnet) computes torchvision's resnet18
and resnet50 forward pass given the same weights.

tests/fixtures/make_torchvision_resnet_fixture.py set every tensor of torchvision's
``resnet18()`` and ``resnet50()`` state dicts (BatchNorm running statistics included) to
arrays drawn by a rule from the tensor's name (``tensor_for``, imported from that script here:
no PyTorch is needed), replaced ``fc`` by ``Identity``, and wrote the float64 eval-mode
outputs (the pooled last stage) for fixed inputs of 64x64 and 67x45 pixels, with every key and
shape of the state dicts. Here the same weights, converted by :func:`our_path` /
:func:`to_ours`, go into our ``ResNet(depth, features=0)``: the float64 forward pass equals
torchvision's to 1e-10 relative, the float32 one to 1e-5; the converter covers every torch key
exactly once; and the comparison does see a padding or kernel-orientation change.
"""

import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from contrastive_jax.training.models.encoders.resnet import ResNet

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
REFERENCE = FIXTURES / "torchvision_resnet.npz"
_spec = importlib.util.spec_from_file_location(
    "make_torchvision_resnet_fixture", FIXTURES / "make_torchvision_resnet_fixture.py")
generator = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(generator)

# Blocks per stage (layer1..layer4) of torchvision's resnet<depth>.
STAGE_BLOCKS = {18: (2, 2, 2, 2), 50: (3, 4, 6, 3)}
NORM_LEAVES = {"weight": "scale", "bias": "bias", "running_mean": "mean", "running_var": "var"}
SIZES = tuple(generator.SIZES)


def our_path(key: str, depth: int) -> tuple | None:
    """Where torchvision's state-dict ``key`` of ``resnet<depth>`` lives in our ResNet's
    state (``None``: ``fc``, which ``features=0`` has not, and BatchNorm's
    ``num_batches_tracked``, which eval mode does not read). ``layer<i>.<j>`` is block
    ``sum(blocks of layers < i) + j``; ``conv<k>`` -> ``conv<k>``, ``bn<k>`` -> ``norm<k>``,
    ``downsample.0`` -> ``project``, ``downsample.1`` -> ``project_norm``."""
    parts = key.split(".")
    if parts[0] == "fc" or parts[-1] == "num_batches_tracked":
        return None
    module, leaf = parts[:-1], parts[-1]
    if module[0] in ("conv1", "bn1"):
        prefix, module = ("stem" if module[0] == "conv1" else "stem_norm",), module[1:]
    else:
        stage, j = int(module[0].removeprefix("layer")), int(module[1])
        if not 0 <= j < STAGE_BLOCKS[depth][stage - 1]:
            raise KeyError(key)
        name = ".".join(module[2:])
        name = {"downsample.0": "project", "downsample.1": "project_norm"}.get(
            name, name.replace("bn", "norm"))
        prefix, module = ("blocks", sum(STAGE_BLOCKS[depth][:stage - 1]) + j, name), ()
    if module:
        raise KeyError(key)
    return (*prefix, NORM_LEAVES[leaf] if "norm" in prefix[-1] else {"weight": "kernel"}[leaf])


def to_ours(value: np.ndarray) -> np.ndarray:
    """A torch tensor as our parameter: convolution kernels OIHW -> HWIO, the rest as is."""
    return value.transpose(2, 3, 1, 0) if value.ndim == 4 else value


def torch_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The torch shape of our parameter's ``shape`` (:func:`to_ours` undone)."""
    return (shape[3], shape[2], shape[0], shape[1]) if len(shape) == 4 else tuple(shape)


def reference() -> dict:
    return dict(np.load(REFERENCE))


def torch_keys(depth: int) -> dict[str, tuple[int, ...]]:
    """Every key of torchvision's ``resnet<depth>`` state dict and its shape."""
    ref = reference()
    return {str(k): tuple(int(n) for n in s if n >= 0)
            for k, s in zip(ref[f"resnet{depth}_keys"], ref[f"resnet{depth}_shapes"],
                            strict=True)}


def leaves(tree) -> dict[tuple, object]:
    """``{path: leaf}`` of a pure dict (``nnx.to_pure_dict``)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {tuple(k.key for k in path): leaf for path, leaf in flat}


def abstract_model(depth: int) -> ResNet:
    return nnx.eval_shape(lambda: ResNet(depth=depth, features=0, rngs=nnx.Rngs(0)))


def converted(depth: int, dtype, transform=to_ours) -> ResNet:
    """Our ``ResNet(depth, features=0)`` holding the fixture's torchvision weights in
    ``dtype`` (built with shapes only, then every parameter and statistic set)."""
    model = abstract_model(depth)
    state = nnx.state(model)
    ours = leaves(nnx.to_pure_dict(state))
    values = {}
    for key in torch_keys(depth):
        path = our_path(key, depth)
        if path is not None:
            value = transform(generator.tensor_for(key, torch_shape(ours[path].shape), depth))
            values[path] = jnp.asarray(value, dtype)
    assert values.keys() == ours.keys()
    pure = {}
    for path, value in values.items():
        node = pure
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = value
    nnx.replace_by_pure_dict(state, pure)
    nnx.update(model, state)
    return model


@nnx.jit
def pooled(model, images):
    """The eval-mode forward pass: ``(B, H, W, 3)`` -> ``(B, channels)``."""
    return model(images, train=False)


def rel_error(ours, ref) -> float:
    """``max |ours - ref| / max |ref|``."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


def errors(model, depth: int, dtype) -> dict[str, float]:
    """The relative error of ``model``'s output against torchvision's, per input size."""
    ref = reference()
    out = {}
    for size in SIZES:
        y = pooled(model, jnp.asarray(ref[f"images_{size}"], dtype))
        assert y.dtype == dtype and y.shape == ref[f"resnet{depth}_{size}"].shape
        out[size] = rel_error(y, ref[f"resnet{depth}_{size}"])
    return out


@pytest.mark.parametrize("depth", [18, 50])
def test_converter_covers_every_torch_key_exactly_once(depth):
    """Every key of torchvision's state dict but ``fc`` and ``num_batches_tracked`` goes to a
    distinct leaf of our state, every leaf gets one, and the shapes agree through the
    transpose."""
    keys = torch_keys(depth)
    paths = {key: our_path(key, depth) for key in keys}
    dropped = sorted(k for k, p in paths.items() if p is None)
    tracked = [k for k in dropped if k.endswith(".num_batches_tracked")]
    assert sorted(set(dropped) - set(tracked)) == ["fc.bias", "fc.weight"]
    for key in tracked:  # one per BatchNorm, and that BatchNorm converted
        assert paths[key.replace("num_batches_tracked", "running_var")] is not None
    mapped = [p for p in paths.values() if p is not None]
    assert len(mapped) == len(set(mapped))
    ours = leaves(nnx.to_pure_dict(nnx.state(abstract_model(depth))))
    assert set(mapped) == set(ours)
    for key, path in paths.items():
        if path is not None:
            assert torch_shape(ours[path].shape) == keys[key], key
    n_blocks = sum(STAGE_BLOCKS[depth])
    assert {p[1] for p in mapped if p[0] == "blocks"} == set(range(n_blocks))


@pytest.mark.parametrize("depth", [18, 50])
def test_float64_forward_equals_torchvision(depth):
    """float64: within 1e-10 of torchvision's float64 output, at 64x64 and at 67x45
    (measured 6.6e-16 to 9.6e-16: the same sums in another order)."""
    with jax.enable_x64(True):
        errs = errors(converted(depth, jnp.float64), depth, jnp.float64)
    assert max(errs.values()) < 1e-10, errs


@pytest.mark.parametrize("depth", [18, 50])
def test_float32_forward_within_float32_rounding_of_torchvision(depth):
    """float32 (weights rounded to float32, the inputs already are): within 1e-5 of
    torchvision's float64 output (measured 2.9e-7 to 3.2e-7 for resnet18, 3.6e-7 to 4.2e-7
    for resnet50: float32 rounding through 18 or 50 layers)."""
    errs = errors(converted(depth, jnp.float32), depth, jnp.float32)
    assert max(errs.values()) < 1e-5, errs


def test_the_comparison_sees_a_padding_or_kernel_orientation_change():
    """The fixture is no fixed point: flax's default "SAME" padding on the stem (2 before, 3
    after at 64x64, where torch pads 3 and 3) or spatially flipped kernels (a convolution
    where torch cross-correlates) move resnet18's output by far more than the tolerances. At
    67x45 "SAME" pads the stem 3 and 3 like torch (odd sizes), hence both sizes."""
    with jax.enable_x64(True):
        model = converted(18, jnp.float64)
        model.stem.padding = "SAME"
        same = errors(model, 18, jnp.float64)
        flipped = errors(converted(18, jnp.float64,
                                   transform=lambda v: to_ours(v)[::-1, ::-1]
                                   if v.ndim == 4 else v), 18, jnp.float64)
    assert same["64x64"] > 1e-2 and same["67x45"] < 1e-10, same
    assert min(flipped.values()) > 1e-2, flipped
