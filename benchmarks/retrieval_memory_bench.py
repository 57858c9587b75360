"""Retrieval evaluation at benchmark scale: peak memory and time of ``caption_retrieval_recall``.

    python benchmarks/retrieval_memory_bench.py [--images 20000] [--captions 100000] [--dim 512]

Random unit features (float32) for ``--images`` images and ``--captions`` captions (caption
``t`` describes image ``t % images``: 5 per image at the defaults, COCO's layout), then
Recall@1/5/10 both ways with the evaluation command's default chunking (``SCORE_BUDGET`` scores
per chunk) and with a smaller and a larger budget. The whole score matrix at the defaults would
be 20,000 x 100,000 float32 = 7.5 GiB, computed twice (both directions); the chunked passes
hold one ``(chunk, n_candidates)`` block at a time. Peak memory is the process's peak resident
set (``ru_maxrss``) above what it held before the first pass, each budget in a fresh process
(so one pass's peak does not hide the next one's). Writes
``experiments/results/retrieval_memory_bench.md``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import resource
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
MIB = 2 ** 20


def features(count: int, dim: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((count, dim), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def peak_rss() -> int:
    """The process's peak resident set in bytes (Linux reports kilobytes, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def one_pass(images: int, captions: int, dim: int, budget: int) -> dict:
    """Features, then one timed recall: the numbers of one budget (run in a child process)."""
    import jax

    from contrastive_jax.training.evaluation.retrieval import caption_retrieval_recall

    image_features, text_features = features(images, dim, 0), features(captions, dim, 1)
    owner = np.arange(captions) % images
    caption_retrieval_recall(image_features[:64], text_features[:320], owner[:320] % 64,
                             score_budget=budget)  # compile and warm the allocator
    jax.effects_barrier()
    before = peak_rss()
    start = time.perf_counter()
    recall = caption_retrieval_recall(image_features, text_features, owner, score_budget=budget)
    seconds = time.perf_counter() - start
    return {"budget": budget, "seconds": seconds, "peak_above_inputs": peak_rss() - before,
            "inputs": image_features.nbytes + text_features.nbytes, "recall": recall,
            "device": jax.devices()[0].device_kind}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20000)
    parser.add_argument("--captions", type=int, default=100000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one_pass(args.images, args.captions, args.dim, args.one)))
        return
    from contrastive_jax.training.evaluation.retrieval import SCORE_BUDGET
    from contrastive_jax.training.run.provenance import provenance_line

    rows = []
    for budget in (SCORE_BUDGET // 4, SCORE_BUDGET, SCORE_BUDGET * 4):
        out = subprocess.run([sys.executable, __file__, f"--images={args.images}",
                              f"--captions={args.captions}", f"--dim={args.dim}",
                              f"--one={budget}"], check=True, capture_output=True, text=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    whole = args.images * args.captions * 4
    lines = [
        f"Retrieval of {args.captions:,} captions x {args.images:,} images, d={args.dim}, "
        f"random float32 features ({rows[0]['inputs'] / MIB:,.0f} MiB of inputs), on "
        f"{rows[0]['device']}; one score matrix whole would be {whole / MIB:,.0f} MiB.", "",
        "| scores per chunk | chunk MiB | time (s) | peak RSS above inputs (MiB) | mean R@1 |",
        "| --- | --- | --- | --- | --- |"]
    for row in rows:
        lines.append(f"| {row['budget']:,} | {row['budget'] * 4 / MIB:,.0f} | "
                     f"{row['seconds']:.1f} | {row['peak_above_inputs'] / MIB:,.0f} | "
                     f"{row['recall']['mean_r1']:.5f} |")
    lines += ["", provenance_line()]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "retrieval_memory_bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
