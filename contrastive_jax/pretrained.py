"""One call to a ready pretrained model: ``load_pretrained(path_or_name)``.

    model, preprocess, tokenizer = load_pretrained("converted/vit_b32_laion")
    images = preprocess([open("cat.jpg", "rb").read()])        # (1, S, S, 3) float32
    texts = tokenizer(["a photo of a cat", "a photo of a dog"])  # (2, context) int32
    x, y = model.embed_samples(images), model.embed_texts(texts)

the counterpart of open_clip's ``create_model_and_transforms`` + ``get_tokenizer``
([OpenCLIP] in docs/references.md). ``path_or_name`` is, in the order tried:

- a **converted directory** (``model.json`` + ``params/``, written by the converters:
  :mod:`~contrastive_jax.training.models.converters.clip_import`,
  :mod:`~contrastive_jax.training.models.converters.big_vision_import`), with its
  ``preprocess.json`` and ``tokenizer.json``;
- a **trainer workdir** of a dual encoder (``config.json`` + ``checkpoints/``): the latest
  usable checkpoint's parameters, the run's ``data.preprocess`` pixels and tokenizer;
- an **open_clip model** that open_clip's own files describe: a hub-layout directory
  (``open_clip_config.json`` + ``open_clip_model.safetensors``), a Hugging Face cache snapshot,
  or a model name (``"ViT-B-16-SigLIP"``, with ``pretrained=TAG`` for a named release), all
  resolved to local files only (nothing is downloaded; a name with no local file says where to
  put it), converted in memory by
  :func:`contrastive_jax.training.models.converters.clip_import.convert_open_clip`.

What comes back:

- ``model``: the :class:`~contrastive_jax.training.models.DualEncoder` holding the parameters
  (float32; ``dtype="bfloat16"`` computes in bfloat16), in inference mode when called with
  ``train=False`` (the default of ``embed_samples`` / ``embed_texts``);
- ``preprocess``: an :class:`ImagePreprocess`, the model's evaluation transform (open_clip's
  ``image_transform(is_train=False)``): ``resize_mode="shortest"`` resizes the shorter side to
  the image size and takes the central square (:func:`~contrastive_jax.training.data.
  image_crops.center_crop`, pixel-equal to open_clip's on the parity fixture), ``"squash"``
  resizes the whole image to a square (SigLIP's), with the model's kernel (bicubic or
  bilinear), then ``(x / 255 - mean) / std``;
- ``tokenizer``: a :class:`TextTokenizer`, the model's tokenizer at its context length
  (ids equal to open_clip's for CLIP's BPE and SigLIP's SentencePiece), or ``None`` with
  ``tokenizer=False``.

The three are what zero-shot classification and retrieval need:
:func:`contrastive_jax.training.evaluation.zero_shot.zero_shot_weights` of the prompts'
embeddings and :func:`contrastive_jax.training.evaluation.retrieval.retrieval_recall` of the
two towers' embeddings (docs/pretrained.md, "One call to a ready model"). A training run
starts from the same sources with ``config.model.init_from = {"path": path_or_name}``, and
:func:`evaluate_pretrained` runs the trainer's evaluation (retrieval, zero-shot with class
names) on such a config before any training.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from contrastive_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class ImagePreprocess:
    """A model's evaluation transform: images (encoded bytes or ``(H, W, 3)`` uint8 arrays) to
    ``(B, image_size, image_size, 3)`` float32 ``(x / 255 - mean) / std``.

    ``resize_mode``: ``"shortest"`` (shorter side to ``image_size``, central square; open_clip's
    default, CLIP's) or ``"squash"`` (the whole image to ``image_size x image_size``; open_clip's
    SigLIP models); ``interpolation``: ``"bicubic"`` or ``"bilinear"``.
    """

    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str = "bicubic"
    resize_mode: str = "shortest"

    def __post_init__(self):
        from contrastive_jax.training.data.image_crops import check_resize, check_resize_mode

        check_resize_mode(self.resize_mode)
        check_resize(self.interpolation)
        if len(self.mean) != 3 or len(self.std) != 3:
            raise ConfigError(f"mean and std need 3 channels; got {self.mean}, {self.std}")

    def crop(self, image) -> np.ndarray:
        """``(image_size, image_size, 3)`` uint8 of one image (before the normalisation)."""
        from contrastive_jax.training.data.image_crops import evaluation_image

        return evaluation_image(image, self.image_size, resize=self.interpolation,
                                resize_mode=self.resize_mode)

    def __call__(self, images: Sequence[Any]) -> np.ndarray:
        if isinstance(images, bytes | np.ndarray) and not (
                isinstance(images, np.ndarray) and images.ndim == 4):
            images = [images]
        crops = np.stack([self.crop(image) for image in images]).astype(np.float32) / 255.0
        mean, std = np.asarray(self.mean, np.float32), np.asarray(self.std, np.float32)
        return (crops - mean) / std


@dataclasses.dataclass(frozen=True)
class TextTokenizer:
    """Texts to ``(B, context_length)`` int32 token ids with a model's own tokenizer
    (:func:`contrastive_jax.training.data.text.text_tokenizers.load_tokenizer`)."""

    tokenizer: Any
    context_length: int

    def __call__(self, texts: str | Sequence[str]) -> np.ndarray:
        texts = [texts] if isinstance(texts, str | bytes) else list(texts)
        return self.tokenizer.encode(texts, self.context_length)


@dataclasses.dataclass(frozen=True)
class PretrainedSource:
    """What a source holds, before a model is built: the ``model`` block, the parameters (a
    nested pure dict, as ``nnx.to_pure_dict``), the pixel settings and the tokenizer spec
    (``data.preprocess`` fields; either may be ``None``) and a description for messages."""

    model: dict[str, Any]
    params: Any
    preprocess: dict[str, Any] | None
    tokenizer: dict[str, Any] | None
    description: str
    tokenizer_name: str | None = None  # open_clip's hf_tokenizer_name, for messages


def read_source(path_or_name: str | os.PathLike, *, pretrained: str | None = None,
                step: int | None = None) -> PretrainedSource:
    """The :class:`PretrainedSource` of a converted directory, a trainer workdir (its latest
    usable checkpoint, or ``step``), a big_vision SigLIP ``.npz`` file, or an open_clip hub
    directory / cache / model name (module docstring); a :class:`ConfigError` saying what was
    looked for otherwise."""
    path = os.fspath(path_or_name)
    if step is not None and not (os.path.isdir(os.path.join(path, "checkpoints"))
                                 and os.path.isfile(os.path.join(path, "config.json"))):
        raise ConfigError(f"step={step} names a checkpoint of a trainer workdir; {path} is not "
                          "one (config.json + checkpoints/): drop the step")
    if path.endswith(".npz") and os.path.isfile(path):
        from contrastive_jax.training.models.converters.big_vision_import import (
            convert_npz,
            npz_preprocess,
        )

        try:
            model, params = convert_npz(path)
        except ConfigError as err:
            if "_heads" not in str(err):
                raise
            raise ConfigError(f"{path}: {err}; convert it with its heads first: python -m "
                              "contrastive_jax.training.models.converters.big_vision_import "
                              f"--checkpoint={path} --vision_heads=N --text_heads=N "
                              "--output=DIR, then load DIR") from None
        return PretrainedSource(model, params, npz_preprocess(model),
                                {"kind": "sentencepiece_open_clip"}, f"big_vision {path}")
    converted = os.path.isfile(os.path.join(path, "model.json")) and \
        os.path.isdir(os.path.join(path, "params"))
    workdir = os.path.isdir(os.path.join(path, "checkpoints")) and \
        os.path.isfile(os.path.join(path, "config.json"))
    if pretrained is not None and (converted or workdir):
        raise ConfigError(f"pretrained={pretrained!r} names an open_clip release; {path} is a "
                          f"{'converted directory' if converted else 'trainer workdir'}, which "
                          "holds one model: drop it")
    if converted:
        from contrastive_jax.training.models.converters.converted_directory import (
            converted_extras,
            load_converted,
        )

        model, params = load_converted(path)
        preprocess, tokenizer = converted_extras(path)
        return PretrainedSource(model, params, preprocess, tokenizer, f"converted {path}")
    if workdir:
        return _workdir(path, step)
    from contrastive_jax.training.models.converters.clip_import import convert_open_clip

    converted = convert_open_clip(path, pretrained=pretrained)
    return PretrainedSource(converted.model, converted.params, converted.preprocess,
                            converted.tokenizer, converted.description,
                            converted.tokenizer_name)


def _workdir(path: str, step: int | None = None) -> PretrainedSource:
    """A trainer workdir's latest usable parameters (or ``step``'s) and its config's pixels and
    tokenizer."""
    import json

    from contrastive_jax.training.models.converters.open_clip_tensors import model_leaves
    from contrastive_jax.training.models.scanned_layers import to_layout
    from contrastive_jax.training.parameter_paths import nested
    from contrastive_jax.training.run.init_from import read
    from contrastive_jax.training.run.workdir.config_record import upgrade

    stored = read(path, step=step)
    with open(os.path.join(path, "config.json")) as f:
        config = upgrade(json.load(f))
    model = dict(config.get("model", {}))
    if model.get("name") != "dual_encoder":
        raise ConfigError(f"{path} is a workdir of a {model.get('name')!r} model; "
                          "load_pretrained gives dual encoders (image and text towers)")
    # in the layout the recorded model block builds today (a run saved before scanned layers
    # holds unrolled blocks)
    params = nested(to_layout(stored.params, model_leaves(model)))
    pre = dict(config.get("data", {}).get("preprocess", {}))
    preprocess = None
    if pre.get("name") == "image_text":
        from contrastive_jax.training.augmentations.pixels import pixel_normalization

        pixels = pixel_normalization(pre) or ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))  # [0, 1] as is
        preprocess = {"image_size": model["sample_encoder"].get("image_size"),
                      "resize": pre.get("resize", "bicubic"), "mean": pixels[0],
                      "std": pixels[1]}
    tokenizer = dict(pre.get("tokenizer") or {"kind": "words", "path": ""})
    return PretrainedSource(model, params, preprocess, tokenizer, f"workdir {stored.description}")


def pretrained_config(path_or_name: str | os.PathLike, *, pretrained: str | None = None
                      ) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any] | None]:
    """``(model block, tokenizer spec or None, pixel settings or None)`` of the sources of
    :func:`read_source`, read from their configs alone (no parameters are read): a converted
    directory's ``model.json``, ``tokenizer.json`` and ``preprocess.json``, a workdir's
    ``config.json``, an open_clip model's config and ``preprocess_cfg`` (its
    ``init_temperature`` / ``init_bias`` are the config's initial values, not the
    checkpoint's). For a config whose model starts from the source (``model.init_from``)."""
    import json

    path = os.fspath(path_or_name)
    if os.path.isfile(os.path.join(path, "model.json")):
        from contrastive_jax.training.models.converters.converted_directory import (
            converted_extras,
        )

        with open(os.path.join(path, "model.json")) as f:
            block = json.load(f)
        preprocess, tokenizer = converted_extras(path)
        return block, tokenizer, preprocess
    if os.path.isdir(os.path.join(path, "checkpoints")) and \
            os.path.isfile(os.path.join(path, "config.json")):
        from contrastive_jax.training.run.workdir.config_record import upgrade

        with open(os.path.join(path, "config.json")) as f:
            config = upgrade(json.load(f))
        pre = dict(config.get("data", {}).get("preprocess", {}))
        return (dict(config.get("model", {})), dict(pre.get("tokenizer") or {}) or None,
                {k: pre[k] for k in ("mean", "std", "resize", "resize_mode", "image_size")
                 if pre.get(k) is not None} or None)
    from contrastive_jax.training.models.converters import open_clip_config, open_clip_sources

    source = open_clip_sources.resolve(path, pretrained=pretrained)
    if source.model_cfg is None:
        raise ConfigError(f"{path}: no open_clip config (open_clip_config.json) to read the "
                          "model from; convert it with clip_import and its config first")
    block = open_clip_config.model_block(source.model_cfg, timm_args=source.timm_args)
    return (block.model, open_clip_sources.tokenizer_spec(block.tokenizer, source.directory,
                                                          source.model_cfg.get("text_cfg")),
            open_clip_sources.source_preprocess(source,
                                                block.model["sample_encoder"]["image_size"]))


