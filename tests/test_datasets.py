"""The package's TFDS datasets, built offline into a temporary data dir; sources and errors."""

import math
import os
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from contrastive_jax.training.data.datasets import correlated_gaussians, digits, mnist1d, shapes
from contrastive_jax.training.data.prepare import LOCAL_NAMES, prepare
from contrastive_jax.training.data.sources import DatasetNotPreparedError, open_split
from contrastive_jax.training.data.text import captions
from contrastive_jax.training.train import train_and_evaluate

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
import forked_command_lines  # noqa: E402
from test_reliability import quick  # noqa: E402
from xla_environment import child_environment  # noqa: E402


def read_all(source):
    """Every example of a source as a dict of stacked arrays, ordered by ``index``."""
    rows = [source[i] for i in range(len(source))]
    out = {k: np.stack([np.asarray(r[k]) for r in rows]) for k in rows[0]}
    order = np.argsort(out["index"])
    return {k: v[order] for k, v in out.items()}


@pytest.fixture(scope="module")
def generated_mnist1d():
    return mnist1d.mnist1d_arrays()


def test_mnist1d_is_the_packages_standard_split(generated_mnist1d):
    seen = []
    for split, n in (("train", 4000), ("test", 1000)):
        data = read_all(open_split("mnist1d", split))
        assert data["signal"].shape == (n, 40, 1) and data["signal"].dtype == np.float32
        np.testing.assert_array_equal(data["index"], np.arange(n))
        x, y = generated_mnist1d[split]
        np.testing.assert_array_equal(data["signal"], x)  # the generator's output, bit for bit
        np.testing.assert_array_equal(data["label"], y)
        assert set(np.unique(data["label"])) == set(range(10))
        # classes are near-balanced (the generator makes 500 of each)
        assert np.bincount(data["label"]).min() > 0.08 * n
        seen.append(data["signal"])
    everything = np.concatenate(seen)
    assert abs(everything.mean()) < 1e-3 and abs(everything.std() - 1) < 1e-2


def test_digits_fixed_split_and_scaling():
    from sklearn.datasets import load_digits

    ref = load_digits()
    parts = {}
    for split, n in (("train", digits.NUM_TRAIN), ("test", 1797 - digits.NUM_TRAIN)):
        data = read_all(open_split("digits", split))
        assert data["image"].shape == (n, 8, 8, 1) and data["image"].dtype == np.uint8
        assert data["label"].min() == 0 and data["label"].max() == 9
        np.testing.assert_array_equal(data["label"], ref.target[data["index"]])
        expected = np.round(ref.images[data["index"]] * 255 / 16).astype(np.uint8)[..., None]
        np.testing.assert_array_equal(data["image"], expected)
        parts[split] = data["index"]
    # the documented split: default_rng(0) permutation, first 1437 train
    order = np.random.default_rng(0).permutation(1797)
    np.testing.assert_array_equal(parts["train"], np.sort(order[:1437]))
    assert not set(parts["train"]) & set(parts["test"])
    assert len(set(parts["train"]) | set(parts["test"])) == 1797


@pytest.mark.parametrize("config,modality,key,unpaired", [
    ("mnist1d", "signal", "signal", "mnist1d"), ("digits", "image", "image", "digits")])
def test_digit_captions_pair_each_sample_with_its_caption(config, modality, key, unpaired):
    data = read_all(open_split(f"digit_captions/{config}", "train"))
    plain = read_all(open_split(unpaired, "train"))
    np.testing.assert_array_equal(data[key], plain[key])  # same samples, same split
    np.testing.assert_array_equal(data["label"], plain["label"])
    assert data["caption"].shape[1:] == (captions.MAX_TOKENS,)
    assert data["caption"].dtype == np.int32
    texts = captions.detokenize(data["caption"])
    for text, t, y in zip(texts[:200], data["template"][:200], data["label"][:200], strict=True):
        assert text == captions.caption(modality, int(t), int(y))
        assert captions.CLASS_NAMES[y] in text.split()
    np.testing.assert_array_equal(data["caption_id"], data["template"] * 10 + data["label"])
    # every template is used, and identical captions share an id (the false-negative key)
    assert set(np.unique(data["template"])) == set(range(len(captions.templates(modality))))
    assert len(np.unique(data["caption_id"])) == len(set(texts)) <= 80
    assert (data["caption"] != captions.UNK).all()  # the vocabulary covers every template


