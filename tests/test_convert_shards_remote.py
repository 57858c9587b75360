"""convert_shards with ``--data_dir gs://...`` (the loopback GCS server of
tests/test_remote_paths.py): the shards are staged locally and uploaded, the dataset reads from
the bucket as the local conversion reads, a rerun redoes only the shards without a report, and
a conversion split in parts then finalized equals the one-machine conversion byte for byte."""

import json
import sys
from pathlib import Path

import gcsfs
import pytest

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.data import convert_shards
from contrastive_jax.training.data.sources import open_split

sys.path.insert(0, str(Path(__file__).parent))
from test_convert_shards import make_shards
from test_remote_paths import BUCKET, gcs  # noqa: F401 (the fixture)

NAME = "web"


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """The test shards (four: one unreadable) and their conversion into a local folder."""
    root = tmp_path_factory.mktemp("convert_remote")
    make_shards(root / "shards")
    inputs = [str(root / "shards" / "{00000..00003}.tar")]
    convert_shards.convert_dataset(inputs, NAME, str(root / "out"), workers=1,
                                   log=lambda line: None)
    return inputs, root / "out" / NAME / convert_shards.VERSION


def _bucket_files(prefix: str) -> dict[str, bytes]:
    """Every object under ``gs://BUCKET/prefix/NAME/1.0.0`` (relative name -> bytes)."""
    fs = gcsfs.GCSFileSystem()
    fs.invalidate_cache()
    root = f"{BUCKET}/{prefix}/{NAME}/{convert_shards.VERSION}"
    return {path[len(root) + 1:]: fs.cat_file(path) for path in fs.find(root)}


def _same_as_local(objects: dict[str, bytes], version: Path) -> None:
    """The bucket's shards, shard reports and conversion report equal the local folder's
    byte for byte, and dataset_info.json its split info."""
    shards = sorted(p.name for p in version.glob(f"{NAME}-train.array_record-*"))
    reports = [f"{convert_shards.WORK_DIR}/{i:05d}.json" for i in range(4)]
    assert len(shards) == 4
    for relative in [*shards, *reports, convert_shards.REPORT, "features.json"]:
        assert objects[relative] == (version / relative).read_bytes(), relative
    info = json.loads(objects["dataset_info.json"])
    assert info["splits"] == json.loads((version / "dataset_info.json").read_text())["splits"]


def test_a_conversion_into_a_bucket_reads_as_the_local_one_and_resumes_from_it(
        gcs, local, tmp_path):  # noqa: F811 (the fixture above)
    inputs, version = local
    data_dir = f"gs://{BUCKET}/tfds_out"
    staging = tmp_path / "staging"
    staging.mkdir()
    report = convert_shards.convert_dataset(inputs, NAME, data_dir, workers=2,
                                            staging_dir=str(staging), log=lambda line: None)
    assert report == json.loads((version / convert_shards.REPORT).read_text())
    assert list(staging.iterdir()) == []  # the staged shards deleted after their upload
    objects = _bucket_files("tfds_out")
    _same_as_local(objects, version)
    assert not any(name.endswith(".incomplete") for name in objects)
    remote, there = open_split(NAME, "train", data_dir), open_split(NAME, "train",
                                                                    str(version.parents[1]))
    assert len(remote) == len(there) == 7
    for i in range(7):
        a, b = remote[i], there[i]
        assert a["image/filename"] == b["image/filename"]
        assert a["captions"]["text"] == b["captions"]["text"]
        assert (a["image"] == b["image"]).all()

    # a conversion cut short: one shard's report and the metadata gone; the rerun redoes
    # only that shard (the others' objects are not written again: the same generation)
    fs = gcsfs.GCSFileSystem()
    root = f"{BUCKET}/tfds_out/{NAME}/{convert_shards.VERSION}"
    generations = {i: fs.info(f"{root}/{NAME}-train.array_record-{i:05d}-of-00004")["generation"]
                   for i in range(4)}
    fs.rm([f"{root}/{convert_shards.WORK_DIR}/00002.json", f"{root}/dataset_info.json"])
    lines = []
    convert_shards.convert_dataset(inputs, NAME, data_dir, workers=2, log=lines.append)
    assert lines[0] == "resuming: 3 of 4 shards already converted"
    assert [line.split(" |")[0] for line in lines if line.startswith("shards ")] == ["shards 4/4"]
    fs.invalidate_cache()
    again = {i: fs.info(f"{root}/{NAME}-train.array_record-{i:05d}-of-00004")["generation"]
             for i in range(4)}
    assert [i for i in range(4) if again[i] != generations[i]] == [2]
    _same_as_local(_bucket_files("tfds_out"), version)


def test_a_bucket_conversion_in_two_parts_then_finalized_equals_the_one_machine_one(
        gcs, local, tmp_path):  # noqa: F811 (the fixture above)
    inputs, version = local
    data_dir = f"gs://{BUCKET}/tfds_parts"
    staged = []  # after each shard (one worker: this process), the files left in staging
    part = convert_shards.convert_dataset(
        inputs, NAME, data_dir, num_parts=2, part=1, workers=1, staging_dir=str(tmp_path),
        log=lambda line: staged.append([p for p in tmp_path.rglob("*") if p.is_file()]))
    assert staged == [[], [], []]  # each staged shard deleted once uploaded
    assert part["examples"] == 2 + 0 and len(part["shards"]) == 2  # shards 1 and 3
    assert "dataset_info.json" not in _bucket_files("tfds_parts")
    with pytest.raises(ConfigError, match=r"2 of 4 shards are not converted: 00000 \(part 0 of "
                                          r"2\), 00002 \(part 0 of 2\)"):
        convert_shards.convert_dataset(inputs, NAME, data_dir, finalize=True)
    with pytest.raises(ConfigError, match="split with --num_parts=2"):
        convert_shards.convert_dataset(inputs, NAME, data_dir, num_parts=3, part=0)
    convert_shards.convert_dataset(inputs, NAME, data_dir, num_parts=2, part=0, workers=1,
                                   log=lambda line: None)
    report = convert_shards.convert_dataset(inputs, NAME, data_dir, finalize=True,
                                            log=lambda line: None)
    assert report == json.loads((version / convert_shards.REPORT).read_text())
    _same_as_local(_bucket_files("tfds_parts"), version)
