"""SigLIP's tokenizer (data.preprocess.tokenizer kind "sentencepiece_open_clip"): open_clip's ids.

The expected ids come from open_clip's own ``HFTokenizer`` over a Hugging Face T5 tokenizer
directory built, as the hub's ``timm/ViT-B-16-SigLIP``, from a small self-trained SentencePiece
model of T5's layout (tests/fixtures/make_siglip_tokenizer_fixture.py wrote both), so no
PyTorch, open_clip or transformers is needed here.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.data.example_preprocessing import image_text_preprocess
from contrastive_jax.training.data.text import open_clip_sentencepiece as osp
from contrastive_jax.training.data.text.text_tokenizers import check_vocab_size, load_tokenizer

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MODEL = FIXTURES / "siglip_spm.model"
RECORD = json.loads((FIXTURES / "siglip_tokenizer_ids.json").read_text())
TABLES = [(key, length) for key, lengths in RECORD["ids"].items() for length in lengths]


def spec(**options) -> dict:
    return {"kind": "sentencepiece_open_clip", "path": str(MODEL), **options}


def expected(key: str, length: str) -> tuple[np.ndarray, int]:
    """open_clip's rows of a table (stored without trailing padding) and their pad id."""
    pad = 0 if key.endswith("_pad0") else RECORD["pad_id"]
    rows = [row + [pad] * (int(length) - len(row)) for row in RECORD["ids"][key][length]]
    return np.asarray(rows), pad


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(spec())


def test_fixture_is_varied_truncates_and_needs_the_hugging_face_rules():
    """557 strings; 152 rows are full at 16 tokens and 49 at 64 (cut, or exactly 15 / 63
    ids; with pad id 0, 204 rows end in ``</s>`` at position 16); CJK, emoji and
    HTML entities are there; and on 5-6 strings per table SentencePiece's own encode gives
    other ids than open_clip (a grapheme replaced whole, a tie of segmentations, ``﹤/s﹥``),
    so the test below checks the Hugging Face rules, not only SentencePiece's."""
    strings = RECORD["strings"]
    assert len(strings) >= 550
    for key, length, full in [("canonicalize", "16", 152), ("whitespace", "64", 49)]:
        rows, pad = expected(key, length)
        assert np.all(rows[:, -1] == RECORD["eos_id"]) and np.sum(rows[:, -2] != pad) == full
    cut, pad = expected("whitespace_pad0", "16")
    assert np.sum(cut[:, -1] == RECORD["eos_id"]) == 204
    assert any(ord(c) > 0x3000 for s in strings for c in s) and any("&amp;" in s for s in strings)
    differs = RECORD["sentencepiece_alone_differs"]
    assert set(differs) == {f"{key}/{length}" for key, length in TABLES}
    assert all(len(v) >= 5 for v in differs.values())
    assert strings.index("\u33fa\u0347") in differs["canonicalize/64"]


@pytest.mark.parametrize(("key", "length"), TABLES)
def test_ids_equal_open_clip_on_every_fixture_string(key, length):
    """Every string, token for token, equals open_clip's ``HFTokenizer(dir, clean=mode)`` at
    this context length (pad token ``</s>`` = 1, or ``<pad>`` = 0 for ``*_pad0``)."""
    want, pad = expected(key, length)
    tok = load_tokenizer(spec(clean=key.removesuffix("_pad0"), pad_id=pad))
    ours = tok.encode(RECORD["strings"], int(length))
    assert ours.dtype == np.int32 and ours.shape == want.shape
    differ = [RECORD["strings"][i] for i in np.flatnonzero((ours != want).any(axis=1))]
    assert not differ, differ[:5]


def test_rows_are_ids_then_end_then_padding(tokenizer):
    """``ids </s>`` then ``pad_id`` (default 1 = ``</s>``, SigLIP's); a longer text keeps its
    first ``max_tokens - 1`` ids and ends with ``</s>``; ``vocab_size`` = the model's pieces."""
    assert tokenizer.vocab_size == RECORD["pieces"] == 2000
    assert (tokenizer.pad_id, tokenizer.eos_id) == (1, 1)
    text = " ".join(["a photo of a dog"] * 20)
    full = tokenizer.ids(text)
    assert len(full) > 10
    assert tokenizer.encode([text], 10)[0].tolist() == [*full[:9], 1]
    short = tokenizer.ids("a dog")
    assert tokenizer.encode(["a dog"], 8)[0].tolist() == [*short, 1] + [1] * (7 - len(short))
    zeros = load_tokenizer(spec(pad_id=0)).encode(["a dog", ""], 8)
    assert zeros.tolist() == [[*short, 1] + [0] * (7 - len(short)), [1] + [0] * 7]


