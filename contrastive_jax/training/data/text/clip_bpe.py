"""CLIP's byte-level BPE tokenizer, in pure Python: the token ids of open_clip's ``tokenize``.

The vocabulary file is the ``bpe_simple_vocab_16e6.txt.gz`` format that OpenAI's CLIP and
open_clip ship ([CLIP], [OpenCLIP]): a gzip text whose first line is a header (with ``#version:
0.2``) and whose next lines are merges, one ``left right`` pair per line, in rank order. The
user supplies the file (the package ships none). What open_clip's ``SimpleTokenizer`` (its
default ``clean="lower"``, no reduction) does, and so what :class:`ClipBpeTokenizer` does:

1. Lines ``1 .. 48894`` of the file (at most ``49152 - 256 - 2`` merges) are the merges; the
   vocabulary is the 256 byte symbols, the same 256 with ``</w>`` (end of word), one entry per
   merge (the pair joined), then ``<start_of_text>`` and ``<end_of_text>``. With OpenAI's file:
   49408 ids, start 49406, end 49407. An empty line inside that range counts as a merge, as in
   open_clip (so a short file that ends in a newline gets one extra, unused id).
2. Cleaning: ``ftfy.fix_text``, ``html.unescape`` twice, strip, runs of whitespace to one
   space, lowercase.
3. Pre-tokenisation with the ``regex`` pattern ``<start_of_text>|<end_of_text>|'s|'t|'re|'ve|
   'm|'ll|'d|[\\p{L}]+|[\\p{N}]|[^\\s\\p{L}\\p{N}]+`` (ignoring case): letter runs, single digits,
   punctuation runs, English contractions. The literal texts ``<start_of_text>`` and
   ``<end_of_text>`` become the special ids, as in open_clip.
4. Each piece's UTF-8 bytes map to printable symbols (GPT-2's byte-to-unicode table), its
   last symbol gets ``</w>``, and the lowest-ranked adjacent pair is merged until no pair is a
   merge (byte-level BPE as in GPT-2 and [CLIP]).
5. A row is ``<start_of_text> ids <end_of_text>`` padded with 0 to the context length; a
   longer row is cut to the context length and its last id replaced by ``<end_of_text>``.

**Id 0 is the byte "!"** in this vocabulary (the first byte symbol), not padding: the ids are
open_clip's, so a converted CLIP text tower reads them as it was trained. CLIP's text tower
attends causally and pools at the end-of-text token, so the padding zeros after it never reach
the pooled feature. This project's own ``TextTransformer`` masks id 0 as padding; with it, a
"!" that BPE leaves as a bare, non-final symbol (e.g. in ``"!?"`` when no merge covers it) is
masked too. ``"!"`` at the end of a piece is ``"!</w>"`` (id 256), which is not masked.
"""

from __future__ import annotations

import functools
import gzip
import html
import itertools
from collections.abc import Sequence

import numpy as np

from contrastive_jax.errors import ConfigError

MAX_MERGES = 49152 - 256 - 2  # open_clip reads lines 1 .. 48894 of the merges file
START, END = "<start_of_text>", "<end_of_text>"
PATTERN = (r"""<start_of_text>|<end_of_text>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]"""
           r"""|[^\s\p{L}\p{N}]+""")


