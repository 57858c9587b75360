"""The pod template end to end on mock ``coco_captions``: its real TFDS features, array_record,
read without TensorFlow, a SentencePiece tokenizer built by the command from the mock captions.

The mock is written by the command the docs give for the tiny run (``prepare --mock
coco_captions``, :mod:`contrastive_jax.training.data.mock_datasets`): the real builder's
features and splits, ``tfds.testing``'s random examples.
"""

import json
import math

import ml_collections
import numpy as np
import pytest
from absl import flags
from ml_collections import config_flags
from test_reliability import REPO, run_command_lines
from test_train import load_config

from contrastive_jax import evaluate
from contrastive_jax.errors import ConfigError, DatasetNotPreparedError
from contrastive_jax.training import train
from contrastive_jax.training.data import build_tokenizer
from contrastive_jax.training.data.example_preprocessing import image_text_preprocess
from contrastive_jax.training.data.mock_datasets import MOCK_SPLITS
from contrastive_jax.training.data.pipeline import HostShard, train_dataset
from contrastive_jax.training.data.prepare import main as prepare_main
from contrastive_jax.training.data.sources import open_split, prepared_dir


@pytest.fixture(scope="module")
def mock_coco(tmp_path_factory):
    """``(data_dir, tokenizer model)``: mock coco_captions prepared, and a SentencePiece model
    built from its train+restval captions by the command line's ``main``."""
    data_dir = str(tmp_path_factory.mktemp("tfds"))
    assert prepare_main(["--mock", "coco_captions", f"--data_dir={data_dir}"]) == 0
    model = str(tmp_path_factory.mktemp("tokenizer") / "coco.model")
    assert build_tokenizer.main([
        "--dataset=coco_captions", f"--data_dir={data_dir}", "--split=train+restval",
        "--vocab_size=64", f"--output={model}"]) == 0
    return data_dir, model


def test_prepared_coco_captions_opens_from_its_folder(mock_coco):
    data_dir, _ = mock_coco
    assert prepared_dir("coco_captions", data_dir).parts[-3:] == ("coco_captions", "2014",
                                                                  "1.1.0")
    assert prepared_dir("coco_captions/2014:1.1.0", data_dir) is not None
    assert prepared_dir("coco_captions/2017", data_dir) is None
    source = open_split("coco_captions", "train+restval", data_dir)
    assert len(source) == MOCK_SPLITS["train"] + MOCK_SPLITS["restval"]
    example = source[3]
    assert set(example) == {"image", "image/filename", "image/id", "objects", "captions"}
    assert example["image"].dtype == np.uint8 and example["image"].shape[-1] == 3
    texts = build_tokenizer.texts_at(example, "captions/text")
    assert texts and all(isinstance(t, str) and t for t in texts)
    with pytest.raises(ConfigError, match="no split 'validation'"):
        open_split("coco_captions", "validation", data_dir)
    with pytest.raises(ConfigError, match=r"caption key 'caption/text': no 'caption'"):
        build_tokenizer.texts_at(example, "caption/text")


def test_tokenizer_command_reads_every_caption(mock_coco, capsys):
    data_dir, model = mock_coco
    texts = list(build_tokenizer.dataset_captions("coco_captions", "train+restval", data_dir))
    source = open_split("coco_captions", "train+restval", data_dir)
    assert len(texts) == sum(len(source[i]["captions"]["text"]) for i in range(len(source)))
    tok = image_text_preprocess(
        image_size=8, max_tokens=64, tokenizer={"kind": "sentencepiece", "path": model})
    out = tok({"image": np.zeros((8, 8, 3), np.uint8), "captions": {"text": [texts[0]]}})
    assert out["caption"][0] == 2 and 3 in out["caption"]
    assert build_tokenizer.main(["--dataset=coco_captions", f"--data_dir={data_dir}",
                                 "--caption_key=text", f"--output={model}.x"]) == 2
    assert "caption key 'text'" in capsys.readouterr().err


