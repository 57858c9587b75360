"""Image-text shards (webdataset tars, parquet) -> a prepared TFDS dataset, offline.

CLIP-scale data comes as webdataset tar shards written by img2dataset (``00000.tar`` holding
``KEY.jpg``, ``KEY.txt`` and optionally ``KEY.json`` per example) or as parquet files with an
image-bytes column and a caption column. This command turns them into a folder that
:func:`~contrastive_jax.training.data.sources.open_split` and ``tfds.builder_from_directory``
read like any prepared dataset (``dataset_info.json``, ``features.json``, array_record
shards), with the features of ``coco_captions`` that the ``image_text`` preprocessing reads:
``image`` (the encoded bytes, decoded at read time), ``captions/text`` (one caption), plus
``image/filename`` (the example's key, ``SHARD/KEY``) and ``metadata`` (the ``.json`` member as
text, or ``""``)::

    python -m contrastive_jax.training.data.convert_shards \\
        --input='gs://bucket/cc12m/{00000..00099}.tar' --name=cc12m --data_dir=DATA_DIR \\
        [--split=train] [--max_side=512] [--workers=8] [--overwrite] \\
        [--num_parts=N --part=I | --finalize] [--staging_dir=LOCAL_DIR]

Then train with ``--config.data.name=cc12m --config.data.data_dir=DATA_DIR``.

- **Inputs**: local paths, globs (``*``, ``?``, ``[...]``), brace lists and ranges
  (``{a,b}``, ``{00000..00099}``, zero padding kept) and ``gs://`` (through ``etils.epath``);
  ``--input`` may be given several times. ``.tar`` (optionally ``.tar.gz``) files are read as
  webdataset shards: members grouped by key (the path up to the first ``.`` of the file name),
  images ``jpg``/``jpeg``/``png``/``webp``, caption ``txt``. ``.parquet`` files: the image
  bytes in ``--image_column`` (default ``jpg``; a struct with a ``bytes`` field, as Hugging
  Face writes images, works too), the caption in ``--caption_column`` (default ``caption``),
  the key in ``--key_column`` if present (else the row number).
- **One output shard per input shard**, written by ``--workers`` processes (default: the
  cores), in input order, so the same inputs give byte-identical output whatever the workers.
- **Resumable**: each output shard is written to a temporary file and renamed, then its
  report (in ``1.0.0/.convert_shards/``); killed at any moment and run again, the command redoes
  only the shards without both, and ends with every example exactly once. ``dataset_info.json``
  is written last, so a half-converted folder is never read as a dataset. A local folder is
  locked: a second converter on it stops (a bucket takes no lock: run one converter per part).
- ``--data_dir gs://bucket/tfds``: each shard is written locally (in a temporary folder, or in
  ``--staging_dir``), uploaded under its final name in one upload once complete (the bucket
  never holds a half shard), deleted, then its report is written to the bucket.
- **Split over machines**: ``--num_parts=N --part=I`` (``0 <= I < N``, the same ``N`` for every
  part) converts the input shards ``i`` with ``i % N == I`` of the list the same ``--input``
  gives every machine (the output names, ``NAME-SPLIT.array_record-{i:05d}-of-{count:05d}``,
  are global), without the metadata. Then the same command with ``--finalize`` in place of
  ``--num_parts``/``--part`` checks that every shard is there (else exit 2, naming the missing
  shards and their parts) and writes the report and metadata: the folder is then byte for byte
  the one-machine conversion.
- **Bad members are skipped and counted by reason** (``image undecodable``, ``no image``,
  ``no caption``, ``empty caption``, ``truncated shard``: the examples before the cut are
  kept), never a crash; a shard that cannot be read at all (not a tar or parquet file, missing)
  is named. The counts, per shard and in total, are in ``conversion_report.json`` beside the
  data, and the command prints them.
- ``--max_side``: images whose longer side is larger are resized (bicubic) to that side and
  re-encoded as JPEG (quality 95), to bound storage; images that are not RGB (grayscale,
  palette, RGBA, CMYK) are converted to RGB and re-encoded (PNG stays PNG). Other images are
  stored as the bytes they came in.

References: docs/data.md, "Your own image-text shards".
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import functools
import multiprocessing
import os
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence

from absl import flags
from etils import epath

from contrastive_jax import command_line
from contrastive_jax.errors import ConfigError
from contrastive_jax.interrupts import die_with_parent
from contrastive_jax.training.data.shard_readers import input_files
from contrastive_jax.training.data.shard_records import (
    Job,
    convert_one,
    features,
    file_system,
    folder_names,
    read_report,
    write_report,
)

VERSION = "1.0.0"
WORK_DIR = ".convert_shards"  # inside the version folder: reports of finished shards
REPORT = "conversion_report.json"
@contextlib.contextmanager
def _exclusive(work: str, part: int | None) -> Iterator[None]:
    """One converter per local output folder, or per part of it (the parts share the folder's
    lock, each holds its own): advisory locks, released when the process ends in any way."""
    locks = [("lock", fcntl.LOCK_EX)] if part is None else [("lock", fcntl.LOCK_SH),
                                                              (f"lock-part-{part}", fcntl.LOCK_EX)]
    with contextlib.ExitStack() as stack:
        for name, mode in locks:
            handle = stack.enter_context(open(os.path.join(work, name), "a"))
            try:
                fcntl.flock(handle, mode | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ConfigError(f"{os.path.dirname(work)} is being written by another "
                                  "convert_shards process; wait for it or kill it") from None
        yield


def convert_dataset(inputs: Sequence[str], name: str, data_dir: str, *, split: str = "train",
            max_side: int | None = None, workers: int | None = None,
            image_column: str = "jpg", caption_column: str = "caption",
            key_column: str = "key", overwrite: bool = False, num_parts: int | None = None,
            part: int | None = None, finalize: bool = False, staging_dir: str | None = None,
            log=print) -> dict:
    """Convert ``inputs`` (patterns) into ``data_dir/name/1.0.0`` (local or ``gs://``); returns
    the report. ``num_parts`` and ``part``: only that part's shards, no metadata (returns the
    part's report); ``finalize``: no shard converted, the metadata written if every shard is."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ConfigError(f"--name {name!r}: use lower-case letters, digits and '_', starting "
                          "with a letter (a TFDS dataset name)")
    if max_side is not None and max_side < 1:
        raise ConfigError(f"--max_side must be >= 1; got {max_side}")
    _check_parts(num_parts, part, finalize, overwrite)
    remote = "://" in str(data_dir)
    if staging_dir is not None and (not remote or "://" in staging_dir):
        raise ConfigError(f"--staging_dir {staging_dir}: a local folder, for a gs:// --data_dir "
                          "only (a local --data_dir is written in place)")
    files = input_files(inputs)
    folder = str(epath.Path(data_dir) / name / VERSION)
    if overwrite and VERSION in folder_names(os.path.dirname(folder)):
        fs, inner = file_system(folder)
        fs.rm(inner, recursive=True)
    if "dataset_info.json" in folder_names(folder):
        report = read_report(f"{folder}/{REPORT}")
        if report["inputs"] != files:
            raise ConfigError(f"{folder} already holds a conversion of other inputs; pass "
                              "--overwrite to replace it, or choose another --name")
        log(f"already converted: {report['examples']:,} examples in {folder}")
        return report
    work = f"{folder}/{WORK_DIR}"
    with contextlib.ExitStack() as stack:
        if not remote:  # a bucket takes no lock: one converter per part (module docstring)
            os.makedirs(work, exist_ok=True)
            stack.enter_context(_exclusive(work, part))
        if staging_dir:
            os.makedirs(staging_dir, exist_ok=True)
        staging = stack.enter_context(tempfile.TemporaryDirectory(
            prefix="convert_shards-", dir=staging_dir)) if remote else None
        make_job = functools.partial(Job, staging=staging, max_side=max_side,
                                     image_column=image_column, caption_column=caption_column,
                                     key_column=key_column)
        return _convert_locked(files, name, folder, work, make_job, split=split,
                               max_side=max_side, workers=workers, num_parts=num_parts,
                               part=part, finalize=finalize, log=log)


