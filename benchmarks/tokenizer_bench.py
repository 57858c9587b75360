"""Caption tokenizer throughput: texts per second of one Python thread (one CPU core).

    python benchmarks/tokenizer_bench.py [--texts 5000] [--repeats 3]

Tokenises ``--texts`` generated captions (words drawn from a fixed vocabulary of 3,000
made-up words, 6-16 words each, about 70 characters) with each caption tokenizer of
``data.preprocess.tokenizer`` that reads a file, from the test fixtures (so the numbers need no
download): ``clip_bpe`` (CLIP's byte-level BPE; the fixture's 1,891-merge file, OpenAI's has
48,894) and ``sentencepiece_open_clip`` (SigLIP's SentencePiece as open_clip applies it; the
fixture's 2,000-piece model, c4_en has 32,000). Two numbers each: the first pass over the
texts (the tokenizer's per-word cache empty at the start) and the best of ``--repeats`` later
passes (every word seen: a long run's steady state). Writes
``experiments/results/tokenizer_bench.md``.
"""

from __future__ import annotations

import argparse
import pathlib
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
FIXTURES = ROOT / "tests" / "fixtures"
TOKENIZERS = {
    "clip_bpe": ({"kind": "clip_bpe", "path": str(FIXTURES / "clip_bpe_merges.txt.gz")}, 77),
    "sentencepiece_open_clip": ({"kind": "sentencepiece_open_clip",
                                 "path": str(FIXTURES / "siglip_spm.model")}, 64),
}


def captions(count: int, seed: int = 0) -> list[str]:
    """``count`` captions of 6-16 words from 3,000 made-up words of 2-9 letters."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = ["".join(rng.choice(letters, rng.integers(2, 10))) for _ in range(3000)]
    return [" ".join(rng.choice(words, rng.integers(6, 17))).capitalize() + "."
            for _ in range(count)]


def rate(tokenizer, texts: list[str], length: int) -> float:
    start = time.perf_counter()
    tokenizer.encode(texts, length)
    return len(texts) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from contrastive_jax.training.data.text.text_tokenizers import load_tokenizer
    from contrastive_jax.training.run.provenance import provenance_line

    texts = captions(args.texts)
    mean_chars = sum(map(len, texts)) / len(texts)
    lines = ["| tokenizer | context | first pass (texts/s) | later passes (texts/s) |",
             "| --- | --- | --- | --- |"]
    for name, (spec, length) in TOKENIZERS.items():
        tokenizer = load_tokenizer(spec)
        first = rate(tokenizer, texts, length)
        later = max(rate(tokenizer, texts, length) for _ in range(args.repeats))
        lines.append(f"| {name} | {length} | {first:,.0f} | {later:,.0f} |")
        print(lines[-1], flush=True)
    text = (f"# Caption tokenizers: texts/s of one thread ({args.texts:,} captions of "
            f"{mean_chars:.0f} characters on average)\n\n{provenance_line()}\n\n"
            + "\n".join(lines) + "\n")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "tokenizer_bench.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