def test_each_epoch_takes_the_next_caption(tmp_path):
    """Of k captions, epoch e of the stream takes caption e mod k (evaluation: the first)."""
    source = [{"image": np.full((4, 4, 3), i, np.uint8),
               "captions": {"text": [f"{i} zero", f"{i} one", f"{i} two"]}} for i in range(4)]
    vocab = ["<pad>", "<unk>", "<bos>", "<eos>", "zero", "one", "two", "0", "1", "2", "3"]
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(vocab))
    pre = image_text_preprocess(image_size=4, max_tokens=4, vocabulary=str(path))
    ds = train_dataset(source, global_batch_size=4, seed=0, num_epochs=5, shard=HostShard(0, 1),
                       preprocess=pre)
    batches = list(ds)
    assert len(batches) == 5
    for epoch, batch in enumerate(batches):
        image_ids = batch["image"][:, 0, 0, 0].astype(np.int32)  # uint8 pixels = the index
        np.testing.assert_array_equal(batch["caption"][:, 1], image_ids + 7)
        np.testing.assert_array_equal(batch["caption"][:, 2], 4 + epoch % 3)
    # two processes: the same caption per (example, epoch)
    halves = [list(train_dataset(source, global_batch_size=4, seed=0, num_epochs=5,
                                 shard=HostShard(p, 2), preprocess=pre)) for p in range(2)]
    for epoch in range(5):
        assert set(halves[0][epoch]["caption"][:, 2]) | set(
            halves[1][epoch]["caption"][:, 2]) == {4 + epoch % 3}
    assert pre(source[1])["caption"].tolist() == [2, 8, 4, 3]


def test_pod_template_step_count_comes_from_epochs():
    full = load_config("clip_vit_b16_pod.py")
    assert full.data.batch_size == 32768 and full.model.sample_encoder.width == 768
    assert full.data.train_split == "train+restval"
    assert full.total_steps == math.ceil(100 * 113_287 / 32768) == 346
    assert full.optimizer.warmup_steps == 34
    assert full.data.eval_batch_size % 256 == 0
    assert load_config("clip_vit_b16_pod.py:epochs=32,batch=4096").total_steps == 886
    assert load_config("clip_vit_b16_pod.py:data=cc12m,steps=5000").total_steps == 5000
    with pytest.raises(ConfigError, match="steps=N"):
        load_config("clip_vit_b16_pod.py:data=cc12m")
    tiny = load_config("clip_vit_b16_pod.py:tiny")
    tiny.model.text_encoder.vocab_size = 40  # the preprocessing's check follows the model
    assert tiny.data.preprocess.vocab_size == 40


def flag_config(spec: str, *overrides: str) -> ml_collections.ConfigDict:
    """``configs/<spec>`` with the ``--config.a.b=value`` ``overrides`` applied as the command
    line's ``--config`` flag applies them (a locked ConfigDict)."""
    argv = ["main", f"--config={REPO / 'configs' / spec}", *overrides]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, flag_values=values, lock_config=True,
                                    sys_argv=argv)
    values(argv)
    return values.config


def test_tiny_runs_the_steps_it_is_given():
    """``tiny`` is one step unless ``steps=N`` says otherwise (it was one step whatever
    ``steps`` said)."""
    assert load_config("clip_vit_b16_pod.py:tiny").total_steps == 1
    assert load_config("clip_vit_b16_pod.py:tiny,steps=5").total_steps == 5
    assert flag_config("clip_vit_b16_pod.py:tiny,steps=5").optimizer.warmup_steps == 0