def _check_parts(num_parts: int | None, part: int | None, finalize: bool,
                 overwrite: bool) -> None:
    """A ConfigError saying which flag to change for a bad combination of the split's flags."""
    n = num_parts or 0
    for bad, message in (
            (finalize and part is not None, "--finalize comes after every part: drop --part"),
            (part is not None and num_parts is None, f"--part={part} needs --num_parts=N"),
            (num_parts is not None and n < 1, f"--num_parts must be >= 1; got {n}"),
            (n >= 1 and part is None and not finalize, f"--num_parts={n} needs --part=I (0 <= I < "
             f"{n}: the part this machine converts) or --finalize"),
            (n >= 1 and part is not None and not 0 <= part < n, f"--part={part}: must be 0 to "
             f"{n - 1} (--num_parts={n})"),
            (overwrite and (part is not None or finalize), "drop --overwrite: with --part or "
             "--finalize it would delete the other parts' shards")):
        if bad:
            raise ConfigError(message)


def _convert_locked(files: list[str], name: str, folder: str, work: str, make_job, *,
                    split: str, max_side: int | None, workers: int | None,
                    num_parts: int | None, part: int | None, finalize: bool, log) -> dict:
    settings = {"inputs": files, "split": split, "max_side": max_side}
    work_names = folder_names(work)
    recorded = read_report(f"{work}/inputs.json") if "inputs.json" in work_names else {}
    parts = recorded.get("num_parts")  # recorded by the first part run
    if recorded and {**recorded, "num_parts": None} != {**settings, "num_parts": None}:
        raise ConfigError(f"{folder} holds a conversion started with other inputs or settings; "
                          "pass --overwrite to start again, or choose another --name")
    if part is not None and parts not in (None, num_parts):
        raise ConfigError(f"{folder} holds parts of a conversion split with --num_parts={parts}:"
                          " use that --num_parts (or delete the folder to start again)")
    if not finalize and (not recorded or (part is not None and parts is None)):
        write_report(f"{work}/inputs.json",
                    settings if part is None else {**settings, "num_parts": num_parts})
    count = len(files)
    template = f"{name}-{split}.array_record-{{:05d}}-of-{count:05d}"
    jobs = [make_job(i, source, f"{folder}/{template.format(i)}", f"{work}/{i:05d}.json")
            for i, source in enumerate(files)]
    names = folder_names(folder)
    mine = jobs if part is None else jobs[part::num_parts]  # the shards i % num_parts == part
    done = [job for job in mine if os.path.basename(job.target) in names
            and os.path.basename(job.report) in work_names]
    todo = [] if finalize else [job for job in mine if job not in done]
    with concurrent.futures.ThreadPoolExecutor(16) as threads:  # a bucket: requests at once
        reports = dict(zip([job.index for job in done],
                           threads.map(read_report, [job.report for job in done]), strict=True))
    if reports and not finalize:
        log(f"resuming: {len(reports)} of {len(mine)} shards already converted")
    start = time.perf_counter()
    done_examples = 0
    workers = max(1, min(workers or os.cpu_count() or 1, len(todo) or 1))
    with contextlib.ExitStack() as stack:
        if workers == 1:  # in this process: no start-up of a worker
            results = map(convert_one, todo)
        else:
            pool = stack.enter_context(concurrent.futures.ProcessPoolExecutor(
                workers, mp_context=multiprocessing.get_context("spawn"),
                initializer=die_with_parent, initargs=(os.getpid(),)))
            results = pool.map(convert_one, todo)
        for job, report in zip(todo, results, strict=True):
            reports[job.index] = report
            done_examples += report["examples"]
            elapsed = time.perf_counter() - start
            rate = done_examples / elapsed if elapsed > 0 else 0.0
            left = elapsed / max(1, len(reports) - len(done)) * (len(mine) - len(reports))
            log(f"shards {len(reports)}/{len(mine)} | {done_examples:,} examples | "
                f"{rate:,.0f} ex/s | ETA {time.strftime('%H:%M:%S', time.gmtime(left))}")
    ordered = [reports[job.index] for job in mine if job.index in reports]
    if part is not None:
        examples = sum(r["examples"] for r in ordered)
        log(f"part {part} of {num_parts}: {len(mine)} of {count} shards, {examples:,} examples "
            f"in {folder}; once every part has finished, run the same command with --finalize "
            "in place of --num_parts/--part: it writes the dataset's metadata")
        return {"part": part, "num_parts": num_parts, "examples": examples, "shards": ordered}
    missing = [i for i in range(count) if i not in reports]
    if missing:
        parts = parts or num_parts
        named = ", ".join(f"{i:05d}" + (f" (part {i % parts} of {parts})" if parts else "")
                          for i in missing[:5])
        raise ConfigError(f"{folder}: {len(missing)} of {count} shards are not converted: "
                          f"{named}{', ...' if len(missing) > 5 else ''}; run their parts "
                          "(--num_parts/--part), then --finalize again")
    import tensorflow_datasets as tfds

    skipped = Counter()
    for report in ordered:
        skipped.update(report["skipped"])
    unreadable = [r["input"] for r in ordered if r["error"]]
    total = {"inputs": files, "split": split, "max_side": max_side,
             "examples": sum(r["examples"] for r in ordered),
             "skipped": dict(sorted(skipped.items())), "unreadable_shards": unreadable,
             "shards": ordered}
    write_report(f"{folder}/{REPORT}", total)
    split_info = tfds.core.SplitInfo(
        name=split, shard_lengths=[r["examples"] for r in ordered],
        num_bytes=sum(r["bytes"] for r in ordered),
        filename_template=tfds.core.ShardedFileTemplate(
            data_dir=epath.Path(folder), template="{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}",
            dataset_name=name, split=split, filetype_suffix="array_record"))
    tfds.folder_dataset.write_metadata(
        data_dir=epath.Path(folder), features=features(), split_infos=[split_info],
        version=VERSION, check_data=False, description=f"Image-text pairs converted from "
        f"{count} shard(s) by contrastive_jax.training.data.convert_shards.")
    reasons = ", ".join(f"{k}: {v:,}" for k, v in total["skipped"].items())
    log(f"converted {total['examples']:,} examples into {folder}; skipped "
        f"{sum(skipped.values()):,}" + (f" ({reasons})" if reasons else ""))
    for path in unreadable:
        error = next(r["error"] for r in ordered if r["input"] == path)
        log(f"warning: shard {path} could not be read ({error}); its examples are missing")
    return total


