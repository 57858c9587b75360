"""Position tables moved to another image size or context length (CLIPA's low-resolution
pre-training, then full-resolution tuning; docs/pretrained.md "Starting from pretrained
parameters"): the grid resampling equals open_clip's ``resize_pos_embed`` on a torch-made
fixture (``fixtures/make_position_resampling.py``), and ``model.init_from`` into a model of
another ``image_size`` / a shorter ``max_tokens`` moves only the position tables; a patch size
change, a longer context or a grid that is not square say what to change."""

import pathlib
import warnings

import numpy as np
import pytest
from flax import nnx

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models import build_model
from contrastive_jax.training.models.converters import (
    clip_import,
    converted_directory,
    open_clip_tensors,
)
from contrastive_jax.training.models.position_resampling import (
    resample_grid_positions,
    truncated_text_positions,
)
from contrastive_jax.training.run import init_from

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"


@pytest.mark.parametrize("grid", [14, 10, 4])
def test_the_grid_resampling_is_open_clips(grid):
    """7 x 7 -> 14 x 14, 10 x 10 (bicubic up) and 4 x 4 (antialiased down), the class row kept:
    torch's ``F.interpolate(bicubic, antialias=True, align_corners=False)`` to 1e-6."""
    fixture = np.load(FIXTURES / "position_resampling.npz")
    got = resample_grid_positions(fixture["source"][None], 1 + grid * grid, prefix=1)
    assert got.shape == (1, 1 + grid * grid, 8) and got.dtype == np.float32
    np.testing.assert_array_equal(got[0, 0], fixture["source"][0])
    np.testing.assert_allclose(got[0], fixture[f"grid_{grid}"], rtol=1e-6, atol=1e-6)
    same = resample_grid_positions(fixture["source"][None], 50, prefix=1)
    np.testing.assert_allclose(same, fixture["source"][None], rtol=1e-6, atol=1e-6)


def test_tables_that_are_not_a_square_grid_or_a_longer_context_are_refused():
    with pytest.raises(ConfigError, match=r"50 position rows minus 0 class-token row.*square"):
        resample_grid_positions(np.zeros((1, 50, 4)), 16, prefix=0)
    with pytest.raises(ConfigError, match=r"16 text positions and this model 20.*max_tokens <= 16"):
        truncated_text_positions(np.zeros((1, 16, 4)), 20)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The open_clip fixture converted: image 16 (a 4 x 4 grid of patches 4), context 16."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # converted from shapes alone: the assumption warning
        block, params = clip_import.convert_checkpoint(
            FIXTURES / "open_clip_tiny_quickgelu.safetensors", quick_gelu=True,
            vision_heads=2, text_heads=2)
    path = tmp_path_factory.mktemp("converted") / "tiny"
    converted_directory.save_converted(path, block, params)
    return path, block, open_clip_tensors.leaves_by_path(params)


def loaded(block, path):
    _, fresh, rest = nnx.split(build_model(block, nnx.Rngs(0)), nnx.Param, ...)
    params, _, lines = init_from.load_into(fresh, rest, block, {"path": str(path)})
    return open_clip_tensors.leaves_by_path(nnx.to_pure_dict(params)), lines


def test_init_from_into_another_image_size_and_a_shorter_context_moves_the_positions(converted):
    """Image 16 -> 32 (4 x 4 -> 8 x 8 patches) and context 16 -> 12: the image positions are
    the resampled table, the text positions its first 12 rows, every other leaf the source's
    bit for bit; the start lines say what moved."""
    path, block, source = converted
    target = {**block, "sample_encoder": {**block["sample_encoder"], "image_size": 32},
              "text_encoder": {**block["text_encoder"], "max_tokens": 12}}
    got, lines = loaded(target, path)
    assert got.keys() == source.keys()
    np.testing.assert_array_equal(got["sample_encoder/positions"], resample_grid_positions(
        source["sample_encoder/positions"], 65, prefix=1))
    np.testing.assert_array_equal(got["text_encoder/positions"],
                                  source["text_encoder/positions"][:, :12])
    for name in source:
        if not name.endswith("/positions"):
            np.testing.assert_array_equal(got[name], source[name], err_msg=name)
    assert any("sample_encoder/positions moved from 17 to 65 positions" in line
               for line in lines), lines
    assert any("text_encoder/positions moved from 16 to 12" in line for line in lines), lines


def test_init_from_refuses_a_patch_change_and_a_longer_context(converted):
    path, block, _ = converted
    patch = {**block, "sample_encoder": {**block["sample_encoder"], "patch": 8}}
    with pytest.raises(ConfigError, match=r"differ at 'sample_encoder\.patch': 4 .* vs 8 here"):
        loaded(patch, path)
    longer = {**block, "text_encoder": {**block["text_encoder"], "max_tokens": 20}}
    with pytest.raises(ConfigError, match=r"text_encoder/positions: the source has 16 text "
                                          r"positions and this model 20.*max_tokens <= 16"):
        loaded(longer, path)
