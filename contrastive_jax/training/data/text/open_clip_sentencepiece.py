"""SigLIP's tokenizer: a T5 SentencePiece model run as open_clip's ``HFTokenizer`` runs it.

open_clip's SigLIP models (``ViT-*-SigLIP*``; [SigLIP], [OpenCLIP]) tokenize with the c4_en
SentencePiece model of [T5] ([SentencePiece]; 32,000 pieces, ``<pad>`` 0, ``</s>`` 1,
``<unk>`` 2, no ``<s>``), the hub file ``spiece.model`` of ``timm/ViT-B-16-SigLIP``, through
``open_clip.tokenizer.HFTokenizer`` with the model config's ``clean="canonicalize"`` and the
Hugging Face T5 tokenizer (pad token ``</s>``). :class:`OpenClipSentencePieceTokenizer` gives the
same ids from the ``.model`` file alone (read with the ``sentencepiece`` package):

1. Cleaning (open_clip's ``get_clean_fn``), one of :data:`CLEAN_MODES`; each starts with
   ``basic_clean`` = ``ftfy.fix_text``, ``html.unescape`` twice, strip:

   - ``"canonicalize"`` (SigLIP's; big_vision's ``canonicalize_text``): ``_`` to a space, the 32
     ASCII punctuation characters of ``string.punctuation`` removed, lowercase, whitespace runs
     to one space, strip;
   - ``"whitespace"`` (``HFTokenizer``'s default): whitespace runs to one space, strip;
   - ``"lower"``: as ``"whitespace"``, then lowercase.

2. The texts ``<pad>``, ``</s>``, ``<unk>`` left in a cleaned text (only ``"whitespace"`` and
   ``"lower"`` keep ``<``, ``/``, ``>``) are the special ids 0, 1, 2, as the T5 tokenizer's
   special tokens.
3. The text between them: the model's character map (its ``precompiled_charsmap``, the
   ``nmt_nfkc`` rules of c4_en) applied **as Hugging Face's ``Precompiled`` normalizer applies
   it**, which is not SentencePiece's own rule: the text is cut into grapheme clusters
   (Unicode extended grapheme clusters, the ``regex`` package's ``\\X``); a cluster
   shorter than 6 UTF-8 bytes that starts with an entry of the map is replaced, whole, by the
   replacement of its *shortest* such entry (``e`` + U+0301 + U+0302 -> ``é``: the second
   mark is dropped); every other cluster is mapped character by character. (SentencePiece itself
   replaces the *longest* entry at each position and keeps what follows, so its ids differ
   from open_clip's on such clusters; :class:`CharsMap`.)
4. Words: the normalised text split at whitespace (Rust's ``char::is_whitespace``), a ``▁``
   put before each word that does not start with one, and each word cut before every ``▁``
   (the T5 tokenizer's ``WhitespaceSplit`` + ``Metaspace``).
5. Each part: the most probable segmentation into the model's pieces (unigram Viterbi search,
   :func:`segment`), as the Hugging Face ``Unigram`` model runs it: every piece counts, also
   ``<pad>``, ``</s>``, ``<unk>`` (score 0) should normalisation produce their text (from
   small-form ``﹤/s﹥``); an unknown character scores the lowest piece score minus 10 and a run
   of unknown characters is one ``<unk>``; path scores are summed in float64 in the order of
   the text, and of two equal scores the first found is kept (SentencePiece sums in float32,
   so where two segmentations tie, e.g. ``′′′′′`` as ``′′′ ′′`` or ``′′ ′′′``, its choice can
   differ).
6. A row is ``ids </s>`` padded with ``pad_id`` to ``max_tokens``; a longer text keeps its
   first ``max_tokens - 1`` ids and ends with ``</s>`` (``padding="max_length",
   truncation=True, max_length=max_tokens``; big_vision's ``eos="sticky"``).

**Padding is ``pad_id``, by default the end token** (1: big_vision pads SigLIP's text with
``pad_value=1``, and the hub tokenizer's pad token is ``</s>``), **not 0**: SigLIP's text tower
attends to every position and pools the last one (``pool="last"``), so the padding is part of
its input. Id 0 (``<pad>``) only appears for the text ``<pad>`` (step 2 or 5). ``pad_id=0``
gives the rows of a Hugging Face T5 tokenizer with its default pad token (``<pad>``).

Only models that these rules describe are accepted (ConfigError otherwise): a unigram model,
pieces 0-2 ``<pad>``, ``</s>``, ``<unk>``, no user-defined, byte or unused pieces,
SentencePiece's default whitespace handling. Checked against open_clip 3.3.0 with transformers
5.24 and a self-trained model of that layout (``tests/test_siglip_tokenizer.py``).
transformers 4's pipeline (the hub's ``tokenizer.json`` as written) gives the same ids except
for a special-token text glued to the next word under ``"whitespace"``/``"lower"`` (no ``▁``
after the special token there). big_vision tokenizes with SentencePiece itself, so its ids
differ from open_clip's on the rare texts of steps 3 and 5; these are open_clip's.
"""