def test_clean_modes_are_open_clips():
    """canonicalize: ``_`` -> space, ASCII punctuation removed, lowercase, whitespace runs to
    one space; whitespace: runs to one space only; lower: and lowercase. All after ftfy (which
    straightens quotes and splits ligatures) and HTML unescaping (twice). The expected strings
    are open_clip's ``get_clean_fn(mode)`` of the text."""
    text = "  A_Photo, of &amp;amp; the  “Dog”!\t(ÉTÉ) ﬁne "
    assert osp.clean_as_open_clip(text, "canonicalize") == "a photo of the dog été fine"
    assert osp.clean_as_open_clip(text, "whitespace") == 'A_Photo, of & the "Dog"! (ÉTÉ) fine'
    assert osp.clean_as_open_clip(text, "lower") == 'a_photo, of & the "dog"! (été) fine'
    with pytest.raises(ConfigError, match=r"unknown clean mode 'basic'.*'canonicalize'"):
        osp.clean_as_open_clip(text, "basic")


def test_charsmap_is_read_as_sentencepiece_and_applied_as_hugging_face():
    """The trie read here gives SentencePiece's own normalisation (longest match at each
    position) on every fixture string; Hugging Face's rule replaces a short grapheme cluster
    whole by its shortest match: ``e`` + U+0301 + U+0302 -> ``é`` (SentencePiece keeps U+0302),
    ``㏺`` + U+0347 -> ``27日`` (the nmt_nfkc map sends U+33FA to ``27日``), ``ﬁ`` -> ``fi``."""
    import sentencepiece
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(MODEL.read_bytes())
    chars = osp.CharsMap(proto.normalizer_spec.precompiled_charsmap)
    norm = proto.normalizer_spec
    norm.add_dummy_prefix = norm.remove_extra_whitespaces = norm.escape_whitespaces = False
    plain = sentencepiece.SentencePieceProcessor(model_proto=proto.SerializeToString())

    def longest_match(text: str) -> str:
        data, i, out = text.encode("utf-8"), 0, []
        while i < len(data):
            found = chars.prefix_matches(data[i:])
            if found:
                out.append(chars.replacement(found[-1][0]))
                i += found[-1][1]
            else:
                char = data[i:].decode("utf-8")[0]
                out.append(char)
                i += len(char.encode("utf-8"))
        return "".join(out)

    assert all(plain.normalize(t) == longest_match(t) for t in RECORD["strings"])
    assert chars.normalize("e\u0301\u0302") == "\u00e9"
    assert plain.normalize("e\u0301\u0302") == "\u00e9\u0302"
    assert chars.normalize("\u33fa\u0347") == "27\u65e5"
    assert chars.normalize("\ufb01ne caf\u00e9") == "fine caf\u00e9"
    assert osp.CharsMap(b"").normalize("\ufb01") == "\ufb01"


def test_segment_ties_keep_the_first_found_and_unknowns_fuse():
    """Hand-made pieces: ``aaa`` as ``a aa``, ``aa a`` or ``a a a`` all score -6; the scan keeps
    the first best path to each position, which ends ``a aa`` (ids 4, 5). Unknown characters
    (score min - 10 = -14) fuse into one ``<unk>``; ``xa`` is a piece made of them."""
    pieces = {"<pad>": (0, 0.0), "</s>": (1, 0.0), "<unk>": (2, 0.0), "\u2581": (3, -1.0),
              "a": (4, -2.0), "aa": (5, -4.0), "xa": (6, -3.0)}
    assert osp.segment("aaa", pieces, 2, -14.0) == [4, 5]
    assert osp.segment("\u2581a", pieces, 2, -14.0) == [3, 4]
    assert osp.segment("yzy", pieces, 2, -14.0) == [2]
    assert osp.segment("ayzxa", pieces, 2, -14.0) == [4, 2, 6]
    assert osp.segment("</s>", pieces, 4, -14.0) == [1]