def test_digit_canvases_hold_each_digit_once_at_its_size_with_its_caption():
    """digit_captions/canvas: 2 canvases of each digit of the split (in order), grey in RGB,
    the digit's bright pixels inside one square of 12-24 pixels, the rest faint noise; the
    caption the template's text for the label; the same canvases as ``canvas_images``."""
    from contrastive_jax.training.data.datasets import digit_captions

    for split, n in (("train", 1437), ("test", 360)):
        source = open_split("digit_captions/canvas", split)
        assert len(source) == n * digit_captions.PLACEMENTS
        rows = sorted((source[i] for i in range(len(source))), key=lambda r: r["canvas"])
        images, labels, indices = digits.digits_arrays()[split]
        np.testing.assert_array_equal([r["index"] for r in rows], np.repeat(indices, 2))
        np.testing.assert_array_equal([r["label"] for r in rows], np.repeat(labels, 2))
        canvases = np.stack([r["image"] for r in rows])
        expected, _ = digit_captions.canvas_images(images, digit_captions.TEMPLATE_SEEDS[split]
                                                   + 100)
        np.testing.assert_array_equal(canvases, expected)
    assert canvases.shape[1:] == (48, 48, 3) and canvases.dtype == np.uint8
    assert (canvases[..., 0] == canvases[..., 2]).all()
    for canvas, row in zip(canvases[:100], rows[:100], strict=True):
        bright = np.argwhere(canvas[..., 0] > 100)
        extent = bright.max(0) - bright.min(0) + 1
        assert extent.max() <= 24 and extent.min() >= 4, extent  # a digit of 12-24 pixels
        text = row["caption"].decode() if isinstance(row["caption"], bytes) else row["caption"]
        assert text == captions.caption("image", int(row["template"]), int(row["label"]))
    outside = np.ones((48, 48), bool)  # the last canvas: everything off its digit's box
    bright = np.argwhere(canvases[-1][..., 0] > 100)
    (top, left), (bottom, right) = bright.min(0), bright.max(0)
    outside[max(0, top - 4):bottom + 5, max(0, left - 4):right + 5] = False
    assert canvases[-1][..., 0][outside].max() < 60  # noise of std 8 (of 255), clipped at 0


def test_tokenizer():
    toks = captions.tokenize(["a plot of the digit seven", "Seven zebras"])
    assert toks.shape == (2, captions.MAX_TOKENS) and toks.dtype == np.int32
    words = captions.vocabulary()
    assert [words[t] for t in toks[0, :8]] == ["<bos>", "a", "plot", "of", "the", "digit",
                                               "seven", "<eos>"]
    assert (toks[0, 8:] == captions.PAD).all()
    assert toks[1, 2] == captions.UNK
    assert captions.detokenize(toks) == ["a plot of the digit seven", "seven <unk>"]
    with pytest.raises(ValueError, match="max_tokens"):
        captions.tokenize("a " * 11)
    prompts = captions.class_prompts("signal")
    assert prompts.shape == (10, 8, captions.MAX_TOKENS)
    seven = words.index("seven")
    assert ((prompts[7] == seven).sum(axis=-1) == 1).all()
    assert not (prompts[3] == seven).any()


def test_correlated_gaussians_mutual_information():
    with jax.enable_x64(True):
        # I = H(X) + H(Y) - H(X, Y) from Gaussian entropies 1/2 log det(2 pi e Sigma)
        for dim, rho in ((1, 0.5), (20, 0.9), (7, -0.3)):
            cov = np.block([[np.eye(dim), rho * np.eye(dim)], [rho * np.eye(dim), np.eye(dim)]])
            joint = 0.5 * np.linalg.slogdet(2 * np.pi * np.e * cov)[1]
            marginal = 0.5 * dim * np.log(2 * np.pi * np.e)
            assert math.isclose(correlated_gaussians.mutual_information(dim, rho),
                                2 * marginal - joint, rel_tol=1e-12)
        for mi in (2.0, 4.0, 10.0):
            rho = correlated_gaussians.correlation_for(mi, 20)
            assert math.isclose(correlated_gaussians.mutual_information(20, rho), mi,
                                rel_tol=1e-12)
    x, y = correlated_gaussians.sample(jax.random.key(0), 20_000, 4, 0.8)
    corr = np.corrcoef(np.asarray(x[:, 0]), np.asarray(y[:, 0]))[0, 1]
    assert abs(corr - 0.8) < 4 * (1 - 0.8**2) / math.sqrt(20_000)
    src = correlated_gaussians.CorrelatedGaussians(5000, 3, 0.6, seed=1)
    np.testing.assert_array_equal(src[17]["x"], src[17]["x"])
    assert not np.array_equal(src[17]["x"], src[18]["x"])
    pairs = np.stack([np.concatenate([src[i]["x"], src[i]["y"]]) for i in range(len(src))])
    corr = np.corrcoef(pairs[:, 0], pairs[:, 3])[0, 1]
    assert abs(corr - 0.6) < 4 * (1 - 0.6**2) / math.sqrt(5000)
    for bad in ({"dim": 0, "rho": 0.5}, {"dim": 2, "rho": 1.0}):
        with pytest.raises(ValueError):
            correlated_gaussians.CorrelatedGaussians(10, **bad)


