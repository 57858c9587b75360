"""``python -m contrastive_jax.evaluate``: every task kind end to end on TFDS datasets built
here (a classification set whose ClassLabel has names; a caption set with 5 captions per image,
one image with 3) and a tiny converted CLIP (the open_clip parity fixture, a word tokenizer),
against references computed from the model's own ``load_pretrained`` pieces with the slow
metrics of tests/test_benchmark_metrics.py; bad input exits 2 with one line, and a failing task
keeps the others' results.
"""

import json
import os
import pathlib

import numpy as np
import pytest
import tensorflow_datasets as tfds
from test_benchmark_metrics import reference_caption_recall, reference_classification
from test_clip_import import EXACT, HEADS
from test_imagenet_evaluation import reference_knn_votes

from contrastive_jax import evaluate
from contrastive_jax.pretrained import load_pretrained
from contrastive_jax.training.evaluation.probes import fewshot_probe, linear_probe_logits
from contrastive_jax.training.evaluation.task_runner import LINEAR_L2_GRID
from contrastive_jax.training.models.converters import clip_import, converted_directory

pytestmark = pytest.mark.filterwarnings(
    "ignore::contrastive_jax.training.models.converters.clip_state_dict.AssumptionWarning")
SHAPES = ("red square", "blue circle", "green triangle")
WORDS = ["<pad>", "<unk>", "<bos>", "<eos>", "a", "photo", "of", "the", "shape", "red", "blue",
         "green", "square", "circle", "triangle", "small", "big", "on", "white", "black",
         "picture", "with", "and", "one", "two"]
CAPTION_COUNTS = (5, 5, 5, 3, 5, 5, 5, 5, 5, 5)
BATCH = 8


def _image(rng, label: int, size=(20, 26)):
    from PIL import Image

    base = np.zeros((*size, 3), np.uint8)
    base[..., label] = 200
    noise = rng.integers(0, 56, size=(*size, 3), dtype=np.uint8)
    return Image.fromarray(base + noise)


def build_datasets(data_dir: pathlib.Path) -> None:
    """``mock_shapes`` (train 30, test 12; image, label with SHAPES' names) and
    ``mock_captions`` (test: 10 images, CAPTION_COUNTS captions each) as array_record."""
    with tfds.core.registered.skip_registration():
        class MockShapes(tfds.core.GeneratorBasedBuilder):
            VERSION = tfds.core.Version("1.0.0")

            def _info(self):
                return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
                    "image": tfds.features.Image(shape=(None, None, 3), encoding_format="png"),
                    "label": tfds.features.ClassLabel(names=list(SHAPES))}))

            def _split_generators(self, dl_manager):
                return {"train": self._generate_examples(30, 0),
                        "test": self._generate_examples(12, 1)}

            def _generate_examples(self, n, seed):
                rng = np.random.default_rng(seed)
                for i in range(n):
                    label = int(rng.integers(0, 3))
                    yield i, {"image": _image(rng, label), "label": label}

        class MockCaptions(tfds.core.GeneratorBasedBuilder):
            VERSION = tfds.core.Version("1.0.0")

            def _info(self):
                return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
                    "image": tfds.features.Image(shape=(None, None, 3), encoding_format="png"),
                    "captions": tfds.features.Sequence({"text": tfds.features.Text()})}))

            def _split_generators(self, dl_manager):
                return {"test": self._generate_examples()}

            def _generate_examples(self):
                rng = np.random.default_rng(2)
                for i, count in enumerate(CAPTION_COUNTS):
                    label = i % 3
                    texts = [" ".join(rng.choice(WORDS[4:], size=4)) + " " + SHAPES[label]
                             for _ in range(count)]
                    yield i, {"image": _image(rng, label), "captions": {"text": texts}}

        for builder in (MockShapes, MockCaptions):
            builder(data_dir=str(data_dir), file_format="array_record").download_and_prepare()


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    root = tmp_path_factory.mktemp("evaluate")
    build_datasets(root / "data")
    vocab = root / "words.txt"
    vocab.write_text("\n".join(WORDS) + "\n")
    config, params = clip_import.convert_checkpoint(EXACT, quick_gelu=False, **HEADS)
    pixels = {"mean": list(clip_import.OPENAI_MEAN), "std": list(clip_import.OPENAI_STD),
              "resize": "bicubic", "image_size": 16}
    converted_directory.save_converted(root / "model", config, params, preprocess=pixels,
                                       tokenizer={"kind": "words", "path": str(vocab)})
    converted_directory.save_converted(root / "no_tokenizer", config, params,
                                       preprocess=pixels)
    names = root / "names.json"
    names.write_text(json.dumps({"mock_shapes": {"templates": ["a photo of a {}.",
                                                               "the {} shape."]}}))
    return root