def test_the_documented_flags_set_the_template_without_its_variants():
    """FLIP's ``--config.model.sample_encoder.patch_dropout`` (docs/training.md) without the
    variant ``patch_dropout=`` (it was an unknown key: the template wrote the field only with
    the variant), a tower's ``scan``, and ``model.remat`` as a policy or one per tower (a
    boolean field refused both); the per-tower mapping freezes as the run freezes its config.
    A bad ``patch_dropout=`` variant stops at load, naming the range."""
    from contrastive_jax.training.models import remat_policies

    plain = flag_config("clip_vit_b16_pod.py:tiny")
    assert plain.model.sample_encoder.patch_dropout == 0.0
    config = flag_config("clip_vit_b16_pod.py:tiny",
                         "--config.model.sample_encoder.patch_dropout=0.5",
                         "--config.model.sample_encoder.scan=False",
                         "--config.model.remat=dots_saveable")
    assert config.model.sample_encoder.patch_dropout == 0.5
    assert config.model.sample_encoder.scan is False and config.model.remat == "dots_saveable"
    config = flag_config("clip_vit_b16_pod.py:tiny",
                         "--config.model.remat={'sample_encoder': 'dots_saveable'}")
    frozen = ml_collections.FrozenConfigDict(config)
    assert remat_policies(frozen.model, ("sample_encoder", "text_encoder")) == {
        "sample_encoder": "dots_saveable", "text_encoder": None}
    with pytest.raises(ConfigError, match=r"^ViT patch_dropout is the fraction of patch tokens "
                                          r"dropped in training and must lie in \[0, 1\) "
                                          r"\(0: off\); got 'half'$"):
        load_config("clip_vit_b16_pod.py:tiny,patch_dropout=half")


@pytest.mark.parametrize("spec", ["simclr_mnist1d.py:quick", "moco_mnist1d.py:quick",
                                  "clip_mnist1d.py:quick", "mi_gaussian.py:quick",
                                  "clip_vit_canvas.py:quick", "clip_vit_b16_pod.py:tiny",
                                  "lit_mnist1d.py:mode=scratch,quick"])
def test_the_readme_s_pod_scale_flags_apply_to_every_config(spec):
    """``--config.model.dtype=bfloat16`` and ``--config.model.remat=True`` (README, "At pod
    scale") on every shipped config: they were unknown keys outside the pod template."""
    config = flag_config(spec, "--config.model.dtype=bfloat16", "--config.model.remat=True")
    assert (config.model.dtype, config.model.remat) == ("bfloat16", True)


REFUSED_SETTINGS = [  # a documented name where it cannot apply: what works instead
    (["--config=configs/clip_mnist1d.py:quick", "--config.model.sample_encoder.scan=True"],
     "error: unknown config key scan (--config.model.sample_encoder.scan=True). What works: "
     "model.sample_encoder (encoder 'signal_cnn') has no Transformer blocks to scan (scan "
     "applies to a 'vit' or 'text_transformer' tower; this config's: "
     "--config.model.text_encoder.scan)\n"),
    # a tower the model does not have: was a KeyError with its traceback (status 1)
    (["--config=configs/simclr_mnist1d.py:quick", "--config.model.sample_encoder.scan=True"],
     "error: unknown config key sample_encoder (--config.model.sample_encoder.scan=True). What "
     "works: this config's towers are model.encoder ('signal_cnn'); scan applies to a 'vit' or "
     "'text_transformer' tower; this config has none\n"),
    (["--config=configs/clip_mnist1d.py:quick",
      "--config.model.sample_encoder.patch_dropout=0.5"],
     "error: unknown config key patch_dropout (--config.model.sample_encoder.patch_dropout=0.5). "
     "What works: model.sample_encoder (encoder 'signal_cnn') has no patch tokens to drop "
     "(patch_dropout applies to a 'vit' tower; this config has none)\n"),
    (["--config=configs/clip_vit_b16_pod.py:tiny", "--config.steps=5"],
     "error: unknown config key steps (--config.steps=5). What works: the config file's variant "
     "steps sets it: --config=configs/clip_vit_b16_pod.py:tiny,steps=5\n"),
    (["--config=configs/simclr_mnist1d.py:quick", "--config.model.remat_policy=dots_saveable"],
     "error: unknown config key remat_policy (--config.model.remat_policy=dots_saveable). What "
     "works: set the policy with --config.model.remat=POLICY (every tower; one of "
     "nothing_saveable, dots_saveable, dots_with_no_batch_dims_saveable) or one per tower, "
     "--config.model.remat=\"{'TOWER': 'POLICY'}\"\n"),
    (["--config=configs/simclr_mnist1d.py:quick", "--config.model.xyzzy=1"],
     "error: unknown config key xyzzy (--config.model.xyzzy=1). What works: model has dtype, "
     "encoder, head, init_temperature, learn_temperature, name, remat\n"),
    (["--config=configs/simclr_mnist1d.py:quick", "--config.data.batchsize=8"],
     "error: unknown config key batchsize (--config.data.batchsize=8). Did you mean "
     "\"batch_size\" instead of \"batchsize\"?\n"),
    (["--config=configs/simclr_mnist1d.py:quick", "--config.model.attention=xla"],
     "error: unknown config key attention (--config.model.attention=xla). What works: "
     "model.attention picks the kernel of the Transformer towers (vit, text_transformer); this "
     "config's model has none\n"),
]


