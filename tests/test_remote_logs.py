"""Remote logs in parts of bounded size (progress.py): what one flush of ``metrics.jsonl`` or of
a TensorBoard event file uploads stays bounded however long the run, a resumed run keeps every
line and rewrites no finished part, and the event-file parts are whole-record event files that
hold every event once. Against the fake GCS server of tests/test_remote_paths.py."""

import collections
import json
import os
import random
import struct
import sys
from pathlib import Path

import google_crc32c
import pytest
from etils import epath

from contrastive_jax.training.run.progress import (
    RemoteRecordFile,
    RemoteTextLog,
    log_parts,
    read_metrics_lines,
    use_epath_for_tensorboard,
)

sys.path.insert(0, str(Path(__file__).parent))
from test_remote_paths import BUCKET, _objects, gcs  # noqa: F401  (gcs: the server fixture)

CAP = 4096  # part_bytes in these tests: many parts from a few hundred KB


class _CountedFile:
    """A file opened for writing through epath, counting the bytes written to it."""

    def __init__(self, file, path: str, uploads: list):
        self._file, self._path, self._uploads, self._bytes = file, path, uploads, 0

    def write(self, data):
        self._bytes += len(data.encode() if isinstance(data, str) else data)
        return self._file.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._uploads.append((self._path, self._bytes))
        return self._file.__exit__(*exc)


@pytest.fixture
def uploads(monkeypatch):
    """``(path, bytes)`` of every file written through epath on ``gs://``, in order: the
    uploads, whatever epath write call made them."""
    cls = type(epath.Path(f"gs://{BUCKET}/x"))
    real_open, seen = cls.open, []

    def open_counted(self, mode="r", *args, **kwargs):
        file = real_open(self, mode, *args, **kwargs)
        return _CountedFile(file, os.fspath(self), seen) if set(mode) & set("wax") else file

    monkeypatch.setattr(cls, "open", open_counted)
    return seen


def _line(i: int) -> str:
    """A metrics-like JSON line of varying length."""
    return json.dumps({"step": i, "prefix": "train", "loss": 1 / (i + 1)}) + "\n"


@pytest.mark.usefixtures("gcs")
def test_each_flush_of_a_long_remote_log_uploads_a_bounded_number_of_bytes(uploads):
    """400 lines, each written and flushed (``Progress.scalars``' pattern): every flush is one
    upload of at most the part size plus the new line, the total grows linearly with the lines
    (the late flushes cost what the early ones do), and the parts read back are every line.
    (Each flush is a few HTTP requests to the fake server, a separate process: with both cores
    busy each waits for it to be scheduled, so the lines are as few as 40 parts need.)"""
    lines = [_line(i) for i in range(400)]
    cap = CAP // 8  # parts of about 8 lines
    log = RemoteTextLog(f"gs://{BUCKET}/bounded/metrics.jsonl", part_bytes=cap)
    per_flush = []
    for line in lines:
        before = len(uploads)
        log.write(line)
        log.flush()
        assert len(uploads) == before + 1  # one object per flush
        per_flush.append(uploads[-1][1])
    log.close()
    assert len(uploads) == len(lines)  # close: nothing new to upload
    paths = [path for path, _ in uploads]
    assert paths == sorted(paths)  # a finished part is never uploaded again

    longest = max(len(line.encode()) for line in lines)
    written = sum(len(line.encode()) for line in lines)
    assert written > 40 * cap  # ~25 KB: what a whole-file upload would have reached
    assert max(per_flush) <= cap + longest
    assert sum(per_flush) <= len(lines) * (cap + longest)  # O(n); whole files: ~n * written / 2
    half = len(lines) // 2
    early, late = sum(per_flush[:half]), sum(per_flush[half:])
    assert late < 1.2 * early, (early, late)  # whole files: late = 3 * early

    parts = log_parts(f"gs://{BUCKET}/bounded/metrics.jsonl")
    sizes = [len(p.read_bytes()) for p in parts]
    assert len(sizes) > 40 and sum(sizes) == written
    assert all(cap <= n < cap + longest for n in sizes[:-1]) and sizes[-1] < cap + longest
    assert read_metrics_lines(f"gs://{BUCKET}/bounded") == [x.rstrip("\n") for x in lines]


def _fixed_line(i: int) -> str:
    """A line of exactly 100 bytes: a CAP-byte part is finished after 41 of them (4,100 B)."""
    return f"{i:06d}".ljust(99, ".") + "\n"


def _run(path: str, lines: list[str]) -> None:
    """One run's log: open (resume), write and flush each line, close."""
    log = RemoteTextLog(path, part_bytes=CAP)
    for line in lines:
        log.write(line)
        log.flush()
    log.close()


def _part_bytes(path: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in log_parts(path)}


@pytest.mark.usefixtures("gcs")
def test_a_resumed_remote_log_keeps_every_line_and_rewrites_no_finished_part():
    """Three runs on one log: the second continues the first's unfinished last part, the third
    starts a new part after the second's full one; every earlier finished part is byte-identical
    afterwards, and the parts, in name order, are every line of the three runs in order."""
    workdir = f"gs://{BUCKET}/resumed"
    path = f"{workdir}/metrics.jsonl"
    epath.Path(f"{workdir}/metrics.jsonl.tmp").write_text("not a part\n")  # ignored
    lines = [_fixed_line(i) for i in range(169)]
    _run(path, lines[:100])  # parts of 41, 41, 18 lines
    first = _part_bytes(path)
    assert list(first) == ["metrics.jsonl", "metrics.jsonl.part-00001",
                           "metrics.jsonl.part-00002"]
    assert [len(v) for v in first.values()] == [4100, 4100, 1800]

    _run(path, lines[100:164])  # 23 lines finish part 2, 41 fill part 3 exactly
    second = _part_bytes(path)
    assert [len(v) for v in second.values()] == [4100, 4100, 4100, 4100]
    assert second["metrics.jsonl"] == first["metrics.jsonl"]
    assert second["metrics.jsonl.part-00001"] == first["metrics.jsonl.part-00001"]
    assert second["metrics.jsonl.part-00002"].startswith(first["metrics.jsonl.part-00002"])

    _run(path, lines[164:])  # the last part is full: a new one
    third = _part_bytes(path)
    assert list(third) == sorted(third) == [*second, "metrics.jsonl.part-00004"]
    assert {k: third[k] for k in second} == second
    assert len(third["metrics.jsonl.part-00004"]) == 500
    assert read_metrics_lines(workdir) == [x.rstrip("\n") for x in lines]