def build_pretrained_model(model: Mapping[str, Any], params: Any, *, dtype: str = "float32"):
    """The model of the ``model`` block holding ``params`` (nested pure dict); built with
    shapes only (``nnx.eval_shape``), then every parameter set. ``dtype``: the compute dtype
    (``model.dtype``); the parameters stay float32."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from contrastive_jax.training.models import build_model

    config = {k: v for k, v in dict(model).items() if k not in ("frozen", "init_from")}
    config["dtype"] = dtype
    shell = nnx.eval_shape(lambda: build_model(config, nnx.Rngs(0)))
    state = nnx.state(shell, nnx.Param)
    expected = {jax.tree_util.keystr(k): x.shape
                for k, x in jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(state))}
    given = {jax.tree_util.keystr(k): np.shape(x)
             for k, x in jax.tree_util.tree_leaves_with_path(params)}
    if expected != given:
        diff = sorted(set(expected.items()) ^ set(given.items()))
        raise ConfigError(f"the stored parameters do not fit the model block: {diff[:4]}")
    nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, params))
    nnx.update(shell, state)
    return shell


def load_pretrained(path_or_name: str | os.PathLike, *, pretrained: str | None = None,
                    tokenizer: str | os.PathLike | bool | None = None,
                    dtype: str = "float32", image_size: int | None = None,
                    max_tokens: int | None = None, step: int | None = None):
    """``(model, preprocess, tokenizer)`` of a converted directory, a trainer workdir, an
    open_clip hub directory or cache, or an open_clip model name (module docstring).

    ``pretrained``: the open_clip release tag with a model name (``"laion2b_s34b_b79k"``).
    ``tokenizer``: ``None`` finds it with the model (a converted directory's
    ``tokenizer.json``, the run's ``data.preprocess.tokenizer``, the hub directory's
    ``spiece.model`` / ``merges.txt``; a :class:`ConfigError` says which file to pass when there
    is none), a path to the tokenizer's file (CLIP's ``bpe_simple_vocab_16e6.txt.gz``, a
    SentencePiece ``.model``) with the kind the model needs, or ``False``: no tokenizer
    (``None`` comes back). ``dtype``: the compute dtype, ``"float32"`` or ``"bfloat16"``.
    ``image_size`` / ``max_tokens``: another input size than the source's ([CLIPA]; open_clip's
    ``force_image_size``): the ViT's position table resampled bicubically to the new patch grid
    and the preprocess resizing to it, the text table truncated to the shorter context (a
    longer one is refused); docs/pretrained.md, "Another image size or context". ``step``: a
    trainer workdir's checkpoint of that step (default: the latest usable). A big_vision
    SigLIP ``.npz`` file is converted in memory
    (:func:`~contrastive_jax.training.models.converters.big_vision_import.convert_npz`; its
    tokenizer: ``tokenizer=`` the SigLIP ``spiece.model``).
    """
    source = read_source(path_or_name, pretrained=pretrained, step=step)
    if image_size is not None or max_tokens is not None:
        from contrastive_jax.training.models.position_resampling import resized_model

        model_block, params, pre, _ = resized_model(
            source.model, source.params, source.preprocess, image_size=image_size,
            max_tokens=max_tokens, what="load_pretrained")
        source = dataclasses.replace(source, model=model_block, params=params, preprocess=pre)
    model = build_pretrained_model(source.model, source.params, dtype=dtype)
    preprocess = None
    if source.preprocess is not None:
        pre = source.preprocess
        preprocess = ImagePreprocess(
            image_size=int(pre.get("image_size") or source.model["sample_encoder"]["image_size"]),
            mean=tuple(float(v) for v in pre["mean"]), std=tuple(float(v) for v in pre["std"]),
            interpolation=pre.get("resize", "bicubic"),
            resize_mode=pre.get("resize_mode", "shortest"))
    return model, preprocess, _tokenizer(source, tokenizer)


def _tokenizer(source: PretrainedSource, choice) -> TextTokenizer | None:
    from contrastive_jax.training.data.text.text_tokenizers import check_vocab_size, load_tokenizer

    if choice is False:
        return None
    text = source.model.get("text_encoder", {})
    spec = dict(source.tokenizer or {})
    if not spec.get("kind") and source.tokenizer_name:
        raise ConfigError(f"{source.description} uses open_clip's tokenizer "
                          f"{source.tokenizer_name!r}, which this project does not compute "
                          "(CLIP's BPE and SigLIP's SentencePiece only); pass tokenizer=False")
    if choice not in (None, True):
        if not spec.get("kind"):
            raise ConfigError(f"{source.description} does not say which tokenizer kind it "
                              f"uses; give the tokenizer file through a converted directory's "
                              f"tokenizer.json")
        spec["path"] = os.fspath(choice)
    if not spec.get("kind") or (spec.get("kind") != "words" and not spec.get("path")):
        raise ConfigError(
            f"{source.description} has no tokenizer file; pass tokenizer=PATH ("
            + ("the SigLIP model's spiece.model, beside tokenizer.json in its Hugging Face "
               "repository" if spec.get("kind") == "sentencepiece_open_clip" else
               "CLIP's BPE merges file bpe_simple_vocab_16e6.txt.gz, which an installed "
               "open_clip has beside open_clip/tokenizer.py") + ") or tokenizer=False")
    loaded = load_tokenizer(spec)
    check_vocab_size(loaded, text.get("vocab_size"))
    return TextTokenizer(loaded, int(text["max_tokens"]))


def evaluate_pretrained(config) -> dict[str, Any]:
    """The trainer's evaluation (:func:`contrastive_jax.training.evaluation.run_evaluation.
    evaluate`) of a pretrained model, before any training: ``config`` is a training config
    whose ``model.init_from`` names the whole model's source (a converted directory, a
    workdir, an open_clip model; e.g. the pod template's ``pretrained=SOURCE``). The model is
    built and loaded as a run starting from it (``build_model``, ``init_from``, the data's
    mean and std from the source when the config sets none; no optimiser state), placed on the
    mesh
    of ``config.mesh``, and evaluated on ``data.eval_split``: retrieval Recall@1/5/10 both ways,
    alignment, uniformity, and zero-shot top-1/top-5 with ``evaluation.zero_shot`` class
    names and templates (docs/pretrained.md). Returns the evaluation's results."""
    import types

    import jax
    from flax import nnx

    from contrastive_jax.mesh import make_mesh
    from contrastive_jax.training.evaluation.run_evaluation import evaluate
    from contrastive_jax.training.models import build_model
    from contrastive_jax.training.run import init_from, pretrained_pixels
    from contrastive_jax.training.step.state_sharding import state_shardings
    from contrastive_jax.training.step.train_state import TRAINING_SETTINGS

    specs = init_from.init_specs(config.model.get("init_from", ""))
    if len(specs) != 1 or specs[0].source or specs[0].target:
        raise ConfigError("evaluate_pretrained needs model.init_from = {'path': SOURCE}: one "
                          f"source for the whole model; got {config.model.get('init_from')!r}")
    config, lines = pretrained_pixels.pretrained_preprocess(config)
    for line in lines:
        print(line, flush=True)
    # the model and its parameters as a run starting from the source has them (no optimiser
    # state: only the parameters and the rest are evaluated)
    block = {k: v for k, v in dict(config.model).items() if k not in TRAINING_SETTINGS}
    graphdef, params, rest = nnx.split(build_model(block, nnx.Rngs(config.seed)), nnx.Param,
                                       ...)
    params, rest, lines = init_from.load_into(params, rest, config.model,
                                              config.model.init_from)
    for line in lines:
        print(line, flush=True)
    mesh = make_mesh(dict(config.get("mesh", {"data": -1})))
    state = types.SimpleNamespace(params=params, rest=rest)
    shardings = state_shardings(config.get("sharding"), mesh,
                                {"params": params, "rest": rest})
    state.params = jax.device_put(params, shardings["params"])
    state.rest = jax.device_put(rest, shardings["rest"])
    return evaluate(graphdef, state, config, mesh)


PROMPT_CHUNK = 256  # prompts per text-tower call


def zero_shot_classifier(model, tokenizer: TextTokenizer, class_names: Sequence[str],
                         templates: str | Sequence[str] = "imagenet") -> np.ndarray:
    """Zero-shot class weights ``(C, embed_dim)`` float64, unit rows: every class name in every
    template (a set of :data:`~contrastive_jax.training.data.text.prompt_templates.
    TEMPLATE_SETS` such as CLIP's 80 ``"imagenet"`` templates, or a sequence of strings with
    one ``{}``), embedded by ``model.embed_texts`` of ``tokenizer``'s ids, then
    ``w_c = normalise(mean_t normalise(e_ct))`` ([CLIP] §3.1.4;
    :func:`contrastive_jax.training.evaluation.zero_shot.zero_shot_weights`). Classify images
    with ``argmax_c cos(model.embed_samples(preprocess(images)), w_c)``."""
    import jax
    from flax import nnx

    from contrastive_jax.training.data.text.prompt_templates import (
        prompt_texts,
        resolve_templates,
    )
    from contrastive_jax.training.evaluation.zero_shot import zero_shot_weights

    templates = resolve_templates(templates)
    texts = [t for row in prompt_texts(list(class_names), templates) for t in row]
    embed = nnx.jit(lambda m, ids: m.embed_texts(ids))
    chunks = []
    for start in range(0, len(texts), PROMPT_CHUNK):
        ids = tokenizer(texts[start:start + PROMPT_CHUNK])
        pad = PROMPT_CHUNK - len(ids)  # one shape: one compilation for any class count
        ids = np.concatenate([ids, np.repeat(ids[:1], pad, axis=0)]) if pad else ids
        chunks.append(np.asarray(jax.device_get(embed(model, ids)))[:PROMPT_CHUNK - pad])
    embeddings = np.concatenate(chunks).reshape(len(class_names), len(templates), -1)
    return zero_shot_weights(embeddings)


__all__ = ["ImagePreprocess", "PretrainedSource", "TextTokenizer", "build_pretrained_model",
           "evaluate_pretrained", "load_pretrained", "pretrained_config", "read_source",
           "zero_shot_classifier"]