from __future__ import annotations

import functools
import html
import re
import string
import struct
from collections.abc import Sequence

import numpy as np

from contrastive_jax.errors import ConfigError

CLEAN_MODES = ("canonicalize", "whitespace", "lower")
"""open_clip's cleaning functions (``open_clip.tokenizer.get_clean_fn``)."""

SPECIAL_PIECES = ("<pad>", "</s>", "<unk>")
"""T5's first three pieces (ids 0, 1, 2), matched as text by the Hugging Face tokenizer."""

_PUNCTUATION = str.maketrans("", "", string.punctuation)
_SPECIAL_TEXT = re.compile("(" + "|".join(re.escape(p) for p in SPECIAL_PIECES) + ")")
_WHITESPACE = re.compile("[\t\n\v\f\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f"
                         "\u3000]+")  # Unicode White_Space, Rust's char::is_whitespace
_BEFORE_META = re.compile("(?=\u2581)")
UNK_PENALTY = 10.0
"""An unknown character's score: the lowest piece score minus this (SentencePiece's and
Hugging Face's ``kUnkPenalty``)."""
META = "\u2581"
"""SentencePiece's word-start symbol ``▁``."""


def basic_clean(text: str) -> str:
    """open_clip's ``basic_clean``: ``ftfy.fix_text``, HTML unescaped twice, stripped."""
    import ftfy

    return html.unescape(html.unescape(ftfy.fix_text(text))).strip()


def canonicalize_text(text: str) -> str:
    """big_vision's ``canonicalize_text`` (as open_clip copies it): ``_`` to a space, ASCII
    punctuation (``string.punctuation``) removed, lowercase, whitespace runs to one space."""
    text = text.replace("_", " ").translate(_PUNCTUATION).lower()
    return " ".join(text.split()).strip()


def clean_as_open_clip(text: str, mode: str) -> str:
    """``text`` cleaned as open_clip's ``get_clean_fn(mode)`` does (:data:`CLEAN_MODES`)."""
    text = basic_clean(text)
    if mode == "canonicalize":
        return canonicalize_text(text)
    text = " ".join(text.split()).strip()
    if mode == "lower":
        return text.lower()
    if mode == "whitespace":
        return text
    raise ConfigError(f"unknown clean mode {mode!r} (data.preprocess.tokenizer.clean); valid: "
                      f"{list(CLEAN_MODES)}")


class CharsMap:
    """A SentencePiece ``precompiled_charsmap``: a darts-clone double-array trie over UTF-8
    keys, whose values index NUL-terminated replacements (``uint32`` trie size in bytes, the
    trie's ``uint32`` units, then the replacements), read as Hugging Face's ``Precompiled``
    normalizer reads it. An empty map changes nothing."""

    def __init__(self, blob: bytes):
        self.units: list[int] = []
        self.replacements = b""
        if blob:
            (size,) = struct.unpack_from("<I", blob)
            self.units = list(struct.unpack_from(f"<{size // 4}I", blob, 4))
            self.replacements = blob[4 + size:]
        self.normalize_grapheme = functools.lru_cache(maxsize=1 << 16)(self._grapheme)

    def prefix_matches(self, key: bytes) -> list[tuple[int, int]]:
        """``(value, length in bytes)`` of the keys that are prefixes of ``key``, shortest
        first (darts' ``commonPrefixSearch``)."""
        units, found = self.units, []
        if not units:
            return found
        unit = units[0]
        pos = (unit >> 10) << ((unit & 512) >> 6)
        for length, byte in enumerate(key, start=1):
            if byte == 0:
                break
            pos ^= byte
            unit = units[pos] if pos < len(units) else 0
            if unit & 0x800000FF != byte:  # the unit's label
                break
            pos ^= (unit >> 10) << ((unit & 512) >> 6)
            if (unit >> 8) & 1:  # has a leaf: the value sits in the next unit
                found.append((units[pos] & 0x7FFFFFFF, length))
        return found

    def replacement(self, value: int) -> str:
        """The NUL-terminated replacement text at ``value``."""
        end = self.replacements.index(b"\0", value)
        return self.replacements[value:end].decode("utf-8")

    def transform(self, chunk: str) -> str | None:
        """The replacement of the shortest key that ``chunk`` starts with, or ``None``."""
        found = self.prefix_matches(chunk.encode("utf-8"))
        return self.replacement(found[0][0]) if found else None

    def _grapheme(self, grapheme: str) -> str:
        if len(grapheme.encode("utf-8")) < 6:
            whole = self.transform(grapheme)
            if whole is not None:
                return whole
        return "".join(c if (r := self.transform(c)) is None else r for c in grapheme)

    def normalize(self, text: str) -> str:
        """``text`` normalised grapheme by grapheme as Hugging Face's ``Precompiled`` does
        (module docstring, step 3)."""
        if not self.units:
            return text
        import regex

        return "".join(map(self.normalize_grapheme, regex.findall(r"\X", text)))