def reference_features(root, dataset, split):
    """Sample embeddings by load_pretrained's preprocess and model, in padded batches of
    BATCH (the command's batch), and the examples as TFDS reads them."""
    import jax
    from flax import nnx

    model, preprocess, tokenizer = load_pretrained(root / "model")
    builder = tfds.builder_from_directory(root / "data" / dataset / "1.0.0")
    examples = list(builder.as_data_source(
        split=split, decoders={"image": tfds.decode.SkipDecoding()}))
    pixels = preprocess([e["image"] for e in examples])
    pad = -len(pixels) % BATCH
    pixels = np.concatenate([pixels, np.zeros((pad, *pixels.shape[1:]), np.float32)])
    graphdef, state = nnx.split(model)
    embed = jax.jit(lambda s, x: nnx.merge(graphdef, s).embed_samples(x))
    feats = np.concatenate([np.asarray(embed(state, pixels[i:i + BATCH]))
                            for i in range(0, len(pixels), BATCH)])[:len(examples)]
    return feats, examples, model, tokenizer


def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_every_task_kind_through_the_command_equals_the_reference(setting, capsys):
    root = setting
    out = root / "out"
    tasks = ("zeroshot/mock_shapes,linear/mock_shapes,fewshot/mock_shapes,knn/mock_shapes,"
             "retrieval/mock_captions")
    status = evaluate.main([f"--model={root / 'model'}", f"--tasks={tasks}",
                            f"--data_dir={root / 'data'}", f"--output={out}", "--split=test",
                            f"--class_names={root / 'names.json'}", f"--batch_size={BATCH}",
                            "--knn_k=5", "--knn_temperature=0.5"])
    printed, progress = capsys.readouterr()
    assert status == 0, progress
    record = json.loads((out / "results.json").read_text())
    assert list(record["tasks"]) == tasks.split(",")
    assert all(t["status"] == "ok" for t in record["tasks"].values())
    assert "zeroshot/mock_shapes test images  12/12 (100%)" in progress
    assert "retrieval/mock_captions captions  48/48 (100%)" in progress
    assert "| retrieval/mock_captions | test | mean_r1 |" in printed
    assert (out / "results.md").read_text() in printed
    assert record["provenance"]["jax"] and record["preprocess"]["image_size"] == 16

    test_x, test_examples, model, tokenizer = reference_features(root, "mock_shapes", "test")
    labels = np.array([e["label"] for e in test_examples])
    # zero-shot: the TFDS names in both templates, each prompt by the model's own tokenizer
    templates = ("a photo of a {}.", "the {} shape.")
    prompts = [t.format(n) for n in SHAPES for t in templates]
    texts = np.asarray(model.embed_texts(tokenizer(prompts))).reshape(3, 2, -1)
    weights = unit(unit(texts).mean(axis=1))
    want, _ = reference_classification(unit(test_x) @ weights.T, labels, (1, 5))
    zeroshot = record["tasks"]["zeroshot/mock_shapes"]
    assert zeroshot["metrics"] == pytest.approx(want, abs=1e-9)
    assert (zeroshot["classes"], zeroshot["templates"], zeroshot["examples"]) == (3, 2, 12)
    # the probes on the training split's features
    train_x, train_examples, _, _ = reference_features(root, "mock_shapes", "train")
    train_y = np.array([e["label"] for e in train_examples])
    logits, l2, _ = linear_probe_logits(train_x, train_y, test_x, labels, num_classes=3,
                                        l2_grid=LINEAR_L2_GRID)
    want, _ = reference_classification(logits, labels, (1, 5))
    linear = record["tasks"]["linear/mock_shapes"]["metrics"]
    assert linear == pytest.approx({**want, "l2": l2}, abs=1e-6)
    fewshot = record["tasks"]["fewshot/mock_shapes"]["metrics"]
    assert fewshot == pytest.approx(fewshot_probe(train_x, train_y, test_x, labels,
                                                  num_classes=3), abs=1e-9)
    assert set(fewshot) >= {"1shot", "5shot", "10shot", "25shot", "10shot_seed2"}
    # kNN: the slow float64 vote of the 5 nearest training images, T = 0.5 (the flags)
    knn = record["tasks"]["knn/mock_shapes"]
    want, _ = reference_classification(
        reference_knn_votes(train_x, train_y, test_x, 5, 0.5, 3), labels, (1, 5))
    assert knn["metrics"] == pytest.approx(want, abs=1e-12)
    assert (knn["k"], knn["temperature"], knn["train_examples"]) == (5, 0.5, 30)
    assert record["command"]["knn_k"] == 5 and knn["train_split"] == "train"
    # retrieval: every caption of an image is its match
    images, examples, _, _ = reference_features(root, "mock_captions", "test")
    captions = [[c.decode() for c in e["captions"]["text"]] for e in examples]
    owner = np.concatenate([[i] * len(c) for i, c in enumerate(captions)])
    caption_x = np.asarray(model.embed_texts(tokenizer([c for cs in captions for c in cs])))
    want = reference_caption_recall(images, caption_x, owner, (1, 5, 10))
    retrieval = record["tasks"]["retrieval/mock_captions"]
    assert retrieval["metrics"] == pytest.approx(want, abs=1e-9)
    assert (retrieval["examples"], retrieval["captions"]) == (10, 48)
    rows = (out / "results.csv").read_text().splitlines()
    assert rows[0] == "task,kind,dataset,metric,value"
    assert f"retrieval/mock_captions,retrieval,mock_captions,mean_r1,{want['mean_r1']!r}" in rows


