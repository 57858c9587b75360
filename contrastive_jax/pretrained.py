"""One call to a ready pretrained model: ``load_pretrained(path_or_name)``.

    model, preprocess, tokenizer = load_pretrained("converted/vit_b32_laion")
    images = preprocess([open("cat.jpg", "rb").read()])        # (1, S, S, 3) float32
    texts = tokenizer(["a photo of a cat", "a photo of a dog"])  # (2, context) int32
    x, y = model.embed_samples(images), model.embed_texts(texts)

the counterpart of open_clip's ``create_model_and_transforms`` + ``get_tokenizer``
([OpenCLIP] in docs/references.md). ``path_or_name`` is classified and read by the one
pretrained-source reader (:func:`read_source`, :func:`with_weights`:
:mod:`~contrastive_jax.training.models.converters.pretrained_source`, re-exported here with
its record :class:`PretrainedSource`):

- a **converted directory** (``model.json`` + ``params/``, written by the converters:
  :mod:`~contrastive_jax.training.models.converters.clip_import`,
  :mod:`~contrastive_jax.training.models.converters.big_vision_import`), with its
  ``preprocess.json`` and ``tokenizer.json``;
- a **trainer workdir** of a dual encoder (``config.json`` + ``checkpoints/``): the latest
  usable checkpoint's parameters and BatchNorm statistics, the run's ``data.preprocess``
  pixels and tokenizer;
- a big_vision SigLIP ``.npz`` file, converted in memory;
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
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models.converters.pretrained_source import (
    PretrainedSource,
    read_source,
    with_weights,
)


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


def build_pretrained_model(model: Mapping[str, Any], params: Any, *, dtype: str = "float32",
                           rest: Any = None):
    """The model of the ``model`` block holding ``params`` (nested pure dict) and ``rest`` (its
    other state, a trainer workdir's BatchNorm statistics; nested, may be ``{}`` or ``None``
    for a model without any); built with shapes only (``nnx.eval_shape``), then every
    variable set. ``dtype``: the compute dtype (``model.dtype``); the parameters stay float32.
    A parameter or statistic the model lacks, or one it has that is not given, is a
    :class:`ConfigError` naming it."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from contrastive_jax.training.models import architecture_block, build_model

    config = {**architecture_block(model), "dtype": dtype}
    shell = nnx.eval_shape(lambda: build_model(config, nnx.Rngs(0)))
    for what, kind, values in (("parameters", nnx.Param, params),
                               ("BatchNorm statistics", nnx.BatchStat, rest or {})):
        state = nnx.state(shell, kind)
        expected = {jax.tree_util.keystr(k): x.shape
                    for k, x in jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(state))}
        given = {jax.tree_util.keystr(k): np.shape(x)
                 for k, x in jax.tree_util.tree_leaves_with_path(values)}
        if expected != given:
            diff = sorted(set(expected.items()) ^ set(given.items()))
            raise ConfigError(f"the stored {what} do not fit the model block: {diff[:4]}")
        if expected:
            nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, values))
            nnx.update(shell, state)
    return shell


class CheckpointFallbackWarning(UserWarning):
    """:func:`load_pretrained` of a trainer workdir used an older checkpoint than the newest:
    the newer ones cannot be read, do not match their checksums or hold non-finite numbers
    (the message says which and why)."""


