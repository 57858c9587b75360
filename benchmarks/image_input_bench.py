"""Image input benchmark: 224 x 224 training batches from JPEG shards, per host core.

    python benchmarks/image_input_bench.py [--images 384] [--batch 64] [--batches 4]

The script writes ``--images`` JPEGs of realistic size and entropy (640 x 480, quality 90,
100-200 KB each: a smooth random field plus edges and fine texture, not flat colour) as
img2dataset-style tar shards, converts them with
``python -m contrastive_jax.training.data.convert_shards`` (into ``--data_dir``, default a
temporary folder; an existing conversion there is reused), and reads them as the trainer's
training stream does (:func:`contrastive_jax.training.data.train_dataset`, one process, the
pod template's preprocessing at 224: random resized crop, bicubic, tokenised captions), then
puts each batch on one JAX device.

Rows, one pipeline each, measured one after another in this process with nothing else running
(the worker processes are its children):

- **previous pipeline** (the baseline): what the trainer did before this benchmark existed,
  written out here: TFDS decodes the full JPEG, PIL resizes it bilinearly and centre-crops,
  float32 ``x / 255`` on the host and to the device; grain threads (1, and the pod template's
  16);
- **uint8, full decode** / **uint8, reduced decode**: the current preprocessing in grain
  threads, uint8 to the device, with ``reduced_decode`` off / on (PIL's ``draft``: the JPEG
  decoded at 1/2, 1/4 or 1/8 size where the crop keeps >= 224 pixels);
- **N worker processes**: the same with ``data.worker_count = N``.

Columns: images/s (wall clock over ``--batches`` batches, after a warm-up that is not timed:
the first batch, which opens the split and starts the workers, then ``2 x prefetch + workers``
more, so that nothing read ahead during the warm-up counts); CPU seconds of the process and
its workers over the same batches (``/proc``), so *images/s per core* = images per CPU-second,
which is the number that scales to a host's core count; host-to-device bytes per image; and
the time of the ``device_put`` of one batch (float32 or uint8) alone.

**Host cores per chip.** The pod template's train step costs ``3 x F`` FLOPs per image-text
pair, ``F`` the forward FLOPs of the two towers per pair counted from their shapes (the ViT-B/16
image tower at 224 and the text tower at 32 tokens: the matmuls of the patch embedding, each
block's QKV, output, MLP and attention; 2 FLOPs a multiply-add). At a model-FLOPs utilisation
``U`` (stated in the table) a chip with peak ``P`` FLOP/s trains ``U P / (3 F)`` pairs/s; the
cores that takes = that rate / the pipeline's images per CPU-second. Peaks (bf16): TPU v4
275 TFLOP/s, TPU v5e 197 TFLOP/s per chip.

Writes ``experiments/results/image_input_bench.md`` (headed by the provenance line: date,
commit, versions, devices; then the command).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pathlib
import subprocess
import sys
import tarfile
import tempfile
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "experiments" / "results"
SIZE = 224
TOKENS = 32
PEAK_FLOPS = {"TPU v4": 275e12, "TPU v5e": 197e12}
UTILISATION = 0.5


# -------------------------------------------------------------------------------------------
# The data


def realistic_jpeg(rng: np.random.Generator, width: int = 640, height: int = 480,
                   quality: int = 90) -> bytes:
    """A photo-like JPEG: a smooth random colour field (bicubic from 6 x 8), soft-edged
    rectangles, and fine grain (the texture that makes a photo 100-200 KB at quality 90)."""
    from PIL import Image, ImageDraw, ImageFilter

    field = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize(
        (width, height), Image.BICUBIC)
    draw = ImageDraw.Draw(field)
    for _ in range(12):
        x0, y0 = rng.integers(0, width), rng.integers(0, height)
        x1, y1 = x0 + rng.integers(20, 200), y0 + rng.integers(20, 200)
        draw.rectangle((x0, y0, x1, y1), fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
    field = field.filter(ImageFilter.GaussianBlur(1.2))
    grain = rng.normal(0, 9, (height, width, 1)) + rng.normal(0, 4, (height, width, 3))
    pixels = np.clip(np.asarray(field, np.float64) + grain, 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def write_shards(folder: pathlib.Path, images: int, per_shard: int = 128) -> tuple[list, list]:
    """img2dataset-style tars of ``images`` JPEGs and captions; the tar paths and JPEG sizes."""
    rng = np.random.default_rng(0)
    words = ["a", "photo", "of", "the", "red", "blue", "dog", "cat", "street", "on", "beach"]
    paths, sizes = [], []
    for start in range(0, images, per_shard):
        path = folder / f"{start // per_shard:05d}.tar"
        with tarfile.open(path, "w") as tar:
            for i in range(start, min(start + per_shard, images)):
                data = realistic_jpeg(rng)
                sizes.append(len(data))
                caption = " ".join(rng.choice(words, 8)).encode()
                for name, payload in ((f"{i:09d}.jpg", data), (f"{i:09d}.txt", caption)):
                    info = tarfile.TarInfo(name)
                    info.size, info.mtime = len(payload), 0
                    tar.addfile(info, io.BytesIO(payload))
        paths.append(path)
    return paths, sizes


def prepared(data_dir: pathlib.Path, images: int) -> tuple[str, dict]:
    """The converted dataset's name, and facts about its JPEGs (written once per data_dir)."""
    name = f"bench_jpeg_{images}"
    facts_path = data_dir / f"{name}.json"
    if facts_path.exists():
        return name, json.loads(facts_path.read_text())
    shards = data_dir / f"{name}_shards"
    shards.mkdir(parents=True, exist_ok=True)
    paths, sizes = write_shards(shards, images)
    command = [sys.executable, "-m", "contrastive_jax.training.data.convert_shards",
               f"--name={name}", f"--data_dir={data_dir}", "--overwrite",
               *(f"--input={p}" for p in paths)]
    subprocess.run(command, check=True, cwd=REPO)
    facts = {"images": images, "kb_min": min(sizes) / 1e3, "kb_median": float(
        np.median(sizes)) / 1e3, "kb_max": max(sizes) / 1e3}
    facts_path.write_text(json.dumps(facts))
    return name, facts