def run_command(args, capsys):
    status = evaluate.main(args)
    out, err = capsys.readouterr()
    return status, out, err


def test_bad_input_exits_2_with_one_line_and_a_failing_task_keeps_the_others(setting, capsys):
    root = setting
    base = [f"--model={root / 'model'}", f"--data_dir={root / 'data'}"]
    status, _, err = run_command([*base, "--tasks=zeroshort/cifar10",
                                  f"--output={root / 'bad1'}"], capsys)
    assert status == 2 and err.count("\n") == 1 and "KIND one of ['zeroshot'" in err
    status, _, err = run_command([*base, "--tasks=zeroshot/mock_shapes",
                                  f"--output={root / 'bad2'}"], capsys)
    assert status == 2 and "not in the task table" in err and "--split" in err
    assert not (root / "bad1").exists() and not (root / "bad2").exists()  # nothing ran
    # class names of the wrong count fail that task; a missing split fails another; the
    # linear probe still runs and is written
    wrong = root / "wrong.json"
    wrong.write_text(json.dumps({"mock_shapes": {"class_names": ["red", "blue"]}}))
    status, _, err = run_command([*base, "--split=test", f"--class_names={wrong}",
                                  "--tasks=zeroshot/mock_shapes,linear/mock_shapes,"
                                  "retrieval/mock_captions", "--train_split=validation",
                                  f"--output={root / 'partial'}"], capsys)
    record = json.loads((root / "partial" / "results.json").read_text())
    assert status == 2
    tasks = record["tasks"]
    assert tasks["zeroshot/mock_shapes"]["status"] == "failed"
    assert "2 class names for the 3 classes" in tasks["zeroshot/mock_shapes"]["error"]
    assert "no split 'validation'" in tasks["linear/mock_shapes"]["error"]
    assert tasks["retrieval/mock_captions"]["status"] == "ok"
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 3, err
    assert lines[0].startswith("error: zeroshot/mock_shapes: 2 class names for the 3 classes")
    assert lines[-1].startswith("error: 2 of 3 tasks failed (zeroshot/mock_shapes, "
                                "linear/mock_shapes")
    # a source without a tokenizer: text tasks say what to pass; image tasks need none
    status, _, err = run_command([f"--model={root / 'no_tokenizer'}",
                                  f"--data_dir={root / 'data'}", "--split=test",
                                  "--tasks=zeroshot/mock_shapes", f"--output={root / 'nt'}"],
                                 capsys)
    assert status == 2 and "pass tokenizer=PATH" in err and "image tasks run" in err
    status, printed, err = run_command([f"--model={root / 'no_tokenizer'}",
                                        f"--data_dir={root / 'data'}", "--split=test",
                                        "--tasks=fewshot/mock_shapes", f"--output={root / 'fs'}"],
                                       capsys)
    assert status == 0, err
    assert "| fewshot/mock_shapes | test | 10shot |" in printed


def test_the_output_folder_is_checked_and_locked_before_any_work(setting, capsys):
    """An --output that is empty, remote, an existing file or under a file: exit 2, one line,
    before the model is read (the first three create nothing); a folder another evaluation
    holds (its lock, taken here as that command would) names the holder; a killed writer's
    temporary files are removed by the next command."""
    from contrastive_jax.evaluate.results_files import output_folder
    from contrastive_jax.training.run.workdir.workdir_lock import folder_lock

    root = setting
    base = [f"--model={root / 'missing_model'}", f"--data_dir={root / 'data'}",
            "--split=test", "--tasks=fewshot/mock_shapes"]
    a_file = root / "a_file"
    a_file.write_text("not a folder\n")
    for output, words in (("", "--output is empty"),
                          ("gs://bucket/out", "a local folder"),
                          (str(a_file), "is an existing file, not a folder"),
                          (str(a_file / "out"), "a part of the path is a file")):
        status, _, err = run_command([*base, f"--output={output}"], capsys)
        assert status == 2 and err.count("\n") == 1 and words in err, err
        assert "missing_model" not in err  # refused before the model is looked for
    assert a_file.read_text() == "not a folder\n"

    held = root / "held"
    held.mkdir()
    with folder_lock(held, RuntimeError):  # another evaluation writing there
        status, _, err = run_command([*base, f"--output={held}"], capsys)
    assert status == 2 and err.count("\n") == 1, err
    assert f"in use by another evaluation (pid {os.getpid()} on host" in err
    assert not (held / "results.json").exists()

    stale = held / ".results.json.999.dead.tmp"  # left by a writer killed mid-write
    stale.write_text("{")
    with output_folder(str(held)) as folder:
        assert folder == held and not stale.exists()