def test_documented_settings_that_cannot_apply_say_what_works(tmp_path):
    """Each command line of :data:`REFUSED_SETTINGS` (one forked child each,
    tests/forked_command_lines.py) exits 2 with its one line: the setting that works, the
    variant that sets it, or that the config has no tower it applies to (it used to be
    "unknown config key scan", or a traceback for a tower the model does not have)."""
    runs = run_command_lines([[*args, f"--workdir={tmp_path / str(i)}"]
                              for i, (args, _) in enumerate(REFUSED_SETTINGS)])
    for run, (args, message) in zip(runs, REFUSED_SETTINGS, strict=True):
        assert (run.returncode, run.stderr) == (2, message), args


def test_pod_template_runs_at_tiny_size_on_mock_coco(mock_coco, tmp_path, capsys):
    """Two steps with patch dropout (``patch_dropout=0.5``: 2 of the tiny ViT's 4 patches) and
    an evaluation after the first (``--config.evaluation.every=1``: the template evaluates
    without labels, so a periodic evaluation has no probe to report; it stopped with a
    KeyError before) and the final one; then FLIP's unmasked tuning phase: the same workdir
    with ``patch_dropout = 0`` and one more step stops at start naming the change (with
    ``accept_config_change`` a changed config resumes: tests/test_config_record.py). Each
    evaluation also runs the benchmark task ``retrieval/coco_captions`` (``evaluation.tasks``),
    logged and in results.json, equal to ``python -m contrastive_jax.evaluate`` on the
    workdir."""
    data_dir, model = mock_coco
    config = load_config(f"clip_vit_b16_pod.py:tiny,tokenizer={model},patch_dropout=0.5")
    assert config.loss.strategy == "ring" and config.data.name == "coco_captions"
    config.data.data_dir = data_dir
    config.total_steps, config.evaluation.every = 2, 1
    config.checkpoint_every = 1  # checkpoints 1 and 2: the evaluation's fallback, below
    # the benchmark task of the evaluation command, on coco_captions' val split (16 images)
    config.evaluation.tasks = ("retrieval/coco_captions",)
    config.evaluation.task_overrides.test_split = "val"
    # float32 compute: the comparison with the command below is exact (bfloat16 rounds the
    # FSDP-sharded and the single-device text tower differently, and a near-tie of the barely
    # trained model can flip; the other template runs keep bfloat16)
    config.model.dtype = "float32"
    results = train.train_and_evaluate(config, str(tmp_path / "run"))
    out = capsys.readouterr().out
    assert "evaluating at step 1: alignment and uniformity, retrieval, tasks " \
           "retrieval/coco_captions..." in out
    assert "eval at step 1: alignment " in out and "x_to_y_r1 " in out
    assert "retrieval/coco_captions/mean_r1 " in out and "/mean_r5" not in out  # main only
    (periodic, final) = results["evaluations"]
    assert periodic["step"] == 1 and "linear_probe" not in periodic and "x_to_y_r1" in periodic
    assert final["step"] == 2
    task_keys = [k for k in results if k.startswith("retrieval/coco_captions/")]
    assert task_keys[0] == "retrieval/coco_captions/mean_r1" and len(task_keys) == 9
    assert all(k in periodic for k in task_keys)
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    evals = [row for row in logged if row["prefix"] == "eval"]  # TensorBoard: eval/<key>
    assert [row["step"] for row in evals] == [1, 2]
    assert evals[-1]["retrieval/coco_captions/mean_r1"] == results[task_keys[0]]
    # the same numbers as the evaluation command on the run's workdir (one device, no mesh)
    assert evaluate.main([f"--model={tmp_path / 'run'}", "--tasks=retrieval/coco_captions",
                          f"--data_dir={data_dir}", "--split=val",
                          f"--output={tmp_path / 'evaluated'}"]) == 0
    record = json.loads((tmp_path / "evaluated" / "results.json").read_text())
    command = record["tasks"]["retrieval/coco_captions"]["metrics"]
    assert {k: results[f"retrieval/coco_captions/{k}"] for k in command} == \
        pytest.approx(command, abs=1e-9)
    assert record["tasks"]["retrieval/coco_captions"]["examples"] == MOCK_SPLITS["val"]
    assert record["source"] == {"kind": "workdir", "location": str(tmp_path / "run"),
                                "step": 2, "skipped": []}
    # step 2's files no longer match the checksums saved with it (here: its record changed,
    # as it would read after its arrays changed): the command says so and evaluates step 1,
    # and results.json records both (it used to evaluate the damaged step without a word)
    record_file = tmp_path / "run" / "checkpoints" / "2" / "checksums" / "metadata"
    saved = record_file.read_text()
    sums = json.loads(saved)
    changed = next(name for name in sums["leaves"] if name.startswith("params/"))
    sums["leaves"][changed][0] ^= 1
    record_file.write_text(json.dumps(sums))
    capsys.readouterr()
    assert evaluate.main([f"--model={tmp_path / 'run'}", "--tasks=retrieval/coco_captions",
                          f"--data_dir={data_dir}", "--split=val",
                          f"--output={tmp_path / 'fallback'}"]) == 0
    warned = capsys.readouterr().err
    assert (f"warning: {tmp_path / 'run'}: step 2: it does not match the checksums recorded "
            "when it was saved (damaged files); evaluating step 1, the newest usable "
            "checkpoint") in warned, warned
    fallback = json.loads((tmp_path / "fallback" / "results.json").read_text())
    assert fallback["model"] == f"{tmp_path / 'run'} (step 1)"
    assert fallback["source"]["step"] == 1 and fallback["source"]["skipped"] == [
        "step 2: it does not match the checksums recorded when it was saved (damaged files)"]
    record_file.write_text(saved)
    assert results["steps"] == 2 and results["devices"] == 8
    assert np.isfinite(results["final_train_metrics"]["loss"])
    # captions without labels: retrieval and geometry, no probe
    assert "linear_probe" not in results and "zero_shot" not in results
    assert 0 <= results["x_to_y_r1"] <= results["x_to_y_r5"] <= results["x_to_y_r10"] <= 1
    assert 0 <= results["alignment"] <= 4 and results["uniformity"] <= 0

    config.model.sample_encoder.patch_dropout = 0.0  # the unmasked tuning phase
    config.total_steps, config.evaluation.every = 3, 0
    with pytest.raises(ConfigError, match=r"model\.sample_encoder\.patch_dropout: 0\.5 -> 0\.0"
                                          r".*--accept_config_change"):
        train.train_and_evaluate(config, str(tmp_path / "run"))