# -------------------------------------------------------------------------------------------
# The pipelines


def previous_preprocess(tokens_of):
    """The trainer's image_text preprocessing before this benchmark: a decoded (H, W, 3) uint8
    image, bilinear resize of the shorter side, centre crop, float32 ``/ 255``."""
    from PIL import Image

    def preprocess(example, epoch: int = 0, position: int = 0):
        image = np.asarray(example["image"])
        h, w = image.shape[:2]
        scale = SIZE / min(h, w)
        size = (max(SIZE, round(w * scale)), max(SIZE, round(h * scale)))
        resized = np.asarray(Image.fromarray(image).resize(size, Image.BILINEAR))
        top, left = (size[1] - SIZE) // 2, (size[0] - SIZE) // 2
        crop = resized[top:top + SIZE, left:left + SIZE]
        text = example["captions"]["text"]
        text = text[epoch % len(text)]
        return {"image": crop.astype(np.float32) / np.float32(255.0),
                "caption": tokens_of.encode([text], TOKENS)[0]}

    return preprocess


def current_preprocess(reduced: bool):
    from contrastive_jax.training.data.example_preprocessing import image_text_preprocess

    return image_text_preprocess(image_size=SIZE, max_tokens=TOKENS, resize="bicubic",
                                 crop="random", crop_scale=(0.9, 1.0), reduced_decode=reduced,
                                 training=True)


