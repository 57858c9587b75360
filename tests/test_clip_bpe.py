"""CLIP's byte-level BPE (data.preprocess.tokenizer kind "clip_bpe"): the ids of open_clip.

The expected ids come from open_clip's own ``SimpleTokenizer`` built with a small self-made
merges file (tests/fixtures/clip_bpe_make_fixtures.py wrote both), so no PyTorch or open_clip
is needed here.
"""

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.data.example_preprocessing import image_text_preprocess
from contrastive_jax.training.data.text import clip_bpe
from contrastive_jax.training.data.text.text_tokenizers import check_vocab_size, load_tokenizer

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MERGES = FIXTURES / "clip_bpe_merges.txt.gz"
RECORD = json.loads((FIXTURES / "clip_bpe_ids.json").read_text())


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer({"kind": "clip_bpe", "path": str(MERGES)})


def test_fixture_is_varied_and_truncates():
    """The fixture holds a few hundred strings, and rows end in <end_of_text> at the last
    position at both context lengths (truncation is exercised: 100 cut at 12, 29 at 77)."""
    strings, ids = RECORD["strings"], RECORD["ids"]
    assert len(strings) >= 300
    short = np.asarray(ids["12"])
    assert np.sum(short[:, -1] == RECORD["end_id"]) >= 100
    assert np.sum(np.asarray(ids["77"])[:, -1] == RECORD["end_id"]) >= 20
    assert any(ord(c) > 0x3000 for s in strings for c in s)  # CJK, emoji
    assert any("&amp;" in s for s in strings)


@pytest.mark.parametrize("length", sorted(RECORD["ids"]))
def test_ids_equal_open_clip_on_every_fixture_string(tokenizer, length):
    """Every string, token for token, equals open_clip's tokenize at this context length."""
    ours = tokenizer.encode(RECORD["strings"], int(length))
    expected = np.asarray(RECORD["ids"][length])
    assert ours.dtype == np.int32 and ours.shape == expected.shape
    differ = [RECORD["strings"][i] for i in np.flatnonzero((ours != expected).any(axis=1))]
    assert not differ, differ[:5]


def test_vocabulary_layout_matches_open_clip(tokenizer):
    """512 byte symbols, one id per merge, then start/end: the same sizes and special ids as
    open_clip with the same file (its trailing newline counts as one empty merge, as there)."""
    assert tokenizer.vocab_size == RECORD["vocab_size"]
    assert (tokenizer.start_id, tokenizer.end_id) == (RECORD["start_id"], RECORD["end_id"])
    assert tokenizer.vocab_size == 512 + RECORD["merges"] + 1 + 2
    assert tokenizer.encoder["!"] == 0 and tokenizer.encoder["!</w>"] == 256


def test_plain_text_file_reads_like_the_gzip(tmp_path, tokenizer):
    plain = tmp_path / "merges.txt"
    plain.write_bytes(gzip.decompress(MERGES.read_bytes()))
    again = load_tokenizer({"kind": "clip_bpe", "path": str(plain)})
    texts = RECORD["strings"][:50]
    np.testing.assert_array_equal(again.encode(texts, 77), tokenizer.encode(texts, 77))


def test_truncation_keeps_the_first_ids_and_ends_with_end_of_text(tokenizer):
    text = " ".join(["photograph of a dog"] * 30)
    full = tokenizer.ids(text)
    row = tokenizer.encode([text], 10)[0]
    assert len(full) > 10
    assert row.tolist() == [tokenizer.start_id, *full[:8], tokenizer.end_id]
    fits = tokenizer.encode(["a dog"], 10)[0]
    n = len(tokenizer.ids("a dog"))
    assert fits[n + 1] == tokenizer.end_id and not fits[n + 2:].any()


def test_decode_inverts_encode_on_clean_text(tokenizer):
    texts = ["a photo of a dog.", "Hello,   World!!", "café 日本語 👍", "don't stop"]
    decoded = tokenizer.decode(tokenizer.encode(texts, 40))
    assert decoded == ["a photo of a dog .", "hello , world !!", "café 日本語 👍",
                       "don 't stop"]


def test_preprocessing_tokenises_captions_with_clip_bpe(tokenizer):
    """The image-text pipeline with kind "clip_bpe": the caption row is the tokenizer's row,
    and a text tower with too few embedding rows is refused."""
    spec = {"kind": "clip_bpe", "path": str(MERGES)}
    pre = image_text_preprocess(image_size=4, max_tokens=16, tokenizer=spec,
                                vocab_size=tokenizer.vocab_size)
    example = {"image": np.zeros((6, 8, 3), np.uint8), "captions": {"text": [b"Two CATS!"]}}
    np.testing.assert_array_equal(pre(example)["caption"],
                                  tokenizer.encode(["Two CATS!"], 16)[0])
    with pytest.raises(ConfigError, match="vocab_size"):
        check_vocab_size(tokenizer, tokenizer.vocab_size - 1)


def test_bad_files_and_settings_are_config_errors(tmp_path, tokenizer):
    with pytest.raises(ConfigError, match="must name a CLIP BPE merges file"):
        load_tokenizer({"kind": "clip_bpe", "path": ""})
    with pytest.raises(ConfigError, match="does not exist"):
        load_tokenizer({"kind": "clip_bpe", "path": str(tmp_path / "missing.txt.gz")})
    headless = tmp_path / "headless.txt"
    headless.write_text("h e\nhe l\n")
    with pytest.raises(ConfigError, match="header"):
        load_tokenizer({"kind": "clip_bpe", "path": str(headless)})
    three = tmp_path / "three.txt"
    three.write_text("#version: 0.2\nh e\na b c\n")
    with pytest.raises(ConfigError, match="line 3 has 3 symbols"):
        load_tokenizer({"kind": "clip_bpe", "path": str(three)})
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"#version: 0.2\n\xff\xfe")
    with pytest.raises(ConfigError, match="UTF-8"):
        load_tokenizer({"kind": "clip_bpe", "path": str(binary)})
    with pytest.raises(ConfigError, match="max_tokens must be >= 2"):
        tokenizer.encode(["a"], 1)


def test_bpe_merges_by_rank_not_by_position():
    """A hand-made file: "l o" outranks "h e", so "hello" merges "lo" before "he"; the ids
    follow the vocabulary layout (byte symbols, then with </w>, then merges)."""
    merges = clip_bpe.read_merges(b"#version: 0.2\nl o</w>\nh e\nhe l\nl lo</w>")
    tok = clip_bpe.ClipBpeTokenizer(merges)
    assert tok.bpe("hello") == ["hel", "lo</w>"]
    assert tok.ids("hello") == [512 + 2, 512 + 0]
    assert tok.vocab_size == 512 + 4 + 2 and tok.end_id == tok.vocab_size - 1