def test_clipa_recipe_low_resolution_masked_then_full_resolution_from_its_workdir(
        mock_coco, tmp_path, capsys):
    """The two-run recipe of the template's docstring on the tiny template: ``res=16,
    patch_dropout=0.5`` (1 patch of 16 x 16 pixels instead of 4), then
    ``pretrained=<its workdir>,mode=finetune,res=32``: the first run's model at 32 x 32, its
    position table resampled from 1 to 4 patch rows, without the source's patch dropout, and
    its pixels normalised as the first run's (CLIP's mean and std, from its config.json; they
    used to be left out, feeding the tuning run [0, 1] pixels)."""
    data_dir, model = mock_coco
    low = load_config(f"clip_vit_b16_pod.py:tiny,tokenizer={model},res=16,patch_dropout=0.5")
    assert low.model.sample_encoder.image_size == low.data.preprocess.image_size == 16
    low.data.data_dir, low.evaluation.enabled = data_dir, False
    assert train.train_and_evaluate(low, str(tmp_path / "low"))["steps"] == 1
    full = load_config(f"clip_vit_b16_pod.py:tiny,tokenizer={model},"
                       f"pretrained={tmp_path / 'low'},mode=finetune,res=32")
    assert full.model.sample_encoder.image_size == full.data.preprocess.image_size == 32
    assert full.model.sample_encoder.patch_dropout == 0.0 and "frozen" not in full.model
    full.data.data_dir, full.evaluation.enabled = data_dir, False
    capsys.readouterr()
    results = train.train_and_evaluate(full, str(tmp_path / "full"))
    out = capsys.readouterr().out
    assert "sample_encoder/positions moved from 1 to 4 positions" in out, out[-3000:]
    assert results["steps"] == 1 and np.isfinite(results["final_train_metrics"]["loss"])
    recorded = json.loads((tmp_path / "full" / "config.json").read_text())["data"]["preprocess"]
    assert (recorded["mean"], recorded["std"]) == (list(low.data.preprocess.mean),
                                                   list(low.data.preprocess.std))
    assert f"data.preprocess.mean / std from {tmp_path / 'low'}/config.json" in out


