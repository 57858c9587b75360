"""Position tables moved to another image size or context length (CLIPA's low-resolution
pre-training, then full-resolution tuning; docs/pretrained.md "Starting from pretrained
parameters"): the grid resampling equals open_clip's ``resize_pos_embed`` on a torch-made
fixture (``fixtures/make_position_resampling.py``), and ``model.init_from`` into a model of
another ``image_size`` / a shorter ``max_tokens`` moves only the position tables; a patch size
change, a longer context or a grid that is not square say what to change. ``load_pretrained``
and the importers (``--image_size`` / ``--max_tokens``) move the same tables the same way."""

import json
import pathlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from contrastive_jax.errors import ConfigError
from contrastive_jax.pretrained import load_pretrained
from contrastive_jax.training.models import build_model
from contrastive_jax.training.models.converters import (
    big_vision_import,
    clip_import,
    converted_directory,
    pretrained_source,
)
from contrastive_jax.training.models.position_resampling import (
    resample_grid_positions,
    resized_model,
    truncated_text_positions,
)
from contrastive_jax.training.parameter_paths import leaves_by_path
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
    converted_directory.save_converted(path, block, params, preprocess={
        "mean": list(clip_import.OPENAI_MEAN), "std": list(clip_import.OPENAI_STD),
        "resize": "bicubic", "image_size": 16})
    return path, block, leaves_by_path(params)


def loaded(block, path):
    _, fresh, rest = nnx.split(build_model(block, nnx.Rngs(0)), nnx.Param, ...)
    params, _, lines = init_from.load_into(fresh, rest, block, {"path": str(path)})
    return leaves_by_path(nnx.to_pure_dict(params)), lines


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


def test_load_pretrained_at_another_size_is_init_from_into_that_size(converted):
    """``load_pretrained(image_size=32, max_tokens=12)``: every parameter equal to what
    ``model.init_from`` puts into a model of those sizes, the preprocess resizing to 32, and
    the model embedding 32 x 32 images and 12-token texts."""
    path, block, _ = converted
    target = {**block, "sample_encoder": {**block["sample_encoder"], "image_size": 32},
              "text_encoder": {**block["text_encoder"], "max_tokens": 12}}
    model, preprocess, _ = load_pretrained(path, tokenizer=False, image_size=32, max_tokens=12)
    got = leaves_by_path(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    want, _ = loaded(target, path)
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert preprocess.image_size == 32 and preprocess.mean == tuple(clip_import.OPENAI_MEAN)
    images = jnp.asarray(np.random.default_rng(0).normal(size=(2, 32, 32, 3)), jnp.float32)
    texts = jnp.asarray(np.random.default_rng(1).integers(1, 50, size=(2, 12)), jnp.int32)
    features = nnx.jit(lambda m, x, t: (m.embed_samples(x), m.embed_texts(t)))(model, images,
                                                                              texts)
    assert all(np.isfinite(np.asarray(f)).all() and f.shape[0] == 2 for f in features)
    with pytest.raises(ConfigError, match=r"load_pretrained: image_size 30 is not a multiple "
                                          r"of the model's patch 4"):
        load_pretrained(path, tokenizer=False, image_size=30)


def test_the_importers_write_the_model_at_another_size(converted, tmp_path, capsys):
    """``clip_import --image_size=32 --max_tokens=12`` writes what ``load_pretrained`` moves;
    ``big_vision_import --image_size=24 --max_tokens=6`` on SigLIP (no class token: the whole
    table is the grid) writes the 6 x 6 grid resampled and its pixels at 24; a size that is not
    a multiple of the patch, or a longer context, exits 2 with one line and writes nothing."""
    out = tmp_path / "clip"
    assert clip_import.main([f"--checkpoint={FIXTURES / 'open_clip_tiny_quickgelu.safetensors'}",
                             f"--output={out}", "--quick_gelu=true", "--vision_heads=2",
                             "--text_heads=2", "--image_size=32", "--max_tokens=12"]) == 0
    printed = capsys.readouterr().out
    assert "note: --image_size/--max_tokens: sample_encoder image_size 16 -> 32; " \
           "sample_encoder/positions moved from 17 to 65 positions" in printed, printed
    assert "text_encoder max_tokens 16 -> 12" in printed, printed
    written = json.loads((out / "model.json").read_text())
    assert written["sample_encoder"]["image_size"] == 32
    assert written["text_encoder"]["max_tokens"] == 12
    assert json.loads((out / "preprocess.json").read_text())["image_size"] == 32
    a, _, _ = load_pretrained(out, tokenizer=False)
    b, _, _ = load_pretrained(converted[0], tokenizer=False, image_size=32, max_tokens=12)
    for x, y in zip(jax.tree.leaves(nnx.state(a, nnx.Param)),
                    jax.tree.leaves(nnx.state(b, nnx.Param)), strict=True):
        np.testing.assert_array_equal(x, y)

    siglip = tmp_path / "siglip"
    checkpoint = FIXTURES / "big_vision_tiny_siglip.npz"
    assert big_vision_import.main([f"--checkpoint={checkpoint}", f"--output={siglip}",
                                   "--vision_heads=2", "--text_heads=2", "--image_size=24",
                                   "--max_tokens=6"]) == 0
    assert "moved from 16 to 36 positions" in capsys.readouterr().out
    config, params = pretrained_source.load_converted(siglip)
    source = np.load(checkpoint)
    np.testing.assert_array_equal(np.asarray(params["sample_encoder"]["positions"]),
                                  resample_grid_positions(source["params/img/pos_embedding"],
                                                          36, prefix=0))
    np.testing.assert_array_equal(np.asarray(params["text_encoder"]["positions"]),
                                  source["params/txt/pos_embedding"][:, :6])
    assert config["sample_encoder"]["image_size"] == 24
    assert json.loads((siglip / "preprocess.json").read_text())["image_size"] == 24
    for flag, message in (("--image_size=30", "image_size 30 is not a multiple of the model's "
                                              "patch 4; choose a multiple of 4"),
                          ("--max_tokens=9", "the source has 8 text positions and this model "
                                             "9")):
        bad = tmp_path / flag[2:12]
        assert big_vision_import.main([f"--checkpoint={checkpoint}", f"--output={bad}",
                                       "--vision_heads=2", "--text_heads=2", flag]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
        assert not bad.exists()


def test_a_size_on_a_tower_without_it_is_refused():
    block = {"name": "dual_encoder", "sample_encoder": {"name": "mlp", "hidden": [4]},
             "text_encoder": {"name": "bag_of_words"}}
    with pytest.raises(ConfigError, match=r"resize: image_size changes a 'vit' sample_encoder; "
                                          r"this model's is 'mlp': drop image_size"):
        resized_model(block, {}, image_size=32)
    with pytest.raises(ConfigError, match=r"max_tokens changes a 'text_transformer'"):
        resized_model(block, {}, max_tokens=8)
    same, params, pre, notes = resized_model(block, {"a": 1}, {"image_size": 3})
    assert (same, params, pre, notes) == (block, {"a": 1}, {"image_size": 3}, [])
