"""Captions for the paired digit datasets: templates, the vocabulary, tokens and caption ids.

Each example of ``digit_captions`` pairs a sample with one caption, a template filled with the
class name ("a plot of the digit seven"). The same templates filled with every class name are
the prompts of zero-shot classification (:func:`class_prompts`).

**False negatives.** There are ``len(templates) * 10`` distinct captions, so a batch of more
than a few dozen pairs holds the same caption several times. InfoNCE treats every other
caption in the batch as a negative, so identical captions are *false negatives*: their pairs
are pushed apart although their texts are the same (docs/derivations.md §5.4, §15.3: the negatives
are then no longer samples of the marginal and the bound's reading changes). Every example carries
its
``caption_id`` (equal ids <=> identical caption text) so a multi-positive loss or a
de-duplicating sampler can use it.

The vocabulary is ``vocab.txt`` beside this module (one word per line, the line number is the
id): ``<pad>`` = 0, ``<unk>``, ``<bos>``, ``<eos>``, then lowercase words. Tokens are
``<bos> words... <eos>`` padded with ``<pad>`` to ``MAX_TOKENS``.
"""

from __future__ import annotations

import functools
import importlib.resources
from collections.abc import Sequence

import numpy as np

from contrastive_jax.errors import ConfigError

MAX_TOKENS = 12
CLASS_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
PAD, UNK, BOS, EOS = 0, 1, 2, 3

TEMPLATES: dict[str, tuple[str, ...]] = {
    # MNIST-1D signals
    "signal": (
        "a plot of the digit {}",
        "a signal of the number {}",
        "a noisy trace of a {}",
        "the waveform of the digit {}",
        "a 1d recording of the number {}",
        "a signal with the shape of a {}",
        "{}",
        "a plot showing a {}",
    ),
    # 8x8 digit images
    "image": (
        "a photo of the digit {}",
        "an image of the number {}",
        "a handwritten {}",
        "a small picture of a {}",
        "a scan of the digit {}",
        "a blurry drawing of the number {}",
        "{}",
        "an image showing a {}",
    ),
}


@functools.cache
def vocabulary() -> tuple[str, ...]:
    """The words, in id order (``vocab.txt``)."""
    files = importlib.resources.files("contrastive_jax.training.data.text")
    text = files.joinpath("vocab.txt").read_text()
    words = tuple(line.strip() for line in text.splitlines() if line.strip())
    if words[:4] != ("<pad>", "<unk>", "<bos>", "<eos>"):
        raise ConfigError("vocab.txt must start with <pad>, <unk>, <bos>, <eos>")
    return words


@functools.cache
def _word_ids() -> dict[str, int]:
    return {w: i for i, w in enumerate(vocabulary())}


def load_vocabulary(path: str) -> tuple[str, ...]:
    """A vocabulary file (one word per line, starting ``<pad> <unk> <bos> <eos>``)."""
    with open(path) as handle:
        words = tuple(line.strip() for line in handle if line.strip())
    if words[:4] != ("<pad>", "<unk>", "<bos>", "<eos>"):
        raise ConfigError(f"{path}: a vocabulary must start with <pad>, <unk>, <bos>, <eos>")
    return words


def tokenize(texts: str | Sequence[str], max_tokens: int = MAX_TOKENS, *,
             vocabulary: Sequence[str] | None = None, truncate: bool = False) -> np.ndarray:
    """Token ids ``(len(texts), max_tokens)`` int32: ``<bos> words <eos>``, ``<pad>``-filled.

    Words are lowercased, stripped of surrounding punctuation and split on whitespace; a word
    outside the vocabulary (default: ``vocab.txt``) becomes ``<unk>``. A text with more than
    ``max_tokens - 2`` words is a ValueError (raise ``max_tokens``) unless ``truncate``, which
    keeps the first words (as CLIP cuts captions at its context length).
    """
    if isinstance(texts, str):
        texts = [texts]
    ids = _word_ids() if vocabulary is None else {w: i for i, w in enumerate(vocabulary)}
    out = np.full((len(texts), max_tokens), PAD, np.int32)
    for row, text in enumerate(texts):
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        words = [w.strip(".,;:!?\"'()") for w in text.lower().split()]
        words = [w for w in words if w]
        if len(words) + 2 > max_tokens:
            if not truncate:
                raise ConfigError(f"caption {text!r} has {len(words)} words; at most "
                                 f"{max_tokens - 2} fit in max_tokens={max_tokens}")
            words = words[: max_tokens - 2]
        toks = [BOS, *(ids.get(w, UNK) for w in words), EOS]
        out[row, : len(toks)] = toks
    return out


def detokenize(tokens: np.ndarray) -> list[str]:
    """Texts of token rows ``(n, max_tokens)`` (``<pad>``, ``<bos>``, ``<eos>`` dropped)."""
    words = vocabulary()
    rows = np.atleast_2d(np.asarray(tokens))
    return [" ".join(words[t] for t in row if t not in (PAD, BOS, EOS)) for row in rows]


def caption(modality: str, template: int, label: int) -> str:
    """Template ``template`` of ``modality`` ("signal" or "image") filled with class ``label``."""
    return templates(modality)[template].format(CLASS_NAMES[label])


def caption_id(template: np.ndarray | int, label: np.ndarray | int) -> np.ndarray:
    """Id of the caption text: ``template * 10 + label`` (equal ids <=> identical captions)."""
    return np.asarray(template) * len(CLASS_NAMES) + np.asarray(label)


def templates(modality: str) -> tuple[str, ...]:
    """The caption templates of ``modality``."""
    if modality not in TEMPLATES:
        raise ConfigError(f"modality must be one of {sorted(TEMPLATES)}; got {modality!r}")
    return TEMPLATES[modality]


def class_prompts(modality: str) -> np.ndarray:
    """Zero-shot prompts ``(10, n_templates, MAX_TOKENS)``: every template, every class.

    Average a class's prompt embeddings over templates to get its classifier weight (CLIP's
    prompt ensembling).
    """
    temps = templates(modality)
    texts = [t.format(name) for name in CLASS_NAMES for t in temps]
    return tokenize(texts).reshape(len(CLASS_NAMES), len(temps), MAX_TOKENS)