def test_pod_template_start_errors(mock_coco, tmp_path):
    data_dir, model = mock_coco
    config = load_config("clip_vit_b16_pod.py:tiny")  # no tokenizer given
    config.data.data_dir = data_dir
    with pytest.raises(ConfigError, match=r"(?s)tokenizer.path must name.*build_tokenizer"):
        train.train_and_evaluate(config, str(tmp_path / "a"))
    config = load_config(f"clip_vit_b16_pod.py:tiny,tokenizer={model}")
    config.data.data_dir = data_dir
    config.model.text_encoder.vocab_size = 8
    with pytest.raises(ConfigError, match=r"model\.text_encoder\.vocab_size = 8"):
        train.train_and_evaluate(config, str(tmp_path / "b"))
    config = load_config(f"clip_vit_b16_pod.py:tiny,tokenizer={model}")
    config.data.data_dir = str(tmp_path / "empty")
    with pytest.raises(DatasetNotPreparedError,
                       match=r"(?s)'coco_captions' is not prepared.*tfds build coco_captions"):
        train.train_and_evaluate(config, str(tmp_path / "c"))


def converted_siglip(tmp_path):
    """A converted open_clip SigLIP (the timm map-head trunk of
    tests/fixtures/open_clip_tiny_siglip) with its text tower widened to the 2,000-piece SigLIP
    tokenizer fixture, which the directory carries."""
    from test_load_pretrained import siglip_hub_directory

    from contrastive_jax.training.models.converters import clip_import, converted_directory

    converted = clip_import.convert_open_clip(siglip_hub_directory(tmp_path))
    block = {**converted.model, "text_encoder": {**converted.model["text_encoder"],
                                                 "vocab_size": 2000}}
    params = converted.params
    table = params["text_encoder"]["tokens"]["embedding"]
    params["text_encoder"]["tokens"]["embedding"] = np.resize(table, (2000, table.shape[1]))
    source = tmp_path / "siglip"
    converted_directory.save_converted(source, block, params, preprocess=converted.preprocess,
                                       tokenizer=converted.tokenizer)
    return source


