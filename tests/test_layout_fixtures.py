"""Directories written by today's code are read the same tomorrow: the committed fixtures of
tests/fixtures/make_layout_fixtures.py (commit 12c4bf0, before the one pretrained-source reader
and the run's resolve step).

- ``converted_v0_3_siglip``: clip_import's converted directory of the open_clip SigLIP parity
  fixture. ``load_pretrained`` gives open_clip's features and its squash preprocessing,
  ``model.init_from`` loads every parameter bit for bit, and ``clip_export`` writes the
  original state dict back, bit for bit.
- ``workdir_v0_3_clip``: config.json and checkpoint 2 of a CLIP run on MNIST-1D. Loaded by
  ``load_pretrained`` (its parameters and its BatchNorm statistics) the model embeds the fixed
  inputs as the trainer's own model of that checkpoint did at the fixture's commit; the run
  resumes from it with today's config to its last step.

Both are given as paths relative to the working directory, as a user types them.
"""

import json
import os
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file
from test_clip_export import TINY_TIMM
from test_train import load_config

from contrastive_jax import clip_export
from contrastive_jax.pretrained import CheckpointFallbackWarning, ImagePreprocess, load_pretrained
from contrastive_jax.training.models import build_model
from contrastive_jax.training.parameter_paths import leaves_by_path
from contrastive_jax.training.run import init_from
from contrastive_jax.training.train import train_and_evaluate

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
CONVERTED = FIXTURES / "converted_v0_3_siglip"
WORKDIR = FIXTURES / "workdir_v0_3_clip"
SIGLIP = FIXTURES / "open_clip_tiny_siglip"


def relative(path: pathlib.Path) -> str:
    """``path`` relative to the working directory, as a user gives it."""
    return os.path.relpath(path)