def load_pretrained(path_or_name: str | os.PathLike | PretrainedSource, *,
                    pretrained: str | None = None,
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
    trainer workdir's checkpoint of that step (default: the latest usable: a newer one that
    cannot be read, does not match the checksums saved with it or holds non-finite numbers is
    passed over with a :class:`CheckpointFallbackWarning` naming it and why).
    ``path_or_name`` may also be a :class:`PretrainedSource` that :func:`read_source` gave (its
    weights read here if not yet, nothing warned: its ``skipped`` says what was passed
    over; the evaluation command reports it). A big_vision
    SigLIP ``.npz`` file is converted in memory
    (:func:`~contrastive_jax.training.models.converters.big_vision_import.convert_npz`; its
    tokenizer: ``tokenizer=`` the SigLIP ``spiece.model``).
    """
    if isinstance(path_or_name, PretrainedSource):
        if pretrained is not None or step is not None:
            raise ConfigError("pretrained= and step= choose what a path is read as; a "
                              "PretrainedSource has been read already: give neither")
        source = with_weights(path_or_name)
    else:
        source = with_weights(read_source(path_or_name, pretrained=pretrained, step=step))
        for why in source.skipped:
            warnings.warn(f"{source.location}: {why}; using step {source.step}, the newest "
                          "usable checkpoint", CheckpointFallbackWarning, stacklevel=2)
    if source.model.get("name") != "dual_encoder":
        raise ConfigError(f"{source.description} holds a {source.model.get('name')!r} model; "
                          "load_pretrained gives dual encoders (image and text towers)")
    if image_size is not None or max_tokens is not None:
        from contrastive_jax.training.models.position_resampling import resized_model

        model_block, params, pre, _ = resized_model(
            source.model, source.params, source.preprocess, image_size=image_size,
            max_tokens=max_tokens, what="load_pretrained")
        source = dataclasses.replace(source, model=model_block, params=params, preprocess=pre)
    model = build_pretrained_model(source.model, source.params, dtype=dtype, rest=source.rest)
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
    """The tokenizer ``load_pretrained``'s ``tokenizer=`` asks for (its docstring)."""
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


def evaluate_pretrained(run) -> dict[str, Any]:
    """The trainer's evaluation (:func:`contrastive_jax.training.evaluation.evaluators.
    evaluate`) of a pretrained model, before any training. ``run``: the
    :class:`~contrastive_jax.training.run_spec.RunSpec` of a training config whose
    ``model.init_from`` names the whole model's source (a converted directory, a workdir, an
    open_clip model; e.g. the pod template's ``pretrained=SOURCE``), or such a config, resolved
    here (:func:`~contrastive_jax.training.run_spec.resolve`: the source's description read
    once, the data's mean and std from it when the config sets none). The model is built and
    loaded as a run starting from it (``build_model``, ``init_from``; no optimiser state),
    placed on the spec's mesh, and evaluated on ``data.eval_split`` by the spec's evaluators:
    retrieval Recall@1/5/10 both ways, alignment, uniformity, and zero-shot top-1/top-5 with
    ``evaluation.zero_shot`` class names and templates (docs/pretrained.md). Returns the
    evaluation's results."""
    import types

    import jax
    from flax import nnx

    from contrastive_jax.training.evaluation.evaluators import evaluate
    from contrastive_jax.training.models import architecture_block, build_model
    from contrastive_jax.training.run import init_from
    from contrastive_jax.training.run_spec import RunSpec, resolve
    from contrastive_jax.training.step.state_sharding import state_shardings

    specs = init_from.init_specs(run.model.get("init_from", "") if not isinstance(
        run, RunSpec) else run.config.model.get("init_from", ""))
    if len(specs) != 1 or specs[0].source or specs[0].target:
        given = (run.config if isinstance(run, RunSpec) else run).model.get("init_from")
        raise ConfigError("evaluate_pretrained needs model.init_from = {'path': SOURCE}: one "
                          f"source for the whole model; got {given!r}")
    spec = run if isinstance(run, RunSpec) else resolve(run)
    for line in spec.messages:
        print(line, flush=True)
    config = spec.config
    # the model and its parameters as a run starting from the source has them (no optimiser
    # state: only the parameters and the rest are evaluated)
    graphdef, params, rest = nnx.split(build_model(architecture_block(config.model),
                                                   nnx.Rngs(config.seed)), nnx.Param,
                                       ...)
    params, rest, lines = init_from.load_into(params, rest, config.model,
                                              config.model.init_from, spec.sources)
    for line in lines:
        print(line, flush=True)
    state = types.SimpleNamespace(params=params, rest=rest)
    shardings = state_shardings(config.get("sharding"), spec.mesh,
                                {"params": params, "rest": rest})
    state.params = jax.device_put(params, shardings["params"])
    state.rest = jax.device_put(rest, shardings["rest"])
    return evaluate(graphdef, state, config, spec.mesh, spec.evaluators)


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


__all__ = ["CheckpointFallbackWarning", "ImagePreprocess", "PretrainedSource", "TextTokenizer",
           "build_pretrained_model", "evaluate_pretrained", "load_pretrained", "read_source",
           "with_weights", "zero_shot_classifier"]