def test_correlated_gaussians_through_open_split():
    src = open_split("correlated_gaussians", "train",
                     options={"dim": 20, "mutual_information": 4.0, "num_examples": 100})
    assert len(src) == 100 and src[0]["x"].shape == (20,)
    assert math.isclose(correlated_gaussians.mutual_information(20, src.rho), 4.0)
    test = open_split("correlated_gaussians", "test", options={"rho": 0.5})
    assert test.seed != src.seed
    with pytest.raises(ValueError, match="exactly one of"):
        open_split("correlated_gaussians", "train", options={"rho": 0.5,
                                                              "mutual_information": 2.0})
    with pytest.raises(ValueError, match="valid"):
        open_split("correlated_gaussians", "train", options={"rh0": 0.5})


def _version_files(builder):
    return {p.name: p.stat().st_mtime_ns for p in Path(builder.data_dir).iterdir()}


def test_prepare_is_idempotent(tmp_path):
    builder = prepare("digits", str(tmp_path))
    before = _version_files(builder)
    again = prepare("digits", str(tmp_path))
    assert again.data_dir == builder.data_dir and _version_files(again) == before


def test_interrupted_build_leaves_nothing_prepared_and_is_rebuilt(tmp_path, monkeypatch):
    original = digits.Digits._generate_examples

    def interrupted(self, *args):
        for count, item in enumerate(original(self, *args)):
            if count == 100:
                raise KeyboardInterrupt("simulated interruption")
            yield item

    monkeypatch.setattr(digits.Digits, "_generate_examples", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare("digits", str(tmp_path), verbose=False)
    builder = tfds.builder("digits", data_dir=str(tmp_path))
    assert not builder.is_prepared()
    monkeypatch.setattr(digits.Digits, "_generate_examples", original)
    builder = prepare("digits", str(tmp_path), verbose=False)
    assert builder.is_prepared()
    assert not list((tmp_path / "digits").glob("incomplete.*"))
    assert len(open_split("digits", "test", str(tmp_path))) == 360


def test_concurrent_prepares_build_once(tmp_path):
    code = ("import sys; from contrastive_jax.training.data.prepare import prepare; "
            "prepare('digits', sys.argv[1])")
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    procs = [forked_command_lines.popen([sys.executable, "-c", code, tmp_path], env)
             for _ in range(2)]  # forked by the server: no start-up of Python each
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert sum(err.count("preparing digits") for _, err in outs) == 1
    assert len(open_split("digits", "train", str(tmp_path))) == digits.NUM_TRAIN


def test_prepare_command_line(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    run = forked_command_lines.run([sys.executable, "-m", "contrastive_jax.training.data.prepare",
                                    "digits", f"--data_dir={tmp_path}"], env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "digits:" in run.stdout and "'train': 1437" in run.stdout
    assert "RuntimeWarning" not in run.stderr, run.stderr  # -m imports the command once
    bad = forked_command_lines.run([sys.executable, "-m", "contrastive_jax.training.data.prepare",
                                    "cifar10", f"--data_dir={tmp_path}"], env, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error: 'cifar10' is not one of")
    assert "tfds build" in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr
    assert set(LOCAL_NAMES) >= {"mnist1d", "digits"}


def test_unprepared_tfds_dataset_names_dataset_dir_and_command(tmp_path):
    with pytest.raises(DatasetNotPreparedError) as err:
        open_split("cifar10", "train", str(tmp_path))
    message = str(err.value)
    assert "'cifar10'" in message and str(tmp_path) in message
    assert f"tfds build cifar10 --data_dir={tmp_path} --file_format=array_record" in message
    assert not (tmp_path / "cifar10").exists()  # nothing written, nothing downloaded
    with pytest.raises(ValueError, match="unknown dataset"):
        open_split("no_such_dataset", "train", str(tmp_path))
    with pytest.raises(ValueError, match="no split 'validation'"):
        open_split("digits", "validation")
    with pytest.raises(ValueError, match="only apply"):
        open_split("digits", "train", options={"rho": 0.5})


class ExternalToy(tfds.core.GeneratorBasedBuilder):
    """A dataset this package does not know, prepared the way `tfds build` would."""

    name = "external_toy_for_tests"
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
            "image": tfds.features.Tensor(shape=(4, 4, 3), dtype=np.uint8),
            "label": tfds.features.ClassLabel(num_classes=3)}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(24)}

    def _generate_examples(self, n):
        for i in range(n):
            yield i, {"image": np.full((4, 4, 3), 10 * i, np.uint8), "label": i % 3}


def test_any_prepared_tfds_dataset_goes_through_the_same_path(tmp_path):
    from contrastive_jax.training.data.pipeline import HostShard, train_dataset

    ExternalToy(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
    source = open_split("external_toy_for_tests", "train", str(tmp_path))
    assert len(source) == 24
    batch = next(iter(train_dataset(source, global_batch_size=8, seed=0,
                                    shard=HostShard(0, 1))))
    assert batch["image"].shape == (8, 4, 4, 3) and batch["image"].dtype == np.float32
    assert set(np.round(batch["image"][:, 0, 0, 0] * 255).astype(int)) <= set(range(0, 240, 10))


def test_dataset_prepared_without_random_access_is_rejected(tmp_path):
    builder = ExternalToy(data_dir=str(tmp_path), file_format="array_record")
    builder.download_and_prepare()
    info = Path(builder.data_dir) / "dataset_info.json"
    # as `tfds build` without --file_format leaves it (tfrecord needs TensorFlow to write)
    info.write_text(info.read_text().replace('"fileFormat": "array_record"',
                                             '"fileFormat": "tfrecord"'))
    with pytest.raises(DatasetNotPreparedError, match=r"prepared as tfrecord.*array_record"):
        open_split("external_toy_for_tests", "train", str(tmp_path))


def test_a_damaged_copy_is_generated_again(tmp_path, capsys):
    """A deleted dataset_info.json (it used to give "prepared in 0.0 s", then "no split
    'train'; splits: []") or record file: the copy is removed and generated again."""
    builder = prepare("digits", str(tmp_path), verbose=False)
    version = Path(builder.data_dir)
    (version / "dataset_info.json").unlink()
    capsys.readouterr()
    prepare("digits", str(tmp_path))
    assert "damaged: no dataset_info.json" in capsys.readouterr().err
    assert len(open_split("digits", "train", str(tmp_path))) == digits.NUM_TRAIN
    next(version.glob("digits-test.array_record*")).unlink()
    prepare("digits", str(tmp_path))
    assert "damaged: missing record files ['digits-test" in capsys.readouterr().err
    assert len(open_split("digits", "test", str(tmp_path))) == 360
    before = _version_files(prepare("digits", str(tmp_path)))  # complete: left alone
    assert "removing" not in capsys.readouterr().err
    prepare("digits", str(tmp_path), overwrite=True)
    assert "(--overwrite)" in capsys.readouterr().err
    assert _version_files(builder) != before  # written again


def test_corrupted_record_files_are_one_paragraph_naming_the_fix(tmp_path):
    """Flipped bytes in an array_record file (found only on reading): exit 2 with the command
    that prepares the dataset again (it used to be a 42-line Riegeli traceback); after that
    command, a run trains on the dataset."""
    data = tmp_path / "data"
    builder = prepare("mnist1d", str(data), verbose=False)
    records = next(Path(builder.data_dir).glob("mnist1d-train.array_record*"))
    damaged = bytearray(records.read_bytes())
    damaged[1000::997] = bytes(b ^ 0xFF for b in damaged[1000::997])
    records.write_bytes(bytes(damaged))
    env = child_environment()
    train = [sys.executable, "-m", "contrastive_jax.main", f"--workdir={tmp_path / 'w'}",
             "--config=configs/simclr_mnist1d.py:quick", "--config.evaluation.enabled=False",
             "--config.total_steps=2", f"--config.data.data_dir={data}"]
    run = forked_command_lines.run(train, env)  # forked: no start-up of Python and imports
    assert run.returncode == 2, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    assert "error: the record files of dataset 'mnist1d'" in run.stderr
    fix = ("python -m contrastive_jax.training.data.prepare mnist1d "
           f"--data_dir={data} --overwrite")
    assert fix in run.stderr
    fixed = forked_command_lines.run(fix.replace("python", sys.executable, 1).split(), env)
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    # the trainer reads the prepared dataset again (in this process: its exit status is above)
    config = quick(total_steps=6, checkpoint_every=3)
    config.data.data_dir = str(data)
    assert train_and_evaluate(config, str(tmp_path / "again"))["steps"] == 6


def test_shapes_splits_are_balanced_deterministic_jpegs_of_the_generator():
    """``shapes``: 20,000 / 2,000 examples, label ``index mod 10`` (balanced), each example's
    stored JPEG the generator's image encoded again byte for byte, decoding to it within the
    JPEG's error; the shape inside the image is the label's (its pixels differ from the
    background's colour where the shape's mask says)."""
    for split, n in shapes.SPLITS.items():
        source = open_split("shapes", split)
        assert len(source) == n
        labels = np.array([source[i]["label"] for i in range(n)])
        np.testing.assert_array_equal(np.bincount(labels), np.full(10, n // 10))
        encoded = open_split("shapes", split, encoded_images=("image",))
        for i in (0, 1, 7, n - 1):
            row, raw = source[i], encoded[i]
            example = shapes.shapes_example(split, int(row["index"]))
            assert row["label"] == example["label"] == row["index"] % 10
            assert bytes(raw["image"]) == shapes.encode_jpeg(example["image"])  # deterministic
            assert row["image"].shape == (32, 32, 3) and row["image"].dtype == np.uint8
            error = np.abs(row["image"].astype(int) - example["image"].astype(int))
            assert error.mean() < 5.0, error.mean()  # JPEG at quality 95, 4:4:4, of noise
    train, test = (shapes.shapes_example(s, 5)["image"] for s in ("train", "test"))
    assert not np.array_equal(train, test)  # the splits draw from different seeds
    names = tfds.builder("shapes").info.features["label"].names
    assert tuple(names) == shapes.SHAPE_NAMES and len(set(names)) == 10


def test_shapes_colour_says_nothing_about_the_class():
    """The label changes only the shape: the ten images drawn from one generator state, one per
    label, are equal outside the shape's disc (its radius times ``EXTENT``, plus a pixel); the
    per-class mean colour of the first 6,000 training images equals the overall mean within
    0.045 (4.4 standard errors of a class mean: the per-image mean colour has std 0.25, 600
    images a class); a linear probe on 64-bin colour histograms of them scores chance (< 0.13
    on the 2,000 test images, 10 classes: ridge regression onto the one-hot labels)."""
    yy, xx = np.mgrid[:32, :32] + 0.5
    for seed in range(20):
        images = np.stack([shapes.shapes_image(label, np.random.default_rng(seed))
                           for label in range(10)]).astype(int)
        cx, cy, radius, _, _ = shapes.shape_placement(np.random.default_rng(seed))  # every label's
        disc = np.hypot(xx - cx, yy - cy) < shapes.EXTENT * radius + 1.0
        differs = (images != images[:1]).any(axis=(0, 3))
        assert differs.any() and not (differs & ~disc).any()

    def load(split, n):
        source = open_split("shapes", split)
        rows = [source[i] for i in range(n)]
        return np.stack([r["image"] for r in rows]) / 255.0, np.array([r["label"] for r in rows])

    train_x, train_y = load("train", 6_000)
    test_x, test_y = load("test", 2_000)
    means = train_x.mean(axis=(1, 2))
    per_class = np.stack([means[train_y == c].mean(0) for c in range(10)])
    assert np.abs(per_class - means.mean(0)).max() < 0.045

    def histogram(x):
        q = np.minimum((x * 4).astype(int), 3).reshape(len(x), -1, 3)
        code = q[..., 0] * 16 + q[..., 1] * 4 + q[..., 2]
        return np.stack([np.bincount(c, minlength=64) for c in code]) / code.shape[1]

    def fit(x, y):  # a linear classifier: ridge regression onto one-hot labels, with a bias
        x = np.concatenate([x, np.ones((len(x), 1))], axis=1)
        return np.linalg.solve(x.T @ x + 1e-3 * np.eye(x.shape[1]), x.T @ np.eye(10)[y])

    w = fit(histogram(train_x), train_y)
    test_h = np.concatenate([histogram(test_x), np.ones((len(test_x), 1))], axis=1)
    colour = np.mean(np.argmax(test_h @ w, axis=1) == test_y)
    assert colour < 0.13, colour
