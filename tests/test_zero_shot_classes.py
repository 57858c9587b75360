"""Zero-shot classification with class names and prompt templates (evaluation.zero_shot)."""

import copy
import importlib.util
import json
import math
from pathlib import Path

import jax
import numpy as np
import pytest

from contrastive_jax.errors import ConfigError
from contrastive_jax.mesh import make_mesh
from contrastive_jax.training.data import open_split
from contrastive_jax.training.data.text import captions
from contrastive_jax.training.data.text import prompt_templates as pt
from contrastive_jax.training.data.text.text_tokenizers import load_tokenizer
from contrastive_jax.training.evaluation import (
    evaluators,
    run_evaluation,
    zero_shot_accuracy,
    zero_shot_topk,
    zero_shot_weights,
)
from contrastive_jax.training.methods import method_for
from contrastive_jax.training.step.train_state import create_state, replicated

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"


def _unit(v):
    n = math.sqrt(sum(a * a for a in v))
    return [a / n for a in v]


def _slow_weights(prompts):
    """The obvious loops: unit prompts, their mean over templates, unit again."""
    weights = []
    for per_class in prompts:
        units = [_unit(p) for p in per_class]
        weights.append(_unit([sum(u[j] for u in units) / len(units)
                              for j in range(len(units[0]))]))
    return weights


def _slow_topk(x, labels, prompts, k):
    """Cosines with the slow weights; correct when fewer than k classes score higher."""
    unit, weights = _unit, _slow_weights(prompts)
    correct = 0
    for xi, yi in zip(x, labels, strict=True):
        xi = unit(xi)
        scores = [sum(a * b for a, b in zip(xi, w, strict=True)) for w in weights]
        correct += sum(s > scores[yi] for s in scores) < k
    return correct / len(x)


def test_topk_equals_a_slow_reference_in_float64():
    """Top-1 and top-5 of the prompt-ensembled weights (normalised mean of normalised prompt
    embeddings, [CLIP] Sec. 3.1.4) equal plain Python loops, in float64; top-1 equals
    zero_shot_accuracy."""
    with jax.enable_x64(True):
        rng = np.random.default_rng(0)
        prompts = rng.normal(size=(7, 4, 5)) * rng.uniform(0.1, 10, size=(7, 4, 1))
        x = rng.normal(size=(60, 5))
        labels = rng.integers(0, 7, size=60)
        np.testing.assert_allclose(zero_shot_weights(prompts), _slow_weights(prompts.tolist()),
                                   rtol=1e-14, atol=1e-15)
        scores = zero_shot_topk(x, labels, prompts)
        assert set(scores) == {"top1", "top5"}
        for k in (1, 5):
            assert scores[f"top{k}"] == _slow_topk(x.tolist(), labels.tolist(),
                                                   prompts.tolist(), k)
        assert scores["top1"] == zero_shot_accuracy(x, labels, prompts)
        assert 0 < scores["top1"] < scores["top5"] < 1
        assert set(zero_shot_topk(x, labels % 4, prompts[:4])) == {"top1"}  # < 5 classes


def test_a_non_finite_embedding_is_never_correct():
    prompts = np.eye(6)[:, None, :]
    x = np.eye(6)
    x[2, 0] = np.nan
    scores = zero_shot_topk(x, np.arange(6), prompts)
    assert scores == {"top1": 5 / 6, "top5": 5 / 6}


def test_template_sets():
    """CLIP's 80 ImageNet templates and the 7 selected ones, equal to open_clip's (fixture),
    each with one {} for the class name."""
    recorded = json.loads((FIXTURES / "clip_bpe_imagenet_templates.json").read_text())
    assert len(pt.resolve_templates("imagenet")) == 80
    assert list(pt.resolve_templates("imagenet")) == recorded["imagenet"]
    assert list(pt.resolve_templates("imagenet_selected")) == recorded["simple_imagenet"]
    assert pt.resolve_templates("simple") == ("a photo of a {}.",)
    assert all(t.count("{}") == 1 for t in pt.IMAGENET_TEMPLATES)
    assert pt.resolve_templates(["{} at dusk"]) == ("{} at dusk",)


