"""Text tokenizers: SentencePiece built from captions, id 0 kept for padding, the config field."""

import io

import ml_collections
import numpy as np
import pytest
import sentencepiece

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.data.build_tokenizer import train_sentencepiece
from contrastive_jax.training.data.example_preprocessing import make_preprocess
from contrastive_jax.training.data.text import captions
from contrastive_jax.training.data.text.text_tokenizers import (
    SentencePieceTokenizer,
    check_vocab_size,
    load_tokenizer,
)

WORDS = ("a man woman dog cat riding sitting standing on the of with next to table red blue "
         "street bus train pizza plate bench kitchen skateboard giraffe").split()


def caption_texts(n: int = 300, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, rng.integers(3, 10))) for _ in range(n)]


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("sp") / "captions.model"
    path.write_bytes(train_sentencepiece(caption_texts(), vocab_size=80))
    return str(path)


def test_built_vocabulary_reserves_pad_unk_bos_eos(model_file):
    tok = load_tokenizer({"kind": "sentencepiece", "path": model_file})
    sp = tok.processor
    assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (0, 1, 2, 3)
    assert tok.offset == 0 and 4 < tok.vocab_size <= 80
    assert tok.vocab_size == sp.get_piece_size()


def test_round_trip_and_no_real_token_is_padding(model_file):
    tok = load_tokenizer({"kind": "sentencepiece", "path": model_file})
    texts = caption_texts(50, seed=1)
    rows = tok.encode(texts, max_tokens=40)
    assert rows.shape == (50, 40) and rows.dtype == np.int32
    assert tok.decode(rows) == texts
    for row, text in zip(rows, texts, strict=True):
        length = int((row != 0).sum())
        assert row[0] == 2 and row[length - 1] == 3  # <bos> ... <eos>
        assert np.all(row[:length] > 0) and np.all(row[length:] == 0)  # zeros only after
        assert length == len(tok.processor.encode(text)) + 2
        assert np.all(row[:length] < tok.vocab_size)
    unknown = tok.encode(["ZZZ qq"], 8)[0]  # characters never seen: <unk> = 1, never 0
    assert np.all(unknown[: int((unknown != 0).sum())] > 0) and 1 in unknown
    assert tok.encode([b"a man"], 8).tolist() == tok.encode(["a man"], 8).tolist()  # bytes


def test_truncation_keeps_bos_first_tokens_and_eos(model_file):
    tok = load_tokenizer({"kind": "sentencepiece", "path": model_file})
    text = " ".join(WORDS)
    full = tok.encode([text], 80)[0]
    cut = tok.encode([text], 8)[0]
    assert int((full != 0).sum()) > 8
    np.testing.assert_array_equal(cut, [*full[:7], 3])
    with pytest.raises(ConfigError, match="max_tokens must be >= 3"):
        tok.encode([text], 2)


def test_a_model_with_unk_at_id_0_is_shifted_so_0_stays_padding():
    model = io.BytesIO()  # SentencePiece's defaults: <unk> = 0, <s> = 1, </s> = 2, no <pad>
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(caption_texts()), model_writer=model, vocab_size=60,
        hard_vocab_limit=False, num_threads=1, minloglevel=2)
    tok = SentencePieceTokenizer(model.getvalue())
    sp = tok.processor
    assert sp.unk_id() == 0 and sp.pad_id() == -1
    assert tok.offset == 1 and tok.vocab_size == sp.get_piece_size() + 1
    assert (tok.bos, tok.eos) == (sp.bos_id() + 1, sp.eos_id() + 1)
    texts = caption_texts(20, seed=2)
    rows = tok.encode([*texts, "ZZZ"], 30)
    for row, text in zip(rows[:-1], texts, strict=True):
        ids = [i + 1 for i in sp.encode(text)]
        np.testing.assert_array_equal(row[: len(ids) + 2], [tok.bos, *ids, tok.eos])
    unknown = rows[-1][: int((rows[-1] != 0).sum())]
    assert 1 in unknown and np.all(unknown > 0)  # <unk> (piece 0) is id 1, not padding
    assert tok.decode(rows[:-1]) == texts