FLAGS = flags.FlagValues()  # this command's own (contrastive_jax.command_line)
_INPUT = flags.DEFINE_multi_string(
    "input", None, "shard paths: globs, {a,b} lists and {00000..00099} ranges, gs://",
    flag_values=FLAGS)
_NAME = flags.DEFINE_string("name", None, "the dataset's name (data.name)", flag_values=FLAGS)
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, "where prepared datasets live (data.data_dir); default as prepare",
    flag_values=FLAGS)
_SPLIT = flags.DEFINE_string("split", "train", "the split to write", flag_values=FLAGS)
_MAX_SIDE = flags.DEFINE_integer(
    "max_side", None, "resize images whose longer side exceeds this (re-encoded JPEG)",
    flag_values=FLAGS)
_WORKERS = flags.DEFINE_integer("workers", None, "processes (default: cores)",
                                flag_values=FLAGS)
_IMAGE_COLUMN = flags.DEFINE_string("image_column", "jpg", "parquet: the image bytes",
                                    flag_values=FLAGS)
_CAPTION_COLUMN = flags.DEFINE_string("caption_column", "caption", "parquet: the caption",
                                      flag_values=FLAGS)
_KEY_COLUMN = flags.DEFINE_string("key_column", "key", "parquet: the key, if present",
                                  flag_values=FLAGS)