def test_a_refused_write_prints_the_results_and_keeps_the_last_complete_files(
        setting, capsys, monkeypatch):
    """The second task's write meets a file-size limit (a real one, RLIMIT_FSIZE, as `ulimit
    -f`, set around the write): exit 2 with one line naming results.json and the fix, the two
    finished tasks' table on stdout, results.json as the first task's write left it, no
    temporary file. Then a --batch_size far above the split runs one batch of the split (it
    used to pad 12 images to a full batch) and gives the same numbers."""
    import resource

    from contrastive_jax.evaluate import results_files

    root = setting
    out = root / "limited"
    real_write = results_files.write_results
    writes = []

    def limited_write(output, record):
        writes.append(len(record["tasks"]))
        if len(writes) == 1:
            return real_write(output, record)
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (256, hard))  # bytes: results.json is more
        try:
            return real_write(output, record)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))

    monkeypatch.setattr(results_files, "write_results", limited_write)
    args = [f"--model={root / 'model'}", f"--data_dir={root / 'data'}", "--split=test",
            "--tasks=fewshot/mock_shapes,linear/mock_shapes", f"--batch_size={BATCH}"]
    status, printed, err = run_command([*args, f"--output={out}"], capsys)
    assert status == 2 and writes == [1, 2], err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"cannot write {out}/results.json (File too large: a file " \
        "reached the file-size limit" in errors[0], err
    assert "| fewshot/mock_shapes | test | 10shot |" in printed
    assert "| linear/mock_shapes | test | acc1 |" in printed
    kept = json.loads((out / "results.json").read_text())
    assert list(kept["tasks"]) == ["fewshot/mock_shapes"]
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    monkeypatch.undo()

    status, printed, err = run_command(
        [*args[:3], "--tasks=fewshot/mock_shapes", "--batch_size=100000",
         f"--output={root / 'big_batch'}"], capsys)
    assert status == 0, err
    assert "fewshot/mock_shapes test images: batches of 12 (the batch size 100,000 is larger " \
           "than the split's 12 examples)" in err
    assert "fewshot/mock_shapes train images: batches of 30 " in err
    big = json.loads((root / "big_batch" / "results.json").read_text())
    assert big["tasks"]["fewshot/mock_shapes"]["metrics"] == pytest.approx(
        kept["tasks"]["fewshot/mock_shapes"]["metrics"], abs=1e-6)


def test_malformed_class_names_and_an_empty_split_say_what_to_change(setting, capsys):
    """Class names given as a string (it was read as its characters), a file holding a list,
    a folder: exit 2 with one line before anything runs. An empty split (test[:0]) fails its
    task naming the split and the dataset's sizes, and the closing line does not claim other
    results."""
    root = setting
    base = [f"--model={root / 'model'}", f"--data_dir={root / 'data'}", "--split=test",
            "--tasks=zeroshot/mock_shapes"]
    as_string = root / "names_string.json"
    as_string.write_text(json.dumps({"mock_shapes": {"class_names": "red square"}}))
    as_list = root / "names_list.json"
    as_list.write_text(json.dumps([["red", "blue", "green"]]))
    for path, words in ((as_string, "class_names of 'mock_shapes' must be a list of strings; "
                                    'got "red square"'),
                        (as_list, "holds a JSON list, not an object of datasets"),
                        (root / "data", "is a folder; give the JSON file")):
        out = root / f"names_out_{path.stem}"
        status, _, err = run_command([*base, f"--class_names={path}", f"--output={out}"],
                                     capsys)
        assert status == 2 and err.count("\n") == 1 and words in err, err
        assert not out.exists()
    status, _, err = run_command([f"--model={root / 'model'}", f"--data_dir={root / 'data'}",
                                  "--split=test[:0]", "--tasks=fewshot/mock_shapes",
                                  f"--output={root / 'empty'}"], capsys)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert status == 2 and len(errors) == 2, err
    assert errors[0] == ("error: fewshot/mock_shapes: mock_shapes[test[:0]] holds no examples: "
                         "the split expression selects none of mock_shapes's (test: 12, "
                         "train: 30); give a split with examples")
    assert errors[1].endswith("; no task has a result")
