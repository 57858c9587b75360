"""Build a SentencePiece tokenizer from a prepared dataset's captions, offline.

    python -m contrastive_jax.training.data.build_tokenizer --dataset=coco_captions \\
        --data_dir=DIR --split=train --vocab_size=32000 --output=coco_sp32k.model

Reads every caption (``--caption_key``, a ``/``-separated path into the example: a text or a
list of texts; ``captions/text`` for ``coco_captions``) of every example of ``--split`` from
the array_record files in ``--data_dir`` (images are not decoded), and trains a SentencePiece
model (``--model_type``: ``unigram`` by default, or ``bpe``) with ``<pad>`` = 0, ``<unk>`` = 1,
``<bos>`` = 2, ``<eos>`` = 3, full character coverage and one thread (the same captions give
the same model). ``--vocab_size`` is an upper bound: a small corpus that cannot fill it gets
the vocabulary it supports (the printed size). The model file is written through
``etils.epath`` (``gs://`` works); point ``data.preprocess.tokenizer`` at it:
``{"kind": "sentencepiece", "path": OUTPUT}`` and set ``model.text_encoder.vocab_size`` to at
least the printed vocabulary size.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterable, Iterator, Sequence

import tensorflow_datasets as tfds
from absl import flags
from etils import epath

from contrastive_jax import command_line
from contrastive_jax.errors import ConfigError
from contrastive_jax.training.data.prepare import resolve_data_dir
from contrastive_jax.training.data.sources import open_split
from contrastive_jax.training.data.text.text_tokenizers import SentencePieceTokenizer

SPECIAL_IDS = {"pad_id": 0, "unk_id": 1, "bos_id": 2, "eos_id": 3}


def texts_at(example: dict, caption_key: str) -> list[str]:
    """The texts at ``caption_key`` (``"captions/text"``) of one example, decoded to str."""
    value = example
    for key in caption_key.split("/"):
        if not isinstance(value, dict) or key not in value:
            have = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise ConfigError(f"caption key {caption_key!r}: no {key!r} in the example (it has "
                              f"{have}); change --caption_key / data.preprocess.caption_key")
        value = value[key]
    texts = [value] if isinstance(value, str | bytes) else list(value)
    return [t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in texts]


def dataset_captions(name: str, split: str, data_dir: str | None,
                     caption_key: str = "captions/text") -> Iterator[str]:
    """Every caption of every example of ``name[split]``, in the split's order."""
    source = open_split(name, split, data_dir)
    images = [key for key, feature in source.dataset_info.features.items()
              if isinstance(feature, tfds.features.Image)]
    source = open_split(name, split, data_dir,
                        decoders={key: tfds.decode.SkipDecoding() for key in images})
    for i in range(len(source)):
        yield from texts_at(source[i], caption_key)


def train_sentencepiece(texts: Iterable[str], vocab_size: int,
                        model_type: str = "unigram") -> bytes:
    """A SentencePiece model (serialized proto) trained on ``texts``, ids as SPECIAL_IDS."""
    import sentencepiece

    if vocab_size < len(SPECIAL_IDS) + 1:
        raise ConfigError(f"vocab_size must be > {len(SPECIAL_IDS)}; got {vocab_size}")
    if model_type not in ("unigram", "bpe"):
        raise ConfigError(f"model_type must be 'unigram' or 'bpe'; got {model_type!r}")
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise ConfigError("no captions to build a tokenizer from")
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=model, vocab_size=vocab_size,
        model_type=model_type, hard_vocab_limit=False, character_coverage=1.0,
        num_threads=1, minloglevel=2, **SPECIAL_IDS)
    return model.getvalue()


FLAGS = flags.FlagValues()  # this command's own (contrastive_jax.command_line)
_DATASET = flags.DEFINE_string("dataset", None, "TFDS name, e.g. coco_captions",
                               flag_values=FLAGS)
_DATA_DIR = flags.DEFINE_string("data_dir", None, "TFDS data dir (array_record)",
                                flag_values=FLAGS)
_SPLIT = flags.DEFINE_string("split", "train", "split expression, e.g. train", flag_values=FLAGS)
_CAPTION_KEY = flags.DEFINE_string("caption_key", "captions/text",
                                   "/-separated path of the captions in an example",
                                   flag_values=FLAGS)
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 32000, "the vocabulary's upper bound",
                                   flag_values=FLAGS)
_MODEL_TYPE = flags.DEFINE_enum("model_type", "unigram", ["unigram", "bpe"],
                                "SentencePiece's model type", flag_values=FLAGS)
_OUTPUT = flags.DEFINE_string("output", None, "the .model file to write", flag_values=FLAGS)
COMMAND = command_line.Command(
    program="python -m contrastive_jax.training.data.build_tokenizer", doc=__doc__,
    flag_values=FLAGS, required=("dataset", "output"))


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (module docstring; ``argv``: its arguments, ``sys.argv[1:]`` when
    None): 0 on success, 2 with one line ``error: ...`` on a user error
    (:func:`contrastive_jax.command_line.run_command`)."""
    return command_line.run_command(COMMAND, _build, argv)


def _build(positional: list[str]) -> None:
    """Train the tokenizer on ``--dataset``'s captions, write ``--output``, print its size."""
    data_dir = resolve_data_dir(_DATA_DIR.value)
    texts = list(dataset_captions(_DATASET.value, _SPLIT.value, data_dir, _CAPTION_KEY.value))
    model = train_sentencepiece(texts, _VOCAB_SIZE.value, _MODEL_TYPE.value)
    output = epath.Path(_OUTPUT.value)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_bytes(model)
    size = SentencePieceTokenizer(model).vocab_size
    print(f"{_OUTPUT.value}: SentencePiece {_MODEL_TYPE.value}, vocabulary {size} (0 = <pad>), "
          f"from {len(texts)} captions of {_DATASET.value}[{_SPLIT.value}]; set "
          f"data.preprocess.tokenizer.path to it and model.text_encoder.vocab_size >= {size}")


if __name__ == "__main__":
    sys.exit(main())