def test_the_config_field_loads_an_existing_model_file(model_file):
    config = ml_collections.ConfigDict({"features": None, "preprocess": {
        "name": "image_text", "image_size": 8, "max_tokens": 12,
        "tokenizer": {"kind": "sentencepiece", "path": model_file}, "vocab_size": 80}})
    pre = make_preprocess(config)
    text = "a dog sitting on the bench"
    out = pre({"image": np.zeros((10, 12, 3), np.uint8), "captions": {"text": [text.encode()]}})
    expected = SentencePieceTokenizer(open(model_file, "rb").read()).encode([text], 12)[0]
    np.testing.assert_array_equal(out["caption"], expected)
    assert out["image"].shape == (8, 8, 3)


def test_missing_file_wrong_kind_and_vocab_size_mismatch_are_config_errors(model_file, tmp_path):
    missing = str(tmp_path / "nope.model")
    with pytest.raises(ConfigError, match=r"(?s)nope\.model.*does not exist.*build_tokenizer"):
        load_tokenizer({"kind": "sentencepiece", "path": missing})
    with pytest.raises(ConfigError, match=r"must name a SentencePiece \.model file"):
        load_tokenizer({"kind": "sentencepiece", "path": ""})
    with pytest.raises(ConfigError, match=r"unknown data\.preprocess\.tokenizer\.kind 'bpe'"):
        load_tokenizer({"kind": "bpe", "path": model_file})
    with pytest.raises(ConfigError, match=r"unknown data.preprocess.tokenizer fields \['file'\]"):
        load_tokenizer({"kind": "sentencepiece", "file": model_file})
    junk = tmp_path / "junk.model"
    junk.write_bytes(b"not a model")
    with pytest.raises(ConfigError, match="is not a SentencePiece model file"):
        load_tokenizer({"kind": "sentencepiece", "path": str(junk)})
    tok = load_tokenizer({"kind": "sentencepiece", "path": model_file})
    check_vocab_size(tok, tok.vocab_size)  # equal is enough
    with pytest.raises(ConfigError, match=rf"has {tok.vocab_size} token ids.*"
                                          r"model.text_encoder.vocab_size = 10; set"):
        check_vocab_size(tok, 10)
    config = ml_collections.ConfigDict({"features": None, "preprocess": {
        "name": "image_text", "tokenizer": {"kind": "sentencepiece", "path": model_file},
        "vocab_size": tok.vocab_size - 1}})
    with pytest.raises(ConfigError, match=r"model\.text_encoder\.vocab_size"):
        make_preprocess(config)
    config.preprocess.vocab_size = tok.vocab_size
    config.preprocess.vocabulary = "words.txt"
    with pytest.raises(ConfigError, match="not both"):
        make_preprocess(config)


def test_the_word_vocabulary_path_is_unchanged(tmp_path):
    package = load_tokenizer({"kind": "words", "path": ""})
    texts = ["a photo of the digit seven", "a plot of the number three and more words here"]
    np.testing.assert_array_equal(package.encode(texts, 12),
                                  captions.tokenize(texts, 12, truncate=True))
    assert package.vocab_size == len(captions.vocabulary())
    assert package.decode(package.encode(texts[:1], 12)) == captions.detokenize(
        captions.tokenize(texts[:1]))
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("<pad>\n<unk>\n<bos>\n<eos>\ndog\n")
    words = load_tokenizer({"kind": "words", "path": str(vocab)})
    assert words.vocab_size == 5
    np.testing.assert_array_equal(words.encode(["a dog"], 5), [[2, 1, 4, 3, 0]])
    vocab.write_text("dog\n")
    with pytest.raises(ConfigError, match="must start with <pad>"):
        load_tokenizer({"kind": "words", "path": str(vocab)})
