"""Zero-shot prompts from class names and templates: CLIP's ImageNet templates, class names
from a tuple, a file or a TFDS ClassLabel feature, and their token ids.

Each class name is put into every template (``"a photo of a {}."``); the text tower embeds every
prompt, and a class's weight is the normalised mean of its prompts' normalised embeddings
(CLIP's prompt ensembling, [CLIP] Sec. 3.1.4;
:func:`contrastive_jax.training.evaluation.zero_shot.zero_shot_weights`). Config:
``evaluation.zero_shot.class_names`` and ``evaluation.zero_shot.templates`` (docs/pretrained.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from etils import epath

from contrastive_jax.errors import ConfigError

# The 80 templates of CLIP's ImageNet evaluation ([CLIP]; OpenAI's CLIP notebook
# "Prompt_Engineering_for_ImageNet", MIT licence; open_clip's OPENAI_IMAGENET_TEMPLATES).
IMAGENET_TEMPLATES: tuple[str, ...] = (
    "a bad photo of a {}.",
    "a photo of many {}.",
    "a sculpture of a {}.",
    "a photo of the hard to see {}.",
    "a low resolution photo of the {}.",
    "a rendering of a {}.",
    "graffiti of a {}.",
    "a bad photo of the {}.",
    "a cropped photo of the {}.",
    "a tattoo of a {}.",
    "the embroidered {}.",
    "a photo of a hard to see {}.",
    "a bright photo of a {}.",
    "a photo of a clean {}.",
    "a photo of a dirty {}.",
    "a dark photo of the {}.",
    "a drawing of a {}.",
    "a photo of my {}.",
    "the plastic {}.",
    "a photo of the cool {}.",
    "a close-up photo of a {}.",
    "a black and white photo of the {}.",
    "a painting of the {}.",
    "a painting of a {}.",
    "a pixelated photo of the {}.",
    "a sculpture of the {}.",
    "a bright photo of the {}.",
    "a cropped photo of a {}.",
    "a plastic {}.",
    "a photo of the dirty {}.",
    "a jpeg corrupted photo of a {}.",
    "a blurry photo of the {}.",
    "a photo of the {}.",
    "a good photo of the {}.",
    "a rendering of the {}.",
    "a {} in a video game.",
    "a photo of one {}.",
    "a doodle of a {}.",
    "a close-up photo of the {}.",
    "a photo of a {}.",
    "the origami {}.",
    "the {} in a video game.",
    "a sketch of a {}.",
    "a doodle of the {}.",
    "a origami {}.",
    "a low resolution photo of a {}.",
    "the toy {}.",
    "a rendition of the {}.",
    "a photo of the clean {}.",
    "a photo of a large {}.",
    "a rendition of a {}.",
    "a photo of a nice {}.",
    "a photo of a weird {}.",
    "a blurry photo of a {}.",
    "a cartoon {}.",
    "art of a {}.",
    "a sketch of the {}.",
    "a embroidered {}.",
    "a pixelated photo of a {}.",
    "itap of the {}.",
    "a jpeg corrupted photo of the {}.",
    "a good photo of a {}.",
    "a plushie {}.",
    "a photo of the nice {}.",
    "a photo of the small {}.",
    "a photo of the weird {}.",
    "the cartoon {}.",
    "art of the {}.",
    "a drawing of the {}.",
    "a photo of the large {}.",
    "a black and white photo of a {}.",
    "the plushie {}.",
    "a dark photo of a {}.",
    "itap of a {}.",
    "graffiti of the {}.",
    "a toy {}.",
    "itap of my {}.",
    "a photo of a cool {}.",
    "a photo of a small {}.",
    "a tattoo of the {}.",
)
# The 7 of those that CLIP's notebook selected (open_clip's SIMPLE_IMAGENET_TEMPLATES).
IMAGENET_SELECTED_TEMPLATES: tuple[str, ...] = (
    "itap of a {}.",
    "a bad photo of the {}.",
    "a origami {}.",
    "a photo of the large {}.",
    "a {} in a video game.",
    "art of the {}.",
    "a photo of the small {}.",
)
TEMPLATE_SETS: dict[str, tuple[str, ...]] = {
    "imagenet": IMAGENET_TEMPLATES,
    "imagenet_selected": IMAGENET_SELECTED_TEMPLATES,
    "simple": ("a photo of a {}.",),
}
FIELD = "evaluation.zero_shot"


def resolve_templates(templates: str | Sequence[str]) -> tuple[str, ...]:
    """The templates of ``evaluation.zero_shot.templates``: a name of :data:`TEMPLATE_SETS`
    or a sequence of format strings, each with exactly one ``{}`` (the class name).

    ConfigError for an unknown name, an empty sequence, or a template without exactly one
    ``{}``.
    """
    if isinstance(templates, str):
        if templates not in TEMPLATE_SETS:
            raise ConfigError(f"{FIELD}.templates = {templates!r} is not a template set; valid: "
                              f"{sorted(TEMPLATE_SETS)}, or a tuple of format strings with {{}}")
        return TEMPLATE_SETS[templates]
    templates = tuple(templates)
    if not templates:
        raise ConfigError(f"{FIELD}.templates is empty; give at least one template such as "
                          "'a photo of a {}.'")
    for t in templates:
        if not isinstance(t, str) or t.count("{}") != 1 or t.replace("{}", "").count("{"):
            raise ConfigError(f"{FIELD}.templates: each template is a string with exactly one "
                              f"'{{}}' where the class name goes; got {t!r}")
    return templates


def resolve_class_names(class_names: str | Sequence[str], *, label_names=None) -> tuple[str, ...]:
    """The class names of ``evaluation.zero_shot.class_names``, in label order.

    - a sequence of names (label ``i`` is ``class_names[i]``);
    - ``"tfds"``: ``label_names()``, the names of the dataset's ClassLabel feature
      (see :func:`tfds_label_names`); TFDS names such as ``"great_white_shark"`` are used as they
      are: give names for prompts as a tuple or a file when they need rewording;
    - any other string: a file (local or ``gs://``), one name per line (blank lines dropped).

    ConfigError for no names, a duplicate name, or a missing file.
    """
    if isinstance(class_names, str):
        if class_names == "tfds":
            if label_names is None:
                raise ConfigError(f"{FIELD}.class_names = 'tfds' needs a dataset with a "
                                  "ClassLabel feature")
            names = tuple(label_names())
        else:
            path = epath.Path(class_names)
            if not path.exists():
                raise ConfigError(f"{FIELD}.class_names = {class_names!r}: no such file (give a "
                                  "file with one class name per line, a tuple of names, or "
                                  "'tfds')")
            names = tuple(n.strip() for n in path.read_text().splitlines() if n.strip())
    else:
        names = tuple(class_names)
    if not names or not all(isinstance(n, str) and n.strip() for n in names):
        raise ConfigError(f"{FIELD}.class_names gave no names, or an empty one: {names!r}")
    seen = set()
    for n in names:
        if n in seen:
            raise ConfigError(f"{FIELD}.class_names: {n!r} appears twice; each class needs its "
                              "own name")
        seen.add(n)
    return names


def tfds_label_names(dataset_info, label_key: str = "label") -> tuple[str, ...]:
    """The names of the ClassLabel feature ``label_key`` of a TFDS ``dataset_info``.

    ConfigError when there is no such feature or it is not a ClassLabel with names.
    """
    features = dataset_info.features
    if label_key not in features:
        raise ConfigError(f"{FIELD}.label_key = {label_key!r} is not a feature of "
                          f"{dataset_info.name}; it has {sorted(features.keys())}")
    names = getattr(features[label_key], "names", None)
    if not names:
        raise ConfigError(f"{dataset_info.name}'s {label_key!r} is not a ClassLabel with names; "
                          f"give {FIELD}.class_names as a tuple or a file")
    return tuple(names)


def prompt_texts(class_names: Sequence[str], templates: Sequence[str]) -> list[list[str]]:
    """``texts[c][t] = templates[t].format(class_names[c])``: (C, T) prompts."""
    return [[t.format(name) for t in templates] for name in class_names]


def prompt_tokens(class_names: Sequence[str], templates: Sequence[str], tokenizer,
                  max_tokens: int) -> np.ndarray:
    """Token ids ``(C, T, max_tokens)`` int32 of every prompt, by ``tokenizer`` (a
    :class:`contrastive_jax.training.data.text.text_tokenizers.Tokenizer`: the run's
    ``data.preprocess.tokenizer``)."""
    texts = prompt_texts(class_names, templates)
    flat = tokenizer.encode([t for row in texts for t in row], max_tokens)
    return flat.reshape(len(class_names), len(templates), max_tokens)