@functools.cache
def byte_symbols() -> dict[int, str]:
    """Byte -> printable symbol (GPT-2's table, as in CLIP): the 188 printable Latin-1 bytes
    map to themselves, the other 68 to ``chr(256 + k)`` in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + k) for k, b in enumerate(others)}}


def clip_clean(text: str) -> str:
    """open_clip's ``clean="lower"``: ftfy, HTML unescaped twice, whitespace runs to one space,
    stripped, lowercased."""
    import ftfy

    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    return " ".join(text.split()).strip().lower()


def read_merges(data: bytes, source: str = "<bytes>") -> list[tuple[str, ...]]:
    """The merges of a ``bpe_simple_vocab_16e6.txt.gz``-format file's bytes (gzip or plain
    text), in rank order: lines ``1 .. MAX_MERGES`` split on whitespace, as open_clip reads them.

    ConfigError when the data is neither gzip nor UTF-8 text, when the first line holds no
    ``#version`` header (open_clip always drops line 0, so a file without one would lose its
    first merge; OpenAI's file starts ``"bpe_simple_vocab_16e6.txt#version: 0.2``), or when a
    line holds more than two symbols.
    """
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as err:
            raise ConfigError(f"{source}: not a readable gzip file ({err})") from None
    try:
        lines = data.decode("utf-8").split("\n")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{source}: a CLIP BPE merges file must be UTF-8 text ({err})") from None
    if "#version" not in lines[0]:
        raise ConfigError(f"{source}: the first line of a CLIP BPE merges file is a header with "
                          f"'#version' (e.g. '#version: 0.2'); got {lines[0][:40]!r}")
    merges = [tuple(line.split()) for line in lines[1:MAX_MERGES + 1]]
    for number, merge in enumerate(merges, start=2):
        if len(merge) > 2:
            raise ConfigError(f"{source}: line {number} has {len(merge)} symbols; a merge is "
                              "two symbols separated by a space")
    return merges


class ClipBpeTokenizer:
    """CLIP's tokenizer from a merges list (:func:`read_merges`); ids as open_clip's.

    ``encode(texts, max_tokens)`` -> ``(len(texts), max_tokens)`` int32, ``vocab_size`` =
    ``512 + len(merges) + 2`` (49408 with OpenAI's file), ``start_id``/``end_id`` the last two.
    """

    def __init__(self, merges: Sequence[tuple[str, ...]], source: str = "<merges>"):
        try:
            import ftfy  # noqa: F401  (clean() needs it; fail here, not at the first text)
            import regex
        except ImportError as err:
            raise ConfigError(f"CLIP's tokenizer needs the packages 'ftfy' and 'regex' ({err}); "
                              "pip install 'contrastive-jax[train]'") from None
        self.source = source
        symbols = list(byte_symbols().values())
        vocab = [*symbols, *(s + "</w>" for s in symbols), *("".join(m) for m in merges),
                 START, END]
        self.encoder = dict(zip(vocab, range(len(vocab)), strict=True))
        self.decoder = {i: s for s, i in self.encoder.items()}
        self.ranks = dict(zip(merges, range(len(merges)), strict=True))
        self.vocab_size = len(vocab)
        self.start_id, self.end_id = self.encoder[START], self.encoder[END]
        self.pattern = regex.compile(PATTERN, regex.IGNORECASE)
        self._cache = {START: START, END: END}

    def bpe(self, piece: str) -> list[str]:
        """The BPE symbols of one pre-token (its bytes as symbols): lowest-rank pair first."""
        if piece in self._cache:
            return self._cache[piece].split(" ")
        word = (*piece[:-1], piece[-1] + "</w>")
        while len(word) > 1:
            pairs = set(itertools.pairwise(word))
            best = min(pairs, key=lambda pair: self.ranks.get(pair, float("inf")))
            if best not in self.ranks:
                break
            merged, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and (word[i], word[i + 1]) == best:
                    merged.append(word[i] + word[i + 1])
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = tuple(merged)
        self._cache[piece] = " ".join(word)
        return list(word)

    def ids(self, text: str) -> list[int]:
        """The ids of one text, without start/end (open_clip's ``SimpleTokenizer.encode``)."""
        symbols = byte_symbols()
        out = []
        for piece in self.pattern.findall(clip_clean(text)):
            piece = "".join(symbols[b] for b in piece.encode("utf-8"))
            out.extend(self.encoder[s] for s in self.bpe(piece))
        return out

    def encode(self, texts: Sequence[str | bytes], max_tokens: int) -> np.ndarray:
        """Rows ``(len(texts), max_tokens)`` int32: ``start ids end``, 0-padded; a longer row
        keeps its first ``max_tokens - 1`` ids and ends with ``end`` (open_clip's
        ``tokenize(texts, context_length=max_tokens)``)."""
        if max_tokens < 2:
            raise ConfigError(f"max_tokens must be >= 2 (<start_of_text>, <end_of_text>); got "
                              f"{max_tokens}")
        out = np.zeros((len(texts), max_tokens), np.int32)
        for row, text in enumerate(texts):
            text = text.decode("utf-8") if isinstance(text, bytes) else str(text)
            toks = [self.start_id, *self.ids(text), self.end_id][:max_tokens]
            toks[-1] = self.end_id
            out[row, :len(toks)] = toks
        return out

    def decode(self, tokens: np.ndarray) -> list[str]:
        """Texts of rows ``(n, max_tokens)``: the ids between ``start`` and the first ``end``
        (a row without ``end``: up to its trailing zeros), bytes decoded as UTF-8
        (invalid sequences replaced), ``</w>`` read as a space, stripped."""
        bytes_of = {s: b for b, s in byte_symbols().items()}
        texts = []
        for row in np.atleast_2d(np.asarray(tokens)).tolist():
            if row and row[0] == self.start_id:
                row = row[1:]
            if self.end_id in row:
                row = row[:row.index(self.end_id)]
            else:
                while row and row[-1] == 0:
                    row.pop()
            data = bytearray(bytes_of[c] for c in "".join(self.decoder[t] for t in row))
            texts.append(data.decode("utf-8", errors="replace").replace("</w>", " ").strip())
        return texts