def test_a_local_workdir_reads_its_one_metrics_file(tmp_path):
    assert read_metrics_lines(tmp_path) == []  # no file yet
    (tmp_path / "metrics.jsonl").write_text("a\nb\n")
    assert read_metrics_lines(tmp_path) == ["a", "b"]


def _masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC-32C (google-crc32c, not tensorboardX's own code)."""
    x = google_crc32c.value(data)
    return ((((x >> 15) | (x << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _records(data: bytes) -> list[bytes]:
    """The records of a TFRecord file (8-byte length, its masked CRC, data, its masked CRC),
    every CRC checked; fails unless ``data`` is whole records, from its first byte to its
    last."""
    records, pos = [], 0
    while pos < len(data):
        assert len(data) - pos >= 12, "a partial record header"
        (length,), (header_crc,) = struct.unpack_from("<Q", data, pos), \
            struct.unpack_from("<I", data, pos + 8)
        assert header_crc == _masked_crc(data[pos:pos + 8])
        body = data[pos + 12:pos + 12 + length]
        assert len(body) == length and len(data) >= pos + 16 + length, "a partial record"
        assert struct.unpack_from("<I", data, pos + 12 + length)[0] == _masked_crc(body)
        records.append(body)
        pos += 16 + length
    return records


@pytest.mark.usefixtures("gcs")
def test_an_event_file_on_gs_is_parts_of_whole_records_holding_every_event_once(
        uploads, monkeypatch):
    """2,400 scalars through tensorboardX's SummaryWriter to gs:// with CAP-byte parts: several
    event files whose names contain ``tfevents`` and sort in write order, each of whole records
    on its own (every CRC right), together every (tag, step, value) exactly once, the file
    version event first; no upload over CAP plus one record."""
    from tensorboardX import SummaryWriter, record_writer
    from tensorboardX.proto import event_pb2

    monkeypatch.setitem(record_writer.REGISTERED_FACTORIES, "gs",
                        record_writer.REGISTERED_FACTORIES["gs"])  # restored after the test
    use_epath_for_tensorboard(part_bytes=CAP)
    tags = ("train/loss", "train/top1", "eval/knn")
    expected = collections.Counter((tag, step, step / 4 + i)
                                   for step in range(800) for i, tag in enumerate(tags))
    writer = SummaryWriter(f"gs://{BUCKET}/tb/run")
    for step in range(800):
        for i, tag in enumerate(tags):
            writer.add_scalar(tag, step / 4 + i, step)  # exact in float32
    writer.close()

    names = [o for o in _objects("tb/run") if "tfevents" in o]
    assert len(names) >= 10, names
    assert all(name.startswith(names[0]) for name in names)  # parts of one file, in name order
    seen, steps, versions, largest = collections.Counter(), [], [], 0
    for name in names:  # sorted by name
        for record in _records(epath.Path(f"gs://{BUCKET}/tb/run/{name}").read_bytes()):
            largest = max(largest, 16 + len(record))
            event = event_pb2.Event.FromString(record)
            if event.file_version:
                versions.append((name, len(steps)))
            for value in event.summary.value:
                seen[(value.tag, event.step, value.simple_value)] += 1
                steps.append(event.step)
    assert seen == expected  # every scalar, each once
    assert versions == [(names[0], 0)]  # one file version event, first
    assert steps == sorted(steps)  # the parts in name order are the write order
    event_uploads = [(p, n) for p, n in uploads if "tfevents" in p]
    assert {os.path.basename(p) for p, _ in event_uploads} == set(names)
    assert event_uploads == sorted(event_uploads, key=lambda u: u[0])  # finished: not rewritten
    assert max(n for _, n in event_uploads) <= CAP + largest


def test_record_parts_end_at_records_however_the_bytes_arrive(tmp_path):
    """Records written in random pieces (not tensorboardX's four calls a record), flushed at
    random points, mid-record included: every part is whole records, each part but the last
    holds at least CAP bytes of them, and the parts together are the records in order."""
    rng = random.Random(0)
    bodies = [rng.randbytes(rng.randint(0, 900)) for _ in range(300)]
    stream = b"".join(struct.pack("<Q", len(b)) + struct.pack("<I", _masked_crc(
        struct.pack("<Q", len(b)))) + b + struct.pack("<I", _masked_crc(b)) for b in bodies)
    file = RemoteRecordFile(str(tmp_path / "events.out.tfevents.1.host"), part_bytes=CAP)
    pos = 0
    while pos < len(stream):
        size = rng.randint(1, 2000)
        file.write(stream[pos:pos + size])
        pos += size
        if rng.random() < 0.3:
            file.flush()
    file.close()
    parts = [p.read_bytes() for p in log_parts(tmp_path / "events.out.tfevents.1.host")]
    assert len(parts) > 10
    assert all(len(p) >= CAP for p in parts[:-1])
    assert [r for p in parts for r in _records(p)] == bodies
