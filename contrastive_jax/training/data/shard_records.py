"""One input shard (a webdataset tar or a parquet file) -> one array_record shard of a converted
dataset, and the output folder's files (local or ``gs://``): what
:mod:`~contrastive_jax.training.data.convert_shards` runs in its worker processes.

The dataset's features are ``coco_captions``' (``image`` as encoded bytes, ``captions/text``)
plus the example's key and metadata (:func:`features`); an image is checked to decode and
re-encoded only where it must be (:func:`clean_image`); a shard's members that cannot be
trained on are counted by reason in its report (:func:`convert_one`). References:
docs/data.md, "Your own image-text shards".
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import tarfile
from collections import Counter

from contrastive_jax.errors import ContrastiveJaxError
from contrastive_jax.training.data.shard_readers import (
    missing_part,
    parquet_examples,
    tar_examples,
)


def features():
    """The dataset's features: ``coco_captions``' ``image`` and ``captions/text``, the key and
    the metadata."""
    import tensorflow_datasets as tfds

    return tfds.features.FeaturesDict({
        "image": tfds.features.Image(shape=(None, None, 3)),
        "image/filename": tfds.features.Text(),
        "captions": tfds.features.Sequence({"text": tfds.features.Text()}),
        "metadata": tfds.features.Text(),
    })


def clean_image(data: bytes, max_side: int | None) -> bytes:
    """The image's bytes, verified to decode; re-encoded (RGB; JPEG, or PNG for a PNG) when it
    is not RGB or its longer side exceeds ``max_side``. Raises on an undecodable image."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        image.load()  # a truncated or corrupt file fails here, not at training time
        resize = max_side is not None and max(image.size) > max_side
        if image.mode == "RGB" and not resize:
            return data
        source_format = image.format
        out = image.convert("RGB")
    if resize:
        scale = max_side / max(out.size)
        out = out.resize((max(1, round(out.width * scale)), max(1, round(out.height * scale))),
                         Image.BICUBIC)
    buffer = io.BytesIO()
    if source_format == "PNG" and not resize:
        out.save(buffer, format="PNG")
    else:
        out.save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()


@dataclasses.dataclass(frozen=True)
class Job:
    """One input shard to convert into one output shard."""

    index: int
    source: str
    target: str  # the output shard's path (local or gs://)
    report: str  # written once the shard is complete
    staging: str | None  # a local folder to write the shard in, then upload it to target
    max_side: int | None
    image_column: str
    caption_column: str
    key_column: str


def convert_one(job: Job) -> dict:
    """Convert one input shard into one array_record file; its report (counts by reason)."""
    from array_record.python.array_record_module import ArrayRecordWriter
    from tensorflow_datasets.core import example_serializer

    feature = features()
    serializer = example_serializer.ExampleSerializer(feature.get_serialized_info())
    skipped: Counter = Counter()
    good = 0
    shard = os.path.basename(job.source)
    partial = (os.path.join(job.staging, os.path.basename(job.target)) if job.staging
               else job.target) + ".incomplete"
    error = None
    writer = ArrayRecordWriter(partial, "group_size:1")
    try:
        if job.source.endswith(".parquet"):
            examples = parquet_examples(job.source, job.image_column, job.caption_column,
                                        job.key_column)
        else:
            examples = tar_examples(job.source, skipped)
        for example in examples:
            problem = missing_part(example)
            if problem is not None:
                skipped[problem] += 1
                continue
            caption = example.caption.strip()
            try:
                image = clean_image(example.image, job.max_side)
            except Exception:  # PIL raises many types for bad bytes: all mean undecodable
                skipped["image undecodable"] += 1
                continue
            proto = serializer.get_tf_example(feature.encode_example({
                "image": image, "image/filename": f"{shard}/{example.key}",
                "captions": {"text": [caption]}, "metadata": example.metadata}))
            # deterministic: the proto's feature map in a fixed order (else it follows the
            # process's string hashing, and each run writes other bytes)
            writer.write(proto.SerializeToString(deterministic=True))
            good += 1
    except ContrastiveJaxError:
        raise
    except (OSError, tarfile.TarError, ValueError) as err:  # the shard cannot be read at all
        error = f"{type(err).__name__}: {err}"
    finally:
        writer.close()
    if error is not None:  # nothing kept from an unreadable shard: an empty output shard
        ArrayRecordWriter(partial, "group_size:1").close()
        good = 0
    report = {"input": job.source, "examples": good, "skipped": dict(sorted(skipped.items())),
              "error": error, "bytes": os.path.getsize(partial)}
    if job.staging:  # one upload of the complete file: the object appears whole or not at all
        fs, inner = file_system(job.target)
        fs.put_file(partial, inner)
        os.remove(partial)
    else:
        os.replace(partial, job.target)
    write_report(job.report, report)
    return report


def file_system(path: str):
    """The fsspec file system of ``path`` (gcsfs for ``gs://``) and the path in it, its cached
    listings dropped: other processes (the workers, the other parts) write the same folders."""
    import fsspec

    fs, inner = fsspec.core.url_to_fs(path)
    fs.invalidate_cache()
    return fs, inner


def folder_names(folder: str) -> set[str]:
    """The names in ``folder`` (none if it is not there), listed afresh."""
    fs, inner = file_system(folder)
    try:
        return {path.rstrip("/").rpartition("/")[2] for path in fs.ls(inner, detail=False)}
    except FileNotFoundError:
        return set()


def read_report(path: str):
    """The JSON in ``path`` (local or ``gs://``), read afresh."""
    fs, inner = file_system(path)
    return json.loads(fs.cat_file(inner))


def write_report(path: str, data) -> None:
    """``data`` into ``path``, whole or not at all: an object is uploaded in one request, a
    local file written aside and renamed."""
    fs, inner = file_system(path)
    partial = inner if "://" in path else inner + ".incomplete"
    fs.pipe_file(partial, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())
    if partial != inner:
        os.replace(partial, inner)
