"""The image host pipeline: decode (JPEGs at reduced size), crop, resize to uint8 on the host;
the cast and mean/std normalisation on the device; grain worker processes with the same batches
and the same resume as threads."""

import dataclasses
import io
import itertools
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from PIL import Image
from test_convert_shards import good, write_tar

from contrastive_jax.errors import ConfigError, DataError
from contrastive_jax.training.augmentations.pixels import (
    CLIP_MEAN,
    CLIP_STD,
    model_input,
    normalize,
    pixel_normalization,
    unit_range,
)
from contrastive_jax.training.data import convert_shards, image_crops
from contrastive_jax.training.data.example_preprocessing import (
    image_text_preprocess,
    make_preprocess,
)
from contrastive_jax.training.data.pipeline import HostShard, eval_dataset, train_dataset
from contrastive_jax.training.data.sources import open_split


def smooth_image(width: int, height: int, seed: int) -> np.ndarray:
    """A smooth random RGB field (so that JPEG keeps it well and resizes agree)."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
    return np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC))


def jpeg(array: np.ndarray, quality: int = 95) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def shards_dataset(tmp_path_factory):
    """A dataset converted from one tar of 12 JPEGs of several sizes: ``(data_dir, name)``."""
    folder = tmp_path_factory.mktemp("image_input")
    members = [m for i in range(12) for m in good(f"k{i:02d}", i, size=(40 + 4 * i, 30 + 2 * i))]
    write_tar(folder / "00000.tar", members)
    assert convert_shards.main([f"--input={folder / '00000.tar'}", f"--data_dir={folder}",
                                "--name=tiny_shards", "--workers=1"]) == 0
    return str(folder), "tiny_shards"


def test_center_crop_of_bytes_equals_the_crop_of_the_decoded_array():
    array = smooth_image(60, 40, 0)
    data = jpeg(array)
    decoded = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    for resize in ("bicubic", "bilinear"):
        from_bytes = image_crops.center_crop(data, 16, resize=resize)
        np.testing.assert_array_equal(from_bytes, image_crops.center_crop(decoded, 16,
                                                                          resize=resize))
        assert from_bytes.shape == (16, 16, 3) and from_bytes.dtype == np.uint8
    # torchvision's sizes: 60 x 40 -> 24 x 16 (int(16 * 60 / 40)), offset round(8 / 2) = 4
    resized = np.asarray(Image.fromarray(decoded).resize((24, 16), Image.BICUBIC))
    np.testing.assert_array_equal(image_crops.center_crop(decoded, 16), resized[:, 4:20])
    with pytest.raises(ConfigError, match=r"resize 'nearest'; valid: \['bicubic', 'bilinear'\]"):
        image_crops.center_crop(decoded, 16, resize="nearest")
    with pytest.raises(DataError, match="cannot be decoded"):
        image_crops.center_crop(b"not an image", 16)


def test_reduced_decode_reads_a_smaller_jpeg_that_still_covers_the_crop():
    array = smooth_image(640, 480, 1)
    data = jpeg(array)
    # the crop is the 480 x 480 centre: for 64 output pixels, 1/4 scale (120 >= 64) but not 1/8
    pil, box = image_crops._decode(Image.open(io.BytesIO(data)), (80, 0, 480, 480), 64, True)
    assert pil.size == (160, 120) and box == (20, 0, 120, 120)
    full, _ = image_crops._decode(Image.open(io.BytesIO(data)), (80, 0, 480, 480), 64, False)
    assert full.size == (640, 480)
    # a small crop box keeps more resolution: 100 px box -> 64 needs scale >= 0.64: 1/1
    pil, _ = image_crops._decode(Image.open(io.BytesIO(data)), (0, 0, 100, 100), 64, True)
    assert pil.size == (640, 480)
    # the pixels: close to the full decode's (the decoder's downscaling, not an upsampling)
    fast = image_crops.center_crop(data, 64, reduced_decode=True).astype(np.float64)
    slow = image_crops.center_crop(data, 64, reduced_decode=False).astype(np.float64)
    assert np.abs(fast - slow).mean() < 2.0 and np.abs(fast - slow).max() < 24
    # PNG has no reduced decode: bit-identical either way
    png = io.BytesIO()
    Image.fromarray(array).save(png, format="PNG")
    np.testing.assert_array_equal(image_crops.center_crop(png.getvalue(), 64, reduced_decode=True),
                                  image_crops.center_crop(array, 64))


def test_crop_box_follows_torchvision_sampler():
    rng = np.random.default_rng(0)
    for _ in range(200):
        left, top, w, h = image_crops.crop_box(300, 200, rng, (0.3, 0.9), (3 / 4, 4 / 3))
        assert 0 <= left and left + w <= 300 and 0 <= top and top + h <= 200
        assert 0.3 - 0.02 <= w * h / (300 * 200) <= 0.9 + 0.02  # rounding to whole pixels
        assert 3 / 4 - 0.02 <= w / h <= 4 / 3 + 0.02
    # the same generator state draws the same box
    a = image_crops.crop_box(300, 200, np.random.default_rng((5, 7)), (0.9, 1.0), (0.75, 1.33))
    b = image_crops.crop_box(300, 200, np.random.default_rng((5, 7)), (0.9, 1.0), (0.75, 1.33))
    assert a == b
    # no box of ratio 2 and the whole area fits a square: the fallback, the centred 100 x 50
    assert image_crops.crop_box(100, 100, rng, (1.0, 1.0), (2.0, 2.0)) == (0, 25, 100, 50)
    # the whole image at its own ratio is the identity box; its crop is a plain resize
    array = smooth_image(48, 32, 2)
    whole = image_crops.random_resized_crop(array, 16, rng, scale=(1.0, 1.0), ratio=(1.5, 1.5))
    np.testing.assert_array_equal(
        whole, np.asarray(Image.fromarray(array).resize((16, 16), Image.BICUBIC)))
    for field, bad in (("crop_scale", (0.5, 1.5)), ("crop_scale", (0.0, 1.0)),
                       ("crop_ratio", (2.0, 1.0)), ("crop_scale", "wide")):
        with pytest.raises(ConfigError, match=rf"data\.preprocess\.{field}"):
            image_text_preprocess(image_size=8, **{field: bad})


def test_pixel_normalization_reads_and_checks_the_config():
    assert pixel_normalization({"name": "image_text"}) is None
    assert pixel_normalization({"mean": CLIP_MEAN, "std": list(CLIP_STD)}) == (CLIP_MEAN,
                                                                               CLIP_STD)
    for block, match in (({"mean": CLIP_MEAN}, "both"),
                         ({"mean": (0.5,), "std": (0.2, 0.2)}, "1 channels and .std 2"),
                         ({"mean": (0.5,), "std": (0.0,)}, "positive"),
                         ({"mean": "clip", "std": (0.2,)}, "list of per-channel numbers")):
        with pytest.raises(ConfigError, match=match):
            pixel_normalization(block)
    x = np.arange(2 * 3, dtype=np.uint8).reshape(1, 2, 3) * 40
    got = model_input(jnp.asarray(x), (CLIP_MEAN, CLIP_STD))
    want = (x.astype(np.float64) / 255 - np.asarray(CLIP_MEAN)) / np.asarray(CLIP_STD)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)
    assert got.dtype == jnp.float32
    floats = jnp.full((2, 2, 3), 0.25, jnp.float32)  # the standard preprocessing's [0, 1] images
    assert unit_range(floats) is floats and normalize(floats, None) is floats


def test_a_clip_step_on_uint8_images_equals_the_step_on_images_normalised_on_the_host():
    from test_train import load_config

    from contrastive_jax.mesh import make_mesh
    from contrastive_jax.training.methods import method_for
    from contrastive_jax.training.step.train_state import create_state
    from contrastive_jax.training.step.train_step import make_context

    config = load_config("clip_vit_b16_pod.py:tiny")
    config.model.dtype = "float32"
    config.model.remat = False
    config.augment = None
    method = method_for(config)
    graphdef, state, _ = create_state(config, 2, method)
    mesh = make_mesh({"data": 8}, jax.devices())
    ctx = make_context(config, mesh, graphdef, method)
    assert ctx.pixels == (tuple(CLIP_MEAN), tuple(CLIP_STD))
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (8, 32, 32, 3), dtype=np.uint8)
    captions = rng.integers(0, 64, (8, 12), dtype=np.int32)
    keys = jax.random.split(jax.random.key(0), 8)
    net = nnx.merge(graphdef, state.params, state.rest)
    on_device = method.embed(net, {"image": jnp.asarray(images), "caption": captions}, keys, ctx)
    host = (images / np.float32(255) - np.float32(CLIP_MEAN)) / np.float32(CLIP_STD)
    plain = dataclasses.replace(ctx, pixels=None)
    on_host = method.embed(net, {"image": jnp.asarray(host, jnp.float32), "caption": captions},
                           keys, plain)
    for key in ("x", "y"):
        np.testing.assert_allclose(np.asarray(on_device[key]), np.asarray(on_host[key]),
                                   rtol=2e-5, atol=2e-6)
    unnormalised = method.embed(net, {"image": jnp.asarray(images), "caption": captions}, keys,
                                plain)
    assert np.abs(np.asarray(unnormalised["x"]) - np.asarray(on_device["x"])).max() > 1e-3


def _preprocess(training: bool, **preprocess):
    import ml_collections

    config = ml_collections.ConfigDict({
        "seed": 3, "features": None, "preprocess": {
            "name": "image_text", "image_size": 16, "max_tokens": 6, "crop": "random",
            "crop_scale": (0.3, 1.0), "mean": CLIP_MEAN, "std": CLIP_STD, **preprocess}})
    return make_preprocess(config, training=training)


def test_random_crops_depend_on_the_stream_position_only(shards_dataset):
    data_dir, name = shards_dataset
    source = open_split(name, "train", data_dir, encoded_images=("image",))
    assert isinstance(source[0]["image"], bytes)  # decoded by the preprocessing
    train = _preprocess(training=True)
    evaluate = _preprocess(training=False)
    first = train(source[0], epoch=0, position=0)["image"]
    np.testing.assert_array_equal(first, train(source[0], epoch=0, position=0)["image"])
    later = train(source[0], epoch=1, position=12)["image"]
    centre = evaluate(source[0])["image"]
    assert first.shape == later.shape == centre.shape == (16, 16, 3)
    assert not np.array_equal(first, later) and not np.array_equal(first, centre)
    # evaluation is the centre crop whatever the position
    np.testing.assert_array_equal(centre, evaluate(source[0], position=5)["image"])


def _rows(batches, key="image"):
    return [sorted(bytes(row) for row in np.asarray(b[key]).reshape(len(b[key]), -1))
            for b in batches]


def test_worker_processes_give_the_threads_batches_and_resume_exactly(shards_dataset):
    data_dir, name = shards_dataset
    source = open_split(name, "train", data_dir, encoded_images=("image",))
    train = _preprocess(training=True)

    def stream(workers: int, shard: HostShard | None = None):
        return train_dataset(source, global_batch_size=4, seed=0, num_epochs=2,
                             shard=shard or HostShard(0, 1),
                             preprocess=train, worker_count=workers)

    threads = list(stream(0))
    assert len(threads) == 6 and threads[0]["image"].dtype == np.uint8
    # two processes: each global batch holds the same examples, cropped alike
    halves = [list(stream(0, HostShard(p, 2))) for p in range(2)]
    merged = [{"image": np.concatenate([h0["image"], h1["image"]])}
              for h0, h1 in zip(*halves, strict=True)]
    assert _rows(merged) == _rows(threads)
    # two workers: the threads' batches; a resume from a saved state gives the same next ones
    iterator = iter(stream(2))
    workers = [next(iterator) for _ in range(2)]
    state = json.loads(json.dumps(iterator.get_state()))  # what a checkpoint stores
    workers += list(iterator)
    iterator.close()
    resumed = iter(stream(2))
    resumed.set_state(state)
    again = list(resumed)
    resumed.close()
    for a, b in zip(threads, workers, strict=True):
        for key in ("image", "caption"):
            np.testing.assert_array_equal(a[key], b[key])
    assert len(again) == 4
    for a, b in zip(threads[2:], again, strict=True):
        np.testing.assert_array_equal(a["image"], b["image"])
    evaluation = _preprocess(training=False)
    one = list(eval_dataset(source, global_batch_size=8, shard=HostShard(0, 1),
                            preprocess=evaluation))
    two = list(eval_dataset(source, global_batch_size=8, shard=HostShard(0, 1),
                            preprocess=evaluation, worker_count=2))
    assert len(one) == len(two) == math.ceil(12 / 8)
    for a, b in zip(one, two, strict=True):
        np.testing.assert_array_equal(a["image"], b["image"])
        np.testing.assert_array_equal(a["mask"], b["mask"])
    with pytest.raises(ConfigError, match=r"data\.worker_count must be an integer >= 0"):
        stream(-1)


def test_pod_template_reads_uint8_with_clip_normalisation():
    from test_train import load_config

    config = load_config("clip_vit_b16_pod.py")
    pre = config.data.preprocess
    assert (pre.resize, pre.crop, tuple(pre.crop_scale)) == ("bicubic", "random", (0.9, 1.0))
    assert pixel_normalization(pre) == (CLIP_MEAN, CLIP_STD)
    assert config.augment.resized_crop == 0.0  # the host crops; the device only flips
    # worker processes on a pod host (docs/benchmarks.md "Image input"); none for the tiny run
    assert config.data.worker_count == 24
    assert load_config("clip_vit_b16_pod.py:tiny").data.worker_count == 0


def test_a_run_from_a_converted_clip_takes_its_mean_and_std(tmp_path):
    from test_train import load_config

    from contrastive_jax.training.models.converters import clip_import
    from contrastive_jax.training.run_spec import source_pixels

    assert clip_import.OPENAI_MEAN == CLIP_MEAN and clip_import.OPENAI_STD == CLIP_STD
    converted = tmp_path / "clip"
    (converted / "params").mkdir(parents=True)
    (converted / "model.json").write_text("{}")
    (converted / "preprocess.json").write_text(json.dumps(
        {"mean": list(CLIP_MEAN), "std": list(CLIP_STD), "resize": "bicubic",
         "image_size": 224}))
    config = load_config("clip_vit_b16_pod.py:tiny")
    del config.data.preprocess["mean"], config.data.preprocess["std"]
    config.model.init_from = {"path": str(converted)}
    filled, lines = source_pixels(config)
    assert pixel_normalization(filled.data.preprocess) == (CLIP_MEAN, CLIP_STD)
    assert "mean" not in config.data.preprocess  # the caller's config is not changed
    assert len(lines) == 1 and "preprocess.json" in lines[0]
    # a config that sets its own values keeps them, with a warning
    config.data.preprocess.update({"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)})
    kept, lines = source_pixels(config)
    assert pixel_normalization(kept.data.preprocess) == ((0.5,) * 3, (0.5,) * 3)
    assert lines and lines[0].startswith("warning: data.preprocess mean/std")
    # a workdir or a directory without the file: nothing to take
    (converted / "preprocess.json").unlink()
    del config.data.preprocess["mean"], config.data.preprocess["std"]
    assert source_pixels(config) == (config, [])


def test_a_resume_keeps_the_worker_count(tmp_path):
    from test_train import load_config

    from contrastive_jax.training.run.workdir.config_record import check_config, write_config

    config = load_config("simclr_mnist1d.py:quick")
    write_config(config, tmp_path)
    assert check_config(config, tmp_path, resuming_from=3) == []
    config.data.worker_count = 2
    for accept in (False, True):  # another count cannot continue the saved stream
        with pytest.raises(ConfigError, match=r"data\.worker_count was 0 when the checkpoints"
                                              r".*set data\.worker_count=0"):
            check_config(config, tmp_path, resuming_from=3, accept_change=accept)
    assert check_config(config, tmp_path, resuming_from=None) == []  # a fresh run may set it


def test_the_pod_template_reads_converted_shards(shards_dataset):
    from test_train import load_config

    from contrastive_jax.mesh import make_mesh
    from contrastive_jax.training.data import eval_iterator, train_iterator

    data_dir, name = shards_dataset
    with pytest.raises(ConfigError, match=r"shards=tiny_shards: give the step count"):
        load_config(f"clip_vit_b16_pod.py:shards={name}")
    config = load_config(f"clip_vit_b16_pod.py:tiny,shards={name},heldout=4,steps=1")
    assert (config.data.train_split, config.data.eval_split) == ("train[4:]", "train[:4]")
    config.data.update({"data_dir": data_dir, "batch_size": 8, "eval_batch_size": 8})
    config.data.preprocess.tokenizer = {"kind": "words", "path": ""}
    mesh = make_mesh({"data": 8}, jax.devices())
    batch = next(train_iterator(config.data, mesh))
    assert batch["image"].shape == (8, 32, 32, 3) and batch["image"].dtype == jnp.uint8
    assert batch["caption"].shape == (8, 12)
    held = next(eval_iterator(config.data, mesh))
    assert np.asarray(held["mask"]).tolist() == [True] * 4 + [False] * 4  # 4 held out, padded


def test_evaluation_pixels_and_features_equal_open_clips():
    """Encoded images (JPEGs of several sizes, a grayscale JPEG, an RGBA PNG) through the
    evaluation preprocessing and a converted open_clip model: the pixels and image features
    that open_clip's own evaluation transform and ``encode_image`` gave
    (tests/fixtures/make_open_clip_preprocess_fixture.py)."""
    from test_clip_import import EXACT, HEADS, model_with, rel_error

    from contrastive_jax.training.models.converters import clip_import

    fixture = np.load(Path(__file__).parent / "fixtures" / "open_clip_preprocess.npz")
    encoded, offsets = fixture["encoded"].tobytes(), fixture["offsets"]
    files = [encoded[a:b] for a, b in itertools.pairwise(offsets)]
    evaluate = image_text_preprocess(image_size=16, max_tokens=4, resize="bicubic")
    crops = np.stack([evaluate({"image": f, "captions": {"text": ["a"]}})["image"]
                      for f in files])
    pixels = np.asarray(model_input(jnp.asarray(crops), (CLIP_MEAN, CLIP_STD)))
    np.testing.assert_allclose(pixels, fixture["pixels"], rtol=1e-6, atol=1e-6)
    model = model_with(*clip_import.convert_checkpoint(EXACT, quick_gelu=False, **HEADS))
    features = nnx.jit(lambda m, x: m.embed_samples(x))(model, jnp.asarray(pixels))
    assert rel_error(features, fixture["image_features"]) < 1e-5
    # bilinear is another function: levels off open_clip's pixels (the test tells them apart)
    bilinear = image_text_preprocess(image_size=16, max_tokens=4, resize="bilinear")
    other = np.stack([bilinear({"image": f, "captions": {"text": ["a"]}})["image"]
                      for f in files])
    assert np.abs(other.astype(np.int32) - crops).max() >= 4


def test_squash_evaluation_pixels_equal_open_clips_siglip_transform():
    """``data.preprocess.resize_mode = "squash"``: the evaluation preprocessing of the same
    encoded images equals open_clip's SigLIP evaluation transform (the whole image to 16 x 16,
    bicubic; mean = std = 0.5 on the device; tests/fixtures/make_open_clip_preprocess_fixture.py);
    an unknown mode names the valid ones."""
    fixture = np.load(Path(__file__).parent / "fixtures" / "open_clip_preprocess.npz")
    squashed = np.load(Path(__file__).parent / "fixtures" / "open_clip_squash_preprocess.npz")
    encoded, offsets = fixture["encoded"].tobytes(), fixture["offsets"]
    files = [encoded[a:b] for a, b in itertools.pairwise(offsets)]
    evaluate = image_text_preprocess(image_size=16, max_tokens=4, resize="bicubic",
                                     resize_mode="squash")
    crops = np.stack([evaluate({"image": f, "captions": {"text": ["a"]}})["image"]
                      for f in files])
    pixels = np.asarray(model_input(jnp.asarray(crops), ((0.5,) * 3, (0.5,) * 3)))
    np.testing.assert_allclose(pixels, squashed["pixels"], rtol=1e-6, atol=1e-6)
    with pytest.raises(ConfigError, match=r"resize_mode 'longest'; valid: \['shortest', "
                                          r"'squash'\]"):
        image_text_preprocess(image_size=16, max_tokens=4, resize_mode="longest")


def test_a_resumed_run_takes_the_recorded_mean_and_std_without_reading_the_path(tmp_path):
    from test_train import load_config

    from contrastive_jax.training.run.workdir.config_record import plain
    from contrastive_jax.training.run_spec import source_pixels

    config = load_config("clip_vit_b16_pod.py:tiny")
    del config.data.preprocess["mean"], config.data.preprocess["std"]
    config.model.init_from = {"path": str(tmp_path / "gone")}  # deleted after the first run
    recorded = plain(config)
    recorded["data"]["preprocess"].update({"mean": list(CLIP_MEAN), "std": list(CLIP_STD)})
    resumed, lines = source_pixels(config, recorded)
    assert pixel_normalization(resumed.data.preprocess) == (CLIP_MEAN, CLIP_STD)
    assert "recorded in the run's config.json" in lines[0]
    # another init_from: the record says nothing about it
    config.model.init_from = {"path": str(tmp_path / "other")}
    assert source_pixels(config, recorded) == (config, [])


def test_an_error_after_the_workers_started_stops_them(tmp_path, monkeypatch):
    """A run that fails once its input worker processes are running (here a ConfigError raised
    after the first batch) stops them before the error reaches the caller, even while something
    still holds the iterator (a traceback's frames do), instead of leaving them, and their
    shared memory, to interpreter exit."""
    import multiprocessing

    from test_train import load_config

    from contrastive_jax.training import train

    taken, streams = [], []

    def fail_after_one_batch(run, *args, **kwargs):
        streams.append(run.stream)  # held, as the frames of an error's traceback hold it
        taken.append(next(run.stream))
        assert multiprocessing.active_children()  # the worker is running
        raise ConfigError("late error")

    monkeypatch.setattr(train, "_loop", fail_after_one_batch)
    config = load_config("simclr_mnist1d.py:quick")
    config.data.worker_count = 1
    with pytest.raises(ConfigError, match="late error"):
        train.train_and_evaluate(config, str(tmp_path / "run"))
    assert len(taken) == 1 and taken[0]["signal"].shape[0] == config.data.batch_size
    assert multiprocessing.active_children() == []