def segment(word: str, pieces: dict[str, tuple[int, float]], max_len: int,
            unk_score: float, unk_id: int = 2) -> list[int]:
    """The ids of the most probable segmentation of ``word`` into ``pieces`` (text -> (id,
    score); ``max_len`` the longest piece in characters), as Hugging Face's
    ``Unigram.encode_optimized`` finds it (module docstring, step 5)::

        best[0] = 0,  best[j] = max over pieces w[i:j] of best[i] + score(w[i:j])

    scanned by increasing ``i``, then ``j``, a tie keeping the first found; a character that
    starts no one-character piece may also be an unknown of score ``unk_score``. Consecutive
    unknowns (and ``<unk>`` pieces) are fused, the fused text looked up as a piece, else
    ``unk_id``."""
    n = len(word)
    best, start, ident = [0.0] * (n + 1), [-1] * (n + 1), [unk_id] * (n + 1)
    for i in range(n):
        here, single = best[i], False
        for j in range(i + 1, min(n, i + max_len) + 1):
            found = pieces.get(word[i:j])
            if found is not None:
                candidate = found[1] + here
                if start[j] < 0 or candidate > best[j]:
                    best[j], start[j], ident[j] = candidate, i, found[0]
                single = single or j == i + 1
        if not single:
            candidate = unk_score + here
            if start[i + 1] < 0 or candidate > best[i + 1]:
                best[i + 1], start[i + 1], ident[i + 1] = candidate, i, unk_id
    spans: list[tuple[int, int, int | None]] = []  # (begin, end, id; None: unknown), backwards
    end = n
    while end > 0:
        begin = start[end]
        if ident[end] != unk_id:
            spans.append((begin, end, ident[end]))
        elif spans and spans[-1][2] is None:
            spans[-1] = (begin, spans[-1][1], None)
        else:
            spans.append((begin, end, None))
        end = begin
    return [pieces.get(word[b:e], (unk_id,))[0] if i is None else i for b, e, i in spans[::-1]]