def test_class_names_from_a_tfds_class_label_a_file_and_a_tuple(tmp_path):
    source = open_split("digit_captions/mnist1d", "test")
    names = pt.resolve_class_names(
        "tfds", label_names=lambda: pt.tfds_label_names(source.dataset_info, "label"))
    assert names == captions.CLASS_NAMES
    listed = tmp_path / "names.txt"
    listed.write_text("\n".join(names) + "\n\n")
    assert pt.resolve_class_names(str(listed)) == names
    assert pt.resolve_class_names(list(names)) == names
    with pytest.raises(ConfigError, match="not a ClassLabel"):
        pt.tfds_label_names(source.dataset_info, "caption_id")
    with pytest.raises(ConfigError, match="not a feature"):
        pt.tfds_label_names(source.dataset_info, "labels")


def test_prompt_tokens_use_the_given_tokenizer():
    tok = load_tokenizer({"kind": "clip_bpe", "path": str(FIXTURES / "clip_bpe_merges.txt.gz")})
    tokens = pt.prompt_tokens(("cat", "sea lion"), ("a photo of a {}.", "{}"), tok, 12)
    assert tokens.shape == (2, 2, 12)
    np.testing.assert_array_equal(tokens[1, 0], tok.encode(["a photo of a sea lion."], 12)[0])
    np.testing.assert_array_equal(tokens[0, 1], tok.encode(["cat"], 12)[0])


@pytest.mark.parametrize("field, value, message", [
    ("templates", "imagenett", "not a template set"),
    ("templates", ("a photo",), "exactly one"),
    ("templates", ("{} and {}",), "exactly one"),
    ("templates", (), "is empty"),
    ("class_names", ("cat", "cat"), "appears twice"),
    ("class_names", ("cat", ""), "an empty one"),
    ("class_names", "/nonexistent/names.txt", "no such file"),
])
def test_bad_fields_are_config_errors(field, value, message):
    with pytest.raises(ConfigError, match=message):
        if field == "templates":
            pt.resolve_templates(value)
        else:
            pt.resolve_class_names(value)