def test_lit_from_a_pretrained_siglip_is_one_config(mock_coco, tmp_path, monkeypatch):
    """``pretrained=DIR`` (a converted open_clip SigLIP: the timm map-head trunk of
    tests/fixtures/open_clip_tiny_siglip, its text tower widened to the 2,000-piece SigLIP
    tokenizer fixture, which the directory carries): the source's model block and tokenizer,
    SigLIP's method, mean and std from the directory; one step on 8 devices (the ring loss)
    leaves the locked image tower bit-identical to the converted one and moves the text tower.
    The run reads the directory's description once (the config file's ``pretrained=`` and the
    run's start share it) and its parameters once."""
    from test_load_pretrained import FIXTURES

    from contrastive_jax.pretrained import read_source, with_weights
    from contrastive_jax.training.models.converters import pretrained_source
    from contrastive_jax.training.parameter_paths import leaves_by_path

    def read(path):  # the parameters a source holds, by path
        return leaves_by_path(with_weights(read_source(path)).params)

    data_dir, _ = mock_coco
    source = converted_siglip(tmp_path)
    reads = []
    describe, restore = pretrained_source._converted, pretrained_source._restore
    monkeypatch.setitem(pretrained_source._READERS, "converted",
                        lambda *a, **k: reads.append("description") or describe(*a, **k))
    monkeypatch.setattr(pretrained_source, "_restore",
                        lambda *a, **k: reads.append("weights") or restore(*a, **k))
    config = load_config(f"clip_vit_b16_pod.py:tiny,pretrained={source}")
    assert config.method == "siglip" and config.model.frozen == "sample_encoder"
    assert config.data.preprocess.tokenizer.kind == "sentencepiece_open_clip"
    assert (config.data.preprocess.image_size, config.data.preprocess.max_tokens) == (16, 10)
    assert (config.data.preprocess.resize, config.data.preprocess.resize_mode) == ("bicubic",
                                                                                    "squash")
    config.data.data_dir = data_dir
    results = train.train_and_evaluate(config, str(tmp_path / "run"))
    assert results["steps"] == 1 and np.isfinite(results["final_train_metrics"]["loss"])
    assert reads == ["description", "weights"], reads
    recorded = json.loads((tmp_path / "run" / "config.json").read_text())
    assert recorded["data"]["preprocess"]["mean"] == [0.5, 0.5, 0.5]
    before, after = read(source), read(tmp_path / "run")
    assert sorted(before) == sorted(after)
    for path, value in before.items():
        same = after[path].tobytes() == value.tobytes()
        assert same == path.startswith("sample_encoder/"), path
    assert (FIXTURES / "siglip_spm.model").read_bytes() == \
        (source / "tokenizer" / "spiece.model").read_bytes()
    with pytest.raises(ConfigError, match="mode must be 'locked'"):
        load_config(f"clip_vit_b16_pod.py:tiny,pretrained={source},mode=scratch")


def test_a_pretrained_model_is_evaluated_as_load_pretrained_computes_it(mock_coco, tmp_path):
    """evaluate_pretrained (the trainer's evaluation, before any step) of the converted SigLIP
    on mock COCO's val split: retrieval Recall@k and alignment equal those of
    load_pretrained's model, preprocessing (squash) and tokenizer applied to the split's
    encoded images and first captions by hand."""
    from contrastive_jax.pretrained import evaluate_pretrained, load_pretrained
    from contrastive_jax.training.data.sources import open_split
    from contrastive_jax.training.evaluation import alignment, retrieval_recall

    data_dir, _ = mock_coco
    source = converted_siglip(tmp_path)
    config = load_config(f"clip_vit_b16_pod.py:tiny,pretrained={source}")
    config.data.data_dir = data_dir
    config.model.dtype = "float32"
    results = evaluate_pretrained(config)
    model, preprocess, tokenizer = load_pretrained(source)
    val = open_split("coco_captions", "val", data_dir)
    examples = [val[i] for i in range(len(val))]
    x = model.embed_samples(preprocess([e["image"] for e in examples]))
    y = model.embed_texts(tokenizer([e["captions"]["text"][0] for e in examples]))
    want = retrieval_recall(np.asarray(x), np.asarray(y))
    assert len(examples) == 16 and want
    for key, value in want.items():
        assert results[key] == pytest.approx(value), key
    assert results["alignment"] == pytest.approx(alignment(np.asarray(x), np.asarray(y)),
                                                 rel=1e-5)
