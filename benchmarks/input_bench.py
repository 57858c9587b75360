"""Input-pipeline throughput: examples per second of the grain training stream, per process.

    python benchmarks/input_bench.py [--batch 512] [--steps 40] [--threads 0 1 2]

For each dataset and each ``num_threads`` it builds
:func:`contrastive_jax.training.data.train_iterator`
(one process, a one-device mesh), takes one batch (start-up: opening the split, the first read),
then times ``--steps`` batches with nothing else running, so the number is the reader's own
rate. In training the reader works in grain's background threads while the step runs (JAX
releases the GIL), so only a rate below the step's own examples/s would slow training down.

Datasets are built first if needed (into ``$CONTRASTIVE_JAX_DATA_DIR`` or the default cache).
Writes ``experiments/results/input_bench.md``.
"""

from __future__ import annotations

import argparse
import pathlib
import time

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "results"
DATASETS = ("mnist1d", "digits", "digit_captions/mnist1d")


def measure(name: str, batch: int, steps: int, threads: int) -> float:
    import jax

    from contrastive_jax.mesh import make_mesh
    from contrastive_jax.training.data import default_data_config, train_iterator

    config = default_data_config()
    config.update({"name": name, "batch_size": batch, "num_threads": threads})
    stream = train_iterator(config, make_mesh({"data": 1}, jax.devices()[:1]))
    jax.block_until_ready(next(stream))
    start = time.perf_counter()
    for _ in range(steps):
        jax.block_until_ready(next(stream))
    return steps * batch / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--threads", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    from contrastive_jax.training.data import prepare

    for name in DATASETS:
        prepare(name)
    lines = ["| dataset | " + " | ".join(f"{t} threads" for t in args.threads) + " |",
             "| --- |" + " --- |" * len(args.threads)]
    for name in DATASETS:
        rates = [measure(name, args.batch, args.steps, t) for t in args.threads]
        lines.append(f"| {name} | " + " | ".join(f"{r:,.0f}" for r in rates) + " |")
        print(lines[-1], flush=True)
    table = "\n".join(lines)
    from contrastive_jax.training.run.provenance import provenance_line

    text = (f"# Input pipeline: examples/s of one process (batch {args.batch}, "
            f"{args.steps} batches, reader alone)\n\n{provenance_line()}\n\n{table}\n")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "input_bench.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