def rel_error(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def test_a_converted_directory_of_today_loads_initialises_and_exports(tmp_path):
    model, preprocess, _ = load_pretrained(relative(CONVERTED), tokenizer=False)
    assert preprocess == ImagePreprocess(16, (0.5,) * 3, (0.5,) * 3, "bicubic", "squash")
    reference = np.load(SIGLIP / "outputs.npz")
    x = nnx.jit(lambda m, v: m.embed_samples(v))(model, jnp.asarray(reference["images"]))
    y = nnx.jit(lambda m, t: m.embed_texts(t))(model, jnp.asarray(reference["texts"]))
    assert rel_error(x, reference["image_features"]) < 1e-5
    assert rel_error(y, reference["text_features"]) < 1e-5
    # a run's model started from it holds what load_pretrained holds, bit for bit
    block = json.loads((CONVERTED / "model.json").read_text())
    _, params, rest = nnx.split(build_model(block, nnx.Rngs(1)), nnx.Param, ...)
    params, _, lines = init_from.load_into(params, rest, block, {"path": relative(CONVERTED)})
    loaded = leaves_by_path(nnx.state(model, nnx.Param))
    for name, value in leaves_by_path(params).items():
        assert np.asarray(value).tobytes() == np.asarray(loaded[name]).tobytes(), name
    assert lines[-1].startswith("initialised the model from")
    # and exported, it is open_clip's state dict again
    out = tmp_path / "open_clip"
    assert clip_export.main([f"--converted={relative(CONVERTED)}", f"--output={out}",
                             f"--timm_model_name={TINY_TIMM}"]) == 0
    exported, original = load_file(out / "open_clip_model.safetensors"), load_file(
        SIGLIP / "open_clip_model.safetensors")
    assert sorted(exported) == sorted(original)
    assert all(exported[k].tobytes() == v.tobytes() for k, v in original.items())


def test_a_workdir_of_today_loads_with_its_batch_norm_statistics():
    """load_pretrained of the CLIP workdir (a signal CNN with BatchNorm, a text Transformer):
    the embeddings of the fixed inputs equal those of the trainer's own model of checkpoint 2
    (expected.json; float32 on another host or flags: to 1e-5 of their size), and the run's
    tokenizer gives the recorded ids."""
    expected = json.loads((WORKDIR / "expected.json").read_text())
    model, preprocess, tokenizer = load_pretrained(relative(WORKDIR))
    assert preprocess is None  # a signal run: no image preprocessing
    ids = tokenizer(expected["inputs"]["captions"])
    assert ids.tolist() == expected["token_ids"]
    signal = np.random.default_rng(0).normal(size=(2, 40, 1)).astype(np.float32)
    samples = nnx.jit(lambda m, v: m.embed_samples(v))(model, jnp.asarray(signal))
    texts = nnx.jit(lambda m, t: m.embed_texts(t))(model, jnp.asarray(ids))
    assert rel_error(samples, expected["embed_samples"]) < 1e-5
    assert rel_error(texts, expected["embed_texts"]) < 1e-5


def test_a_workdir_of_today_resumes_and_loads_at_any_step(tmp_path):
    """Today's config of the fixture's command resumes the workdir (no recorded difference to
    accept) and trains steps 3 and 4 to finite losses, onto 8 devices (written on one). Then
    ``load_pretrained`` of the workdir holds the last checkpoint's model bit for bit (its
    parameters and BatchNorm statistics hash to the digest the trainer wrote in
    results.json), ``step=2`` gives the fixture's own checkpoint (the recorded embeddings) and
    the tokenizer is the run's, the caption words."""
    from types import SimpleNamespace

    from contrastive_jax.training.data.text.text_tokenizers import load_tokenizer
    from contrastive_jax.training.step.train_state import params_digest

    workdir = tmp_path / "run"
    shutil.copytree(WORKDIR, workdir, ignore=shutil.ignore_patterns("expected.json"))
    config = load_config("clip_mnist1d.py:quick")
    config.total_steps, config.checkpoint_every = 4, 2
    config.evaluation.enabled = False
    results = train_and_evaluate(config, os.path.relpath(workdir))
    assert results["resumed_from"] == 2 and results["steps"] == 4
    assert np.isfinite(results["final_train_metrics"]["loss"])
    assert jax.device_count() == 8 and results["devices"] == 8
    expected = json.loads((WORKDIR / "expected.json").read_text())
    signal = jnp.asarray(np.random.default_rng(0).normal(size=(2, 40, 1)).astype(np.float32))
    last, preprocess, tokenizer = load_pretrained(workdir)
    assert preprocess is None
    _, params, rest = nnx.split(last, nnx.Param, ...)
    assert params_digest(SimpleNamespace(params=params, rest=rest)) == results["params_sha256"]
    second, _, _ = load_pretrained(workdir, step=2)
    embed = nnx.jit(lambda m, v: m.embed_samples(v))
    assert rel_error(embed(second, signal), expected["embed_samples"]) < 1e-5
    assert rel_error(embed(last, signal), expected["embed_samples"]) > 1e-3
    ids = tokenizer(["a signal of the digit three"])
    assert ids.shape == (1, config.model.text_encoder.max_tokens)
    words = load_tokenizer({"kind": "words", "path": ""})
    assert words.decode(ids) == ["a signal of the digit three"]
    # checkpoint 4 no longer matches its checksums (its record swapped for step 2's, as if its
    # arrays had changed): the latest usable is step 2, said with a warning, not step 4
    record = workdir / "checkpoints" / "4" / "checksums" / "metadata"
    record.write_text((workdir / "checkpoints" / "2" / "checksums" / "metadata").read_text())
    with pytest.warns(CheckpointFallbackWarning, match=r"step 4: it does not match the "
                      r"checksums .*; using step 2, the newest usable checkpoint"):
        fallback, _, _ = load_pretrained(workdir)
    assert rel_error(embed(fallback, signal), expected["embed_samples"]) < 1e-5