_OVERWRITE = flags.DEFINE_bool("overwrite", False,
                               "delete a previous conversion under this name first",
                               flag_values=FLAGS)
_NUM_PARTS = flags.DEFINE_integer("num_parts", None, "split over this many machines (--part)",
                                  flag_values=FLAGS)
_PART = flags.DEFINE_integer("part", None, "this machine's part: input shards i % num_parts "
                             "== part, no metadata", flag_values=FLAGS)
_FINALIZE = flags.DEFINE_bool("finalize", False, "after the parts: check every shard is there, "
                              "write the metadata", flag_values=FLAGS)
_STAGING_DIR = flags.DEFINE_string("staging_dir", None, "gs:// --data_dir: the local folder "
                                   "shards are written in before upload", flag_values=FLAGS)
COMMAND = command_line.Command(
    program="python -m contrastive_jax.training.data.convert_shards", doc=__doc__,
    flag_values=FLAGS, required=("input", "name"))


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (module docstring; ``argv``: its arguments, ``sys.argv[1:]`` when
    None): 0 when converted, 2 with one ``error:`` line for bad input
    (:func:`contrastive_jax.command_line.run_command`)."""
    return command_line.run_command(COMMAND, _convert_command, argv)


def _convert_command(positional: list[str]) -> None:
    """:func:`convert_dataset` with the flags' values, its lines printed."""
    from contrastive_jax.training.data.prepare import resolve_data_dir

    convert_dataset(_INPUT.value, _NAME.value, resolve_data_dir(_DATA_DIR.value),
                    split=_SPLIT.value, max_side=_MAX_SIDE.value, workers=_WORKERS.value,
                    image_column=_IMAGE_COLUMN.value, caption_column=_CAPTION_COLUMN.value,
                    key_column=_KEY_COLUMN.value, overwrite=_OVERWRITE.value,
                    num_parts=_NUM_PARTS.value, part=_PART.value, finalize=_FINALIZE.value,
                    staging_dir=_STAGING_DIR.value, log=lambda line: print(line, flush=True))


if __name__ == "__main__":
    sys.exit(main())