def _cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and of its live descendants (``/proc``)."""
    ticks = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = pathlib.Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
    total, stack = 0.0, [pid]
    while stack:
        p = stack.pop()
        try:
            fields = pathlib.Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
        stack += children.get(p, [])
    return total


PREFETCH = 4  # batches read ahead (the pod template's data.prefetch)


def measure(source, preprocess, *, batch: int, batches: int, threads: int,
            workers: int) -> dict:
    import grain
    import jax

    from contrastive_jax.training.data.pipeline import HostShard, train_dataset

    ds = train_dataset(source, global_batch_size=batch, seed=0, shard=HostShard(0, 1),
                       preprocess=preprocess, worker_count=workers,
                       read_options=grain.ReadOptions(num_threads=threads,
                                                      prefetch_buffer_size=PREFETCH))
    device = jax.devices()[0]
    iterator = iter(ds)
    first = next(iterator)
    # drain what was read ahead while the first batch (and the workers' start) was awaited
    for _ in range(2 * PREFETCH + workers):
        jax.block_until_ready(jax.device_put(next(iterator)["image"], device))
    cpu0, wall0 = _cpu_seconds(os.getpid()), time.perf_counter()
    for _ in range(batches):
        images = next(iterator)["image"]
        jax.block_until_ready(jax.device_put(images, device))
    wall, cpu = time.perf_counter() - wall0, _cpu_seconds(os.getpid()) - cpu0
    if hasattr(iterator, "close"):
        iterator.close()
    put = []
    for _ in range(5):
        start = time.perf_counter()
        jax.block_until_ready(jax.device_put(first["image"], device))
        put.append(time.perf_counter() - start)
    n = batch * batches
    return {"images_per_s": n / wall, "cpu_s": cpu, "images_per_cpu_s": n / cpu,
            "bytes_per_image": first["image"][0].nbytes, "put_ms": 1e3 * float(np.median(put)),
            "dtype": str(first["image"].dtype)}


# -------------------------------------------------------------------------------------------
# FLOPs of the pod template's step


def tower_flops(width: int, depth: int, tokens: int, mlp_ratio: int = 4) -> float:
    """Forward FLOPs of a Transformer tower: per block QKV + output (4 w^2), MLP
    (2 r w^2) per token, and attention's two t x t x w products; 2 FLOPs a multiply-add."""
    per_token = (4 + 2 * mlp_ratio) * width * width
    return 2.0 * depth * (tokens * per_token + 2 * tokens * tokens * width)