def _dual_encoder():
    path = REPO / "configs" / "clip_mnist1d.py"
    spec = importlib.util.spec_from_file_location("cfg", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config("quick")
    graphdef, state, _ = create_state(config, 6, method_for(config))
    return config, graphdef, state


def test_class_names_and_digit_templates_give_the_digit_prompts_result():
    """evaluation.zero_shot with the dataset's ClassLabel names and the digit templates is the
    same classifier as the digit prompts (evaluation.zero_shot_prompts = "signal"): same top-1,
    on 8 devices and on 1 (the padded pass gathers the same rows); top-5 >= top-1."""
    config, graphdef, state = _dual_encoder()
    mesh = make_mesh({"data": 8}, jax.devices())
    state8 = jax.device_put(state, replicated(mesh, state))
    pairs = run_evaluation.pair_embeddings(graphdef, state8, config, mesh, "test")
    digit_prompts = run_evaluation.prompt_embeddings(graphdef, state8, config, "signal")
    digits = zero_shot_accuracy(pairs["x"], pairs["label"], digit_prompts)
    named = run_evaluation.class_name_prompt_embeddings(graphdef, state8, config,
                                                        captions.CLASS_NAMES,
                                                        captions.TEMPLATES["signal"])
    np.testing.assert_allclose(named, digit_prompts, rtol=1e-6, atol=1e-6)
    config = copy.deepcopy(config)
    config.evaluation.zero_shot.class_names = "tfds"
    config.evaluation.zero_shot.templates = captions.TEMPLATES["signal"]
    eight = run_evaluation.class_name_zero_shot(graphdef, state8, config, mesh)
    one_mesh = make_mesh({"data": 1}, jax.devices()[:1])
    one = run_evaluation.class_name_zero_shot(
        graphdef, jax.device_put(state, replicated(one_mesh, state)), config, one_mesh)
    assert set(eight) == {"zero_shot", "zero_shot_top5"}
    assert eight["zero_shot"] == pytest.approx(digits, abs=1e-12)
    assert eight == pytest.approx(one, abs=1e-12)
    assert eight["zero_shot"] <= eight["zero_shot_top5"] <= 1
    with pytest.raises(ConfigError, match="not both"):
        evaluators.evaluate(graphdef, state8, config, mesh)
    config.evaluation.zero_shot_prompts = ""
    config.evaluation.classification = False
    results = evaluators.evaluate(graphdef, state8, config, mesh)
    assert {k: results[k] for k in eight} == eight


def test_zero_shot_config_errors():
    config, graphdef, state = _dual_encoder()
    mesh = make_mesh({"data": 8}, jax.devices())
    state = jax.device_put(state, replicated(mesh, state))
    config.evaluation.zero_shot_prompts = ""
    config.evaluation.zero_shot.class_names = ("zero", "one", "two")
    config.evaluation.zero_shot.templates = "simple"
    with pytest.raises(ConfigError, match="gave 3 names"):
        run_evaluation.class_name_zero_shot(graphdef, state, config, mesh)
    config.evaluation.zero_shot.class_names = "tfds"
    config.evaluation.zero_shot.input_key = "pixels"
    with pytest.raises(ConfigError, match="input_key"):
        run_evaluation.class_name_zero_shot(graphdef, state, config, mesh)
    config.evaluation.zero_shot.input_key = ""
    config.evaluation.zero_shot.clas_names = "tfds"
    with pytest.raises(ConfigError, match="clas_names"):
        run_evaluation.class_name_zero_shot(graphdef, state, config, mesh)


def test_image_dataset_pass_and_clip_bpe_prompts_equal_the_model_on_prepared_inputs():
    """The image-text template (tiny, float32) with the clip_bpe tokenizer: a classification
    dataset's images are resized (bicubic) and centre-cropped to data.preprocess.image_size as
    in evaluation, normalised by data.preprocess.mean/std, gathered over 8 devices in order,
    and embed like the model on those inputs; the
    prompts embed like the text tower on the tokenizer's rows."""
    from flax import nnx

    from contrastive_jax.training.augmentations.pixels import CLIP_MEAN, CLIP_STD
    from contrastive_jax.training.data.image_crops import center_crop

    spec = importlib.util.spec_from_file_location("pod", REPO / "configs" / "clip_vit_b16_pod.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config("tiny")
    merges = str(FIXTURES / "clip_bpe_merges.txt.gz")
    config.data.preprocess.tokenizer = {"kind": "clip_bpe", "path": merges}
    config.model.dtype = "float32"
    config.model.remat = False
    config.model.text_encoder.vocab_size = 2406
    config.data.preprocess.update({"mean": CLIP_MEAN, "std": CLIP_STD})
    graphdef, state, _ = create_state(config, 2, method_for(config))
    mesh = make_mesh({"data": 8}, jax.devices())
    state = jax.device_put(state, replicated(mesh, state))
    rng = np.random.default_rng(0)
    source = [{"image": rng.integers(0, 256, (20, 28, 3), dtype=np.uint8), "label": i % 5,
               "extra": np.float32(i)} for i in range(12)]
    x, y = run_evaluation.zero_shot_samples(graphdef, state, config, mesh, source, "image",
                                            "label", 8)
    model = nnx.merge(graphdef, state.params, state.rest)
    images = np.stack([center_crop(e["image"], 32) for e in source]) / np.float32(255)
    images = (images - np.float32(CLIP_MEAN)) / np.float32(CLIP_STD)  # normalised on device
    np.testing.assert_array_equal(y, [i % 5 for i in range(12)])
    np.testing.assert_allclose(x, model.embed_samples(images.astype(np.float32)),
                               rtol=1e-5, atol=1e-6)
    names, templates = ("cat", "dog", "sea lion"), pt.resolve_templates("imagenet_selected")
    prompts = run_evaluation.class_name_prompt_embeddings(graphdef, state, config, names,
                                                          templates)
    tok = load_tokenizer({"kind": "clip_bpe", "path": merges})
    rows = tok.encode([t.format(n) for n in names for t in templates], 12)
    np.testing.assert_allclose(prompts, np.asarray(model.embed_texts(rows)).reshape(3, 7, -1),
                               rtol=1e-5, atol=1e-6)
    config.data.preprocess.vocab_size = 64
    with pytest.raises(ConfigError, match=r"data\.preprocess\.vocab_size"):
        run_evaluation.class_name_prompt_embeddings(graphdef, state, config, names, templates)