def _read_model(model_proto: bytes, source: str) -> tuple[list[tuple[str, float]], CharsMap]:
    """``(pieces as (text, score), CharsMap)`` of a T5-style model; ConfigError for any other
    (see the module docstring)."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model_proto)
    trainer, norm = proto.trainer_spec, proto.normalizer_spec
    first = tuple(p.piece for p in proto.pieces[:3])
    problems = []
    if trainer.model_type != sentencepiece_model_pb2.TrainerSpec.UNIGRAM:
        name = sentencepiece_model_pb2.TrainerSpec.ModelType.Name(trainer.model_type)
        problems.append(f"model_type {name} (the T5 tokenizer is a unigram model)")
    if first != SPECIAL_PIECES or (trainer.pad_id, trainer.eos_id, trainer.unk_id) != (0, 1, 2):
        problems.append(f"first pieces {list(first)} with pad/eos/unk ids "
                        f"{[trainer.pad_id, trainer.eos_id, trainer.unk_id]} (T5's layout is "
                        f"{list(SPECIAL_PIECES)} = 0, 1, 2)")
    kinds = sentencepiece_model_pb2.ModelProto.SentencePiece
    for kind in ("USER_DEFINED", "BYTE", "UNUSED"):
        count = sum(p.type == getattr(kinds, kind) for p in proto.pieces)
        if count:
            problems.append(f"{count} {kind.lower()} pieces")
    if trainer.byte_fallback:
        problems.append("byte_fallback")
    if not (norm.add_dummy_prefix and norm.remove_extra_whitespaces and norm.escape_whitespaces):
        problems.append("normalizer_spec add_dummy_prefix / remove_extra_whitespaces / "
                        f"escape_whitespaces = {norm.add_dummy_prefix} / "
                        f"{norm.remove_extra_whitespaces} / {norm.escape_whitespaces} (need all "
                        "true)")
    if trainer.treat_whitespace_as_suffix:
        problems.append("treat_whitespace_as_suffix")
    if problems:
        raise ConfigError(f"{source}: kind 'sentencepiece_open_clip' needs a T5-style "
                          f"SentencePiece model (as SigLIP's c4_en); this one has "
                          f"{'; '.join(problems)}")
    return [(p.piece, p.score) for p in proto.pieces], CharsMap(norm.precompiled_charsmap)


class OpenClipSentencePieceTokenizer:
    """A T5-layout SentencePiece model with open_clip's cleaning: the ids of open_clip's
    ``HFTokenizer`` for SigLIP (see the module docstring).

    ``encode(texts, max_tokens)`` -> ``(len(texts), max_tokens)`` int32, each row
    ``ids </s>`` then ``pad_id`` (default ``eos_id`` = 1), ``vocab_size`` = the number of pieces
    (32,000 for c4_en). ``decode`` reads a row up to its first ``</s>``.
    """

    eos_id = 1
    unk_id = 2

    def __init__(self, model_proto: bytes, clean: str = "canonicalize", pad_id: int | None = None,
                 source: str = "<bytes>"):
        try:
            import ftfy  # noqa: F401  (basic_clean needs it; fail here, not at the first text)
            import sentencepiece
        except ImportError as err:
            raise ConfigError(f"the SigLIP tokenizer needs the packages 'sentencepiece' and "
                              f"'ftfy' ({err}); pip install 'contrastive-jax[train]'") from None
        if not isinstance(clean, str) or clean not in CLEAN_MODES:
            raise ConfigError(f"data.preprocess.tokenizer.clean = {clean!r} is not one of "
                              f"open_clip's clean modes {list(CLEAN_MODES)}")
        try:
            self.processor = sentencepiece.SentencePieceProcessor(model_proto=model_proto)
        except RuntimeError as err:
            raise ConfigError(f"{source} is not a SentencePiece model file ({err})") from None
        pieces, self.chars = _read_model(model_proto, source)
        self.model_proto, self.source, self.clean = model_proto, source, clean
        self.vocab_size = len(pieces)
        self.pieces = {text: (i, score) for i, (text, score) in enumerate(pieces)}
        max_len = max(len(text) for text, _ in pieces)
        unk_score = min(score for _, score in pieces) - UNK_PENALTY
        self.segment = functools.lru_cache(maxsize=1 << 16)(
            lambda word: tuple(segment(word, self.pieces, max_len, unk_score, self.unk_id)))
        pad_id = self.eos_id if pad_id is None else pad_id
        if isinstance(pad_id, bool) or not isinstance(pad_id, int | np.integer) or not (
                0 <= pad_id < self.vocab_size):
            raise ConfigError(f"data.preprocess.tokenizer.pad_id = {pad_id!r} must be a token "
                              f"id in [0, {self.vocab_size}) (SigLIP pads with 1 = </s>)")
        self.pad_id = int(pad_id)

    def __reduce__(self) -> tuple:
        """Pickled as its constructor's arguments (grain's worker processes pickle the
        preprocessing; the caches are rebuilt there)."""
        return type(self), (self.model_proto, self.clean, self.pad_id, self.source)

    def ids(self, text: str | bytes) -> list[int]:
        """The ids of one text, without ``</s>`` (module docstring, steps 1-5)."""
        text = text.decode("utf-8") if isinstance(text, bytes) else str(text)
        text = clean_as_open_clip(text, self.clean)
        chunks = _SPECIAL_TEXT.split(text) if "<" in text else [text]
        out = []
        for i, chunk in enumerate(chunks):
            if i % 2:
                out.append(SPECIAL_PIECES.index(chunk))
            elif chunk:
                parts = [part for word in _WHITESPACE.split(self.chars.normalize(chunk)) if word
                         for part in _BEFORE_META.split(word if word[0] == META else META + word)
                         if part]
                for part in parts:
                    out.extend(self.segment(part))
        return out

    def encode(self, texts: Sequence[str | bytes], max_tokens: int) -> np.ndarray:
        """Rows ``(len(texts), max_tokens)`` int32: ``ids </s>`` then ``pad_id``; a longer text
        keeps its first ``max_tokens - 1`` ids and ends with ``</s>`` (open_clip's
        ``HFTokenizer(...)(texts, context_length=max_tokens)``)."""
        if max_tokens < 2:
            raise ConfigError(f"max_tokens must be >= 2 (a token and </s>); got {max_tokens}")
        out = np.full((len(texts), max_tokens), self.pad_id, np.int32)
        for row, text in enumerate(texts):
            ids = self.ids(text)[:max_tokens - 1]
            out[row, :len(ids)] = ids
            out[row, len(ids)] = self.eos_id
        return out

    def decode(self, tokens: np.ndarray) -> list[str]:
        """Texts of rows ``(n, max_tokens)``: the ids before each row's first ``</s>`` (all of
        a row without one), decoded by the model (``<pad>`` to nothing, ``<unk>`` to ``⁇``).
        The result is the cleaned, normalised text (lowercase without punctuation under
        ``"canonicalize"``)."""
        texts = []
        for row in np.atleast_2d(np.asarray(tokens)).tolist():
            if self.eos_id in row:
                row = row[:row.index(self.eos_id)]
            texts.append(self.processor.decode(row))
        return texts