def test_pickles_for_grain_workers():
    """grain's worker processes pickle the preprocessing: a pickled copy gives the same rows."""
    import pickle

    texts = RECORD["strings"][:40]
    copy = pickle.loads(pickle.dumps(load_tokenizer(spec(clean="lower", pad_id=0))))
    assert (copy.clean, copy.pad_id) == ("lower", 0)
    np.testing.assert_array_equal(copy.encode(texts, 16),
                                  load_tokenizer(spec(clean="lower", pad_id=0)).encode(texts, 16))


def test_decode_reads_up_to_the_end_token(tokenizer):
    texts = ["A photo of a DOG!", "two_cats, sleeping"]
    assert tokenizer.decode(tokenizer.encode(texts, 32)) == ["a photo of a dog",
                                                             "two cats sleeping"]
    row = tokenizer.encode(["a dog"], 8)[0]
    assert tokenizer.decode(row) == ["a dog"]


def test_preprocessing_tokenises_captions_with_it(tokenizer):
    """The image-text pipeline with this kind: the caption row is the tokenizer's row (padded
    with 1), and a text tower with too few embedding rows is refused."""
    pre = image_text_preprocess(image_size=4, max_tokens=16, tokenizer=spec(),
                                vocab_size=tokenizer.vocab_size)
    example = {"image": np.zeros((6, 8, 3), np.uint8), "captions": {"text": [b"Two CATS!"]}}
    caption = pre(example)["caption"]
    np.testing.assert_array_equal(caption, tokenizer.encode(["Two CATS!"], 16)[0])
    assert caption[-1] == 1 and 0 not in caption
    with pytest.raises(ConfigError, match="vocab_size"):
        check_vocab_size(tokenizer, tokenizer.vocab_size - 1)


def test_bad_fields_files_and_models_are_config_errors(tmp_path, tokenizer):
    from sentencepiece import sentencepiece_model_pb2

    with pytest.raises(ConfigError, match=r"fields \['file'\] for kind 'sentencepiece_open_clip'"
                                          r".*'clean', 'pad_id'"):
        load_tokenizer({**spec(), "file": "x"})
    with pytest.raises(ConfigError, match=r"fields \['clean'\] for kind 'clip_bpe'"):
        load_tokenizer({"kind": "clip_bpe", "path": "x", "clean": "lower"})
    with pytest.raises(ConfigError, match=r"clean = 'basic' is not one of open_clip's clean modes "
                                          r"\['canonicalize', 'whitespace', 'lower'\]"):
        load_tokenizer(spec(clean="basic"))
    for bad in (2000, -1, True, "1", 1.0):
        with pytest.raises(ConfigError, match=r"pad_id = .* must be a token id in \[0, 2000\)"):
            load_tokenizer(spec(pad_id=bad))
    with pytest.raises(ConfigError, match="must name a T5-style SentencePiece"):
        load_tokenizer(spec(path=""))
    with pytest.raises(ConfigError, match="does not exist"):
        load_tokenizer(spec(path=str(tmp_path / "missing.model")))
    junk = tmp_path / "junk.model"
    junk.write_bytes(b"not a model")
    with pytest.raises(ConfigError, match="is not a SentencePiece model file"):
        load_tokenizer(spec(path=str(junk)))
    with pytest.raises(ConfigError, match="max_tokens must be >= 2"):
        tokenizer.encode(["a"], 1)

    def variant(edit) -> str:
        proto = sentencepiece_model_pb2.ModelProto()
        proto.ParseFromString(MODEL.read_bytes())
        edit(proto)
        path = tmp_path / "variant.model"
        path.write_bytes(proto.SerializeToString())
        return str(path)

    def bpe(p):
        p.trainer_spec.model_type = sentencepiece_model_pb2.TrainerSpec.BPE

    def swapped(p):
        p.pieces[0].piece, p.pieces[2].piece = "<unk>", "<pad>"
        p.trainer_spec.pad_id, p.trainer_spec.unk_id = 2, 0

    def user_defined(p):
        p.pieces[5].type = sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED

    def no_prefix(p):
        p.normalizer_spec.add_dummy_prefix = False

    for edit, message in [(bpe, "model_type BPE"), (swapped, r"first pieces \['<unk>'"),
                          (user_defined, "1 user_defined pieces"),
                          (no_prefix, "add_dummy_prefix")]:
        with pytest.raises(ConfigError, match=f"needs a T5-style SentencePiece model.*{message}"):
            load_tokenizer(spec(path=variant(edit)))
