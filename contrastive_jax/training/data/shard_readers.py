"""Reading image-text shards: webdataset tars and parquet files, named by patterns.

The input side of :mod:`contrastive_jax.training.data.convert_shards`: patterns expanded to files
(brace lists and ranges, globs, ``gs://`` through ``etils.epath``), and each file read as a
stream of :class:`Example` (key, image bytes, caption, metadata), members that are missing left
``None`` for the converter to count. References: docs/data.md, "Your own image-text shards".
"""

from __future__ import annotations

import dataclasses
import glob
import re
import tarfile
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence

from etils import epath

from contrastive_jax.errors import ConfigError

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
READ_BYTES = 1 << 20  # a tar is read from its file in pieces of this size


def expand_braces(pattern: str) -> list[str]:
    """webdataset's brace expansion: ``{a,b}`` lists and ``{000..099}`` ranges (zero padding
    of the first bound kept), left to right: ``"s{0..2}.tar"`` -> ``s0.tar s1.tar s2.tar``."""
    match = re.search(r"\{([^{}]*)\}", pattern)
    if match is None:
        return [pattern]
    body = match.group(1)
    numeric = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if numeric:
        first, last = numeric.groups()
        if int(last) < int(first):
            raise ConfigError(f"brace range {{{body}}} in {pattern!r} counts down; write "
                              f"{{{last}..{first}}}")
        width = len(first) if first.startswith("0") else 0
        items = [str(i).zfill(width) for i in range(int(first), int(last) + 1)]
    else:
        items = body.split(",")
    head, tail = pattern[:match.start()], pattern[match.end():]
    return [expanded for item in items for expanded in expand_braces(head + item + tail)]


def input_files(patterns: Sequence[str], *, flag: str = "--input") -> list[str]:
    """Every file the patterns name (braces expanded, then globs matched), in order, without
    repeats. A ConfigError (naming ``flag``, the setting that holds the patterns) if a pattern
    matches nothing or names a missing file. The names a brace range expands to are checked
    with one listing of their folder, not one request per file (41,408 LAION shards in a
    bucket: a few list calls)."""
    files: dict[str, None] = {}  # in order, without repeats
    listed: dict[str, set[str]] = {}  # folder -> the names in it
    for pattern in patterns:
        expanded_all = expand_braces(pattern)
        for expanded in expanded_all:
            if glob.has_magic(expanded):
                path = epath.Path(expanded)
                anchor = next((i for i, part in enumerate(path.parts) if glob.has_magic(part)))
                root = epath.Path(*path.parts[:anchor])
                matched = sorted(str(p) for p in root.glob("/".join(path.parts[anchor:])))
            elif len(expanded_all) > 1 and _in_listing(expanded, listed):
                matched = [expanded]
            else:
                matched = [expanded] if epath.Path(expanded).exists() else []
            if not matched:
                missing = sum(1 for e in expanded_all if not glob.has_magic(e)
                              and not _in_listing(e, listed)) if len(expanded_all) > 1 else 1
                more = f" (and {missing - 1:,} more of its {len(expanded_all):,} names)" \
                    if missing > 1 else ""
                raise ConfigError(f"{flag} {pattern!r}: {expanded!r} matches no file{more}")
            files.update(dict.fromkeys(matched))
    return list(files)


def _in_listing(path: str, listed: dict[str, set[str]]) -> bool:
    """Whether ``path`` is in its folder's listing (listed once and kept in ``listed``)."""
    folder, _, name = path.rpartition("/")
    if folder not in listed:
        try:
            listed[folder] = {p.name for p in epath.Path(folder or ".").iterdir()}
        except OSError:
            listed[folder] = set()
    return name in listed[folder]


@dataclasses.dataclass
class Example:
    """One image-text pair as read from a shard (``None``: the member is missing)."""

    key: str
    image: bytes | None = None
    caption: str | None = None
    metadata: str = ""


def missing_part(example: Example) -> str | None:
    """Why an example cannot be trained on (``"no image"``, ``"no caption"``, ``"empty
    caption"``: a caption of white space only), or None."""
    if example.image is None:
        return "no image"
    if example.caption is None:
        return "no caption"
    return None if example.caption.strip() else "empty caption"


def tar_examples(path: str, skipped: Counter) -> Iterator[Example]:
    """The examples of a webdataset tar, members grouped by key (consecutive, as webdataset
    writes them). A file that is not a tar raises ``tarfile.ReadError`` (the shard cannot be
    read). A cut inside the tar ends it: the examples before the cut are kept; the one being
    read when it came (which may lack a member) is dropped and counted as ``truncated shard``."""
    current: Example | None = None
    # a local: a generator left open until interpreter exit is closed after the module's
    # globals are gone
    cut = (tarfile.ReadError, EOFError, zlib.error)
    with epath.Path(path).open("rb") as raw:
        # reads of 1 MiB: a gs:// file object costs ~0.2 ms a read call whatever its size
        # (gcsfs; 512-byte header reads made a tar over gs:// 100x slower than from disk)
        tar = tarfile.open(fileobj=raw, mode="r|*", bufsize=READ_BYTES)
        try:
            for member in tar:
                if not member.isfile():
                    continue
                folder, _, name = member.name.rpartition("/")
                stem, _, extension = name.partition(".")
                key = f"{folder}/{stem}" if folder else stem
                data = tar.extractfile(member).read()
                if current is None or key != current.key:
                    if current is not None:
                        yield current
                    current = Example(key)
                extension = extension.lower()
                if extension in IMAGE_EXTENSIONS:
                    current.image = data
                elif extension == "txt":
                    current.caption = data.decode("utf-8", errors="replace")
                elif extension == "json":
                    current.metadata = data.decode("utf-8", errors="replace")
        except cut:
            skipped["truncated shard"] += 1
            return
    if current is not None:
        yield current


def parquet_examples(path: str, image_column: str, caption_column: str,
                     key_column: str, start: int = 0) -> Iterator[Example]:
    """The rows of a parquet file as examples (read one row group at a time), from row
    ``start`` on (the row groups before it are not read)."""
    try:
        import pyarrow.parquet as pq
    except ImportError as err:
        raise ConfigError("reading parquet needs pyarrow: pip install pyarrow") from err
    with epath.Path(path).open("rb") as raw:
        table = pq.ParquetFile(raw)
        columns = table.schema_arrow.names
        for name, flag in ((image_column, "--image_column"), (caption_column,
                                                              "--caption_column")):
            if name not in columns:
                raise ConfigError(f"{path}: no column {name!r} (its columns: {columns}); set "
                                  f"{flag}")
        row = 0
        for group in range(table.num_row_groups):
            rows = table.metadata.row_group(group).num_rows
            if row + rows <= start:
                row += rows
                continue
            first = max(0, start - row)  # the rows of this group before ``start``
            row += first
            for record in table.read_row_group(group).to_pylist()[first:]:
                image = record.get(image_column)
                if isinstance(image, dict):  # Hugging Face's Image feature: {"bytes", "path"}
                    image = image.get("bytes")
                key = record.get(key_column) if key_column in columns else row
                caption = record.get(caption_column)
                yield Example(str(key), image, caption if isinstance(caption, str) else None)
                row += 1