def template_flops_per_pair() -> tuple[float, str]:
    """``3 F`` of the pod template (configs/clip_vit_b16_pod.py) from its model block."""
    sys.path.insert(0, str(REPO))
    import importlib.util

    spec = importlib.util.spec_from_file_location("pod", REPO / "configs" / "clip_vit_b16_pod.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.get_config().model
    image, text = model.sample_encoder, model.text_encoder
    patches = (image.image_size // image.patch) ** 2
    patch_embed = 2.0 * patches * image.patch * image.patch * image.in_channels * image.width
    forward = (patch_embed + tower_flops(image.width, image.depth, patches + 1, image.mlp_ratio)
               + tower_flops(text.width, text.depth, text.max_tokens, text.mlp_ratio))
    what = (f"ViT-B/{image.patch} at {image.image_size} ({patches + 1} tokens) + text "
            f"{text.width}x{text.depth} at {text.max_tokens} tokens")
    return 3.0 * forward, what


# -------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=384)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batches", type=int, default=8, help="timed batches per row")
    parser.add_argument("--data_dir", default="", help="where the JPEG dataset is converted")
    parser.add_argument("--output", default=str(RESULTS / "image_input_bench.md"))
    args = parser.parse_args()
    from absl import flags

    flags.FLAGS.mark_as_parsed()

    from contrastive_jax.training.data.sources import open_split
    from contrastive_jax.training.data.text.text_tokenizers import load_tokenizer

    data_dir = pathlib.Path(args.data_dir or tempfile.mkdtemp(prefix="image_input_bench_"))
    name, facts = prepared(data_dir, args.images)
    decoded = open_split(name, "train", str(data_dir))
    encoded = open_split(name, "train", str(data_dir), encoded_images=("image",))
    tokens_of = load_tokenizer({"kind": "words", "path": ""})
    common = {"batch": args.batch, "batches": args.batches}
    rows = [
        ("previous pipeline, 1 thread", decoded, previous_preprocess(tokens_of), 1, 0),
        ("previous pipeline, 16 threads", decoded, previous_preprocess(tokens_of), 16, 0),
        ("uint8, full decode, 1 thread", encoded, current_preprocess(False), 1, 0),
        ("uint8, reduced decode, 1 thread", encoded, current_preprocess(True), 1, 0),
        ("uint8, reduced decode, 16 threads", encoded, current_preprocess(True), 16, 0),
        ("uint8, reduced decode, 1 worker process", encoded, current_preprocess(True), 1, 1),
        ("uint8, reduced decode, 2 worker processes", encoded, current_preprocess(True), 1, 2),
    ]
    results = []
    for label, source, preprocess, threads, workers in rows:
        result = measure(source, preprocess, threads=threads, workers=workers, **common)
        results.append((label, result))
        print(f"{label}: {result['images_per_s']:.1f} images/s, "
              f"{result['images_per_cpu_s']:.1f} per CPU-second", flush=True)

    flops, what = template_flops_per_pair()
    baseline = max(r["images_per_s"] for label, r in results if label.startswith("previous"))
    best_label, best = max(results, key=lambda lr: lr[1]["images_per_s"])
    per_core = max(r["images_per_cpu_s"] for label, r in results if "reduced" in label)
    cores = os.cpu_count()
    from contrastive_jax.training.run.provenance import provenance_line

    lines = [
        f"# Image input: {SIZE} x {SIZE} training batches from JPEG shards",
        "",
        provenance_line(),  # date, commit, versions, devices
        "",
        f"`python benchmarks/{pathlib.Path(__file__).name} --images {args.images} --batch "
        f"{args.batch} --batches {args.batches}`: {cores} cores; one process, nothing else "
        "running.",
        "",
        f"{facts['images']} JPEGs, 640 x 480, quality 90, {facts['kb_min']:.0f}-"
        f"{facts['kb_max']:.0f} KB (median {facts['kb_median']:.0f} KB), converted by "
        "`convert_shards`; batch "
        f"{args.batch}, prefetch {PREFETCH}, {args.batches} timed batches per row after the "
        "warm-up (the stream repeats the images).",
        "",
        "| pipeline | to device | images/s | vs previous | CPU s | images/s per core | "
        "bytes/image to device | device_put of a batch (ms) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, r in results:
        lines.append(
            f"| {label} | {r['dtype']} | {r['images_per_s']:.1f} | "
            f"{r['images_per_s'] / baseline:.2f}x | {r['cpu_s']:.1f} | "
            f"{r['images_per_cpu_s']:.1f} | {r['bytes_per_image']:,} | {r['put_ms']:.2f} |")
    lines += [
        "",
        f"Fastest: **{best_label}**, {best['images_per_s']:.1f} images/s = "
        f"{best['images_per_s'] / baseline:.2f}x the previous pipeline's best "
        f"({baseline:.1f}).",
        "",
        "## Host cores one chip needs (pod template, configs/clip_vit_b16_pod.py)",
        "",
        f"Train step: 3 x forward = {flops / 1e9:.1f} GFLOP per image-text pair ({what}). "
        f"At a stated model-FLOPs utilisation of {UTILISATION:.0%}, with this machine's best "
        f"images per CPU-second of the current pipeline ({per_core:.1f}, reduced decode):",
        "",
        "| chip | peak bf16 TFLOP/s | pairs/s per chip | host cores per chip |",
        "| --- | --- | --- | --- |",
    ]
    for chip, peak in PEAK_FLOPS.items():
        rate = UTILISATION * peak / flops
        lines.append(f"| {chip} | {peak / 1e12:.0f} | {rate:,.0f} | {rate / per_core:.1f} |")
    lines += [
        "",
        "A TPU v4 host drives 4 chips, a v5e host (v5litepod-8 / -4 slices) 8 or 4; multiply. "
        "Cores of another CPU scale by its single-core speed against this machine's.",
    ]
    out = pathlib.Path(args.output)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
