"""Text tokenizers for captions: a word vocabulary, a SentencePiece model, CLIP's BPE, or
SigLIP's SentencePiece tokenizer.

Every tokenizer turns texts into rows ``(n, max_tokens)`` int32 of ``<bos> tokens... <eos>``
followed by zeros, and **id 0 is padding** (except ``clip_bpe`` and
``sentencepiece_open_clip``, below): the text transformer
masks id 0 out of attention and out of its mean
(:mod:`contrastive_jax.training.models.encoders.transformer`), so no real token may have id 0.
``vocab_size`` is the number of embedding rows the text tower needs (the largest id + 1).

Kinds (config ``data.preprocess.tokenizer = {"kind": ..., "path": ..., **options}``; the
options a kind takes are in :data:`KIND_OPTIONS`):

- ``"words"``: a word vocabulary file, one word per line, the line number is the id, starting
  ``<pad> <unk> <bos> <eos>`` (``path = ""``: the package's ``vocab.txt`` of the digit
  captions). Words are lowercased and stripped of punctuation
  (:func:`contrastive_jax.training.data.text.captions.tokenize`).
- ``"sentencepiece"``: a SentencePiece model file (``.model``; T. Kudo, J. Richardson,
  *SentencePiece*, EMNLP 2018 demo, arXiv:1808.06226), e.g. one built
  from a dataset's captions by ``python -m contrastive_jax.training.data.build_tokenizer``,
  which reserves ``<pad>`` = 0, ``<unk>`` = 1, ``<bos>`` = 2, ``<eos>`` = 3. A model whose
  piece 0 is not ``<pad>`` (SentencePiece's default puts ``<unk>`` at 0) is loaded with every
  id shifted up by one, so 0 stays padding (``vocab_size`` = pieces + 1). ``<bos>``/``<eos>``
  are added when the model defines them.

- ``"clip_bpe"``: CLIP's byte-level BPE from a merges file in the format of open_clip's
  ``bpe_simple_vocab_16e6.txt.gz`` ([CLIP], [OpenCLIP]; the user's file, none is shipped):
  exactly the ids of open_clip's ``tokenize`` (:mod:`contrastive_jax.training.data.text.clip_bpe`).
  The exception to the rule above: id 0 is the byte ``"!"``, not padding, because the ids must
  be the ones a pretrained CLIP text tower was trained on (its causal mask and end-of-text
  pooling never read the padding); ``<bos>``/``<eos>`` are ``<start_of_text>`` /
  ``<end_of_text>`` (49406 / 49407 with OpenAI's file), ``vocab_size`` = 49408.

- ``"sentencepiece_open_clip"``: SigLIP's tokenizer, a T5-layout SentencePiece model (``path``:
  c4_en's ``spiece.model`` for open_clip's ``ViT-*-SigLIP`` models; [SigLIP], [T5]) cleaned
  and padded as open_clip's ``HFTokenizer`` does: exactly its ids
  (:mod:`contrastive_jax.training.data.text.open_clip_sentencepiece`). Options ``clean``
  (``"canonicalize"``, the default and SigLIP's; ``"whitespace"``; ``"lower"``) and ``pad_id``
  (default 1 = ``</s>``, SigLIP's padding). No ``<bos>``; rows are ``tokens </s>`` then
  ``pad_id``, so **padding is 1, not 0** (SigLIP's text tower attends to all positions and
  pools the last); ``vocab_size`` = the pieces (32,000).

Truncation keeps ``<bos>``, the first ``max_tokens - 2`` tokens and ``<eos>`` (as CLIP cuts a
caption at its context length and keeps the end token; ``sentencepiece_open_clip`` has no
``<bos>`` and keeps ``max_tokens - 1``). Paths go through ``etils.epath``, so a
model file may live on ``gs://``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
from etils import epath

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.data.text import captions
from contrastive_jax.training.data.text.clip_bpe import ClipBpeTokenizer, read_merges
from contrastive_jax.training.data.text.open_clip_sentencepiece import (
    OpenClipSentencePieceTokenizer,
)

BUILD_COMMAND = ("python -m contrastive_jax.training.data.build_tokenizer --dataset=NAME "
                 "--data_dir=DIR --vocab_size=V --output=PATH.model")


class Tokenizer(Protocol):
    """What the image-text preprocessing needs of a tokenizer."""

    vocab_size: int

    def encode(self, texts: Sequence[str | bytes], max_tokens: int) -> np.ndarray:
        """Rows ``(len(texts), max_tokens)`` int32: ``<bos> tokens <eos>``, 0-padded (the
        exceptions: see the module docstring)."""

    def decode(self, tokens: np.ndarray) -> list[str]:
        """Texts of rows ``(n, max_tokens)`` (padding, ``<bos>``, ``<eos>`` dropped)."""


class WordTokenizer:
    """A word vocabulary (``<pad> <unk> <bos> <eos>`` then words; the line number is the id)."""

    def __init__(self, words: Sequence[str]):
        self.words = tuple(words)
        self.vocab_size = len(self.words)

    def encode(self, texts: Sequence[str | bytes], max_tokens: int) -> np.ndarray:
        return captions.tokenize(list(texts), max_tokens, vocabulary=self.words, truncate=True)

    def decode(self, tokens: np.ndarray) -> list[str]:
        special = (captions.PAD, captions.BOS, captions.EOS)
        return [" ".join(self.words[t] for t in row if t not in special)
                for row in np.atleast_2d(np.asarray(tokens))]


class SentencePieceTokenizer:
    """A SentencePiece model; ids shifted by ``offset`` (1 when piece 0 is not ``<pad>``)."""

    def __init__(self, model_proto: bytes, source: str = "<bytes>"):
        import sentencepiece

        self.source = source
        self.processor = sentencepiece.SentencePieceProcessor(model_proto=model_proto)
        self.offset = 0 if self.processor.pad_id() == 0 else 1
        self.vocab_size = self.processor.get_piece_size() + self.offset
        special = [self.processor.bos_id(), self.processor.eos_id()]
        self.bos, self.eos = (i + self.offset if i >= 0 else None for i in special)

    def encode(self, texts: Sequence[str | bytes], max_tokens: int) -> np.ndarray:
        if max_tokens < 3:
            raise ConfigError(f"max_tokens must be >= 3 (<bos>, a token, <eos>); got "
                              f"{max_tokens}")
        texts = [t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in texts]
        head = [self.bos] if self.bos is not None else []
        tail = [self.eos] if self.eos is not None else []
        room = max_tokens - len(head) - len(tail)
        out = np.zeros((len(texts), max_tokens), np.int32)
        for row, ids in enumerate(self.processor.encode(texts)):
            toks = head + [i + self.offset for i in ids[:room]] + tail
            out[row, :len(toks)] = toks
        return out

    def decode(self, tokens: np.ndarray) -> list[str]:
        special = {0, self.bos, self.eos}
        return [self.processor.decode([int(t) - self.offset for t in row if t not in special])
                for row in np.atleast_2d(np.asarray(tokens))]


def _read(path: str, kind: str) -> bytes:
    file = epath.Path(path)
    if not file.exists():
        hint = f"; build one with\n    {BUILD_COMMAND}" if kind == "sentencepiece" else ""
        raise ConfigError(f"tokenizer file {path!r} (data.preprocess.tokenizer.path, kind "
                          f"{kind!r}) does not exist{hint}")
    return file.read_bytes()


def _words(path: str) -> WordTokenizer:
    if not path:
        return WordTokenizer(captions.vocabulary())
    words = tuple(w.strip() for w in _read(path, "words").decode("utf-8").splitlines()
                  if w.strip())
    if words[:4] != ("<pad>", "<unk>", "<bos>", "<eos>"):
        raise ConfigError(f"{path}: a word vocabulary must start with <pad>, <unk>, <bos>, "
                          "<eos> (one per line)")
    return WordTokenizer(words)


def _sentencepiece(path: str) -> SentencePieceTokenizer:
    if not path:
        raise ConfigError("data.preprocess.tokenizer.path must name a SentencePiece .model file "
                          f"for kind 'sentencepiece'; build one with\n    {BUILD_COMMAND}")
    try:
        return SentencePieceTokenizer(_read(path, "sentencepiece"), path)
    except RuntimeError as err:  # sentencepiece's parse failure
        raise ConfigError(f"{path} is not a SentencePiece model file ({err})") from None


def _clip_bpe(path: str) -> ClipBpeTokenizer:
    if not path:
        raise ConfigError("data.preprocess.tokenizer.path must name a CLIP BPE merges file (the "
                          "format of open_clip's bpe_simple_vocab_16e6.txt.gz) for kind "
                          "'clip_bpe'")
    return ClipBpeTokenizer(read_merges(_read(path, "clip_bpe"), path), path)


def _sentencepiece_open_clip(path: str, clean: str = "canonicalize",
                             pad_id: int | None = None) -> OpenClipSentencePieceTokenizer:
    if not path:
        raise ConfigError("data.preprocess.tokenizer.path must name a T5-style SentencePiece "
                          ".model file (SigLIP's: spiece.model of the hub's timm/ViT-B-16-SigLIP) "
                          "for kind 'sentencepiece_open_clip'")
    return OpenClipSentencePieceTokenizer(_read(path, "sentencepiece_open_clip"), clean=clean,
                                          pad_id=pad_id, source=path)


TOKENIZER_KINDS = {"words": _words, "sentencepiece": _sentencepiece, "clip_bpe": _clip_bpe,
                   "sentencepiece_open_clip": _sentencepiece_open_clip}

KIND_OPTIONS = {"words": (), "sentencepiece": (), "clip_bpe": (),
                "sentencepiece_open_clip": ("clean", "pad_id")}
"""The fields each kind takes besides ``kind`` and ``path``."""


def load_tokenizer(spec: Mapping[str, Any]) -> Tokenizer:
    """The tokenizer of ``spec = {"kind": ..., "path": ..., **options}``
    (``data.preprocess.tokenizer``; options per kind: :data:`KIND_OPTIONS`).

    ConfigError for an unknown kind, a field the kind does not take, a bad option value, a
    missing or unreadable file.
    """
    spec = dict(spec)
    kind = spec.get("kind", "words")
    if kind not in TOKENIZER_KINDS:
        raise ConfigError(f"unknown data.preprocess.tokenizer.kind {kind!r}; valid: "
                          f"{sorted(TOKENIZER_KINDS)}")
    valid = ["kind", "path", *KIND_OPTIONS[kind]]
    unknown = sorted(set(spec) - set(valid))
    if unknown:
        raise ConfigError(f"unknown data.preprocess.tokenizer fields {unknown} for kind "
                          f"{kind!r}; valid: {valid}")
    options = {name: spec[name] for name in KIND_OPTIONS[kind] if name in spec}
    return TOKENIZER_KINDS[kind](spec.get("path", "") or "", **options)


def check_vocab_size(tokenizer: Tokenizer, vocab_size: int | None,
                     field: str = "model.text_encoder.vocab_size") -> None:
    """ConfigError when the text tower's ``vocab_size`` has fewer rows than the tokenizer's
    ids need (a larger id would silently read a clipped embedding row)."""
    if vocab_size is not None and vocab_size < tokenizer.vocab_size:
        raise ConfigError(f"the tokenizer has {tokenizer.vocab_size} token ids "
                          f"but {field} = {vocab_size}; set {field} >= "
                          f"{tokenizer.vocab_size}")
