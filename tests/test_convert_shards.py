"""convert_shards: webdataset tars and parquet files the test writes (PIL + tarfile, damaged
members included) -> a prepared dataset that open_split and the image_text preprocessing read;
bad members counted by reason, byte-identical output, resumable after kill -9."""

import io
import json
import random
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.data import convert_shards, shard_readers
from contrastive_jax.training.data.example_preprocessing import image_text_preprocess
from contrastive_jax.training.data.sources import open_split

REPO = Path(__file__).resolve().parents[1]


def image_bytes(seed: int, size=(40, 30), fmt="JPEG", mode="RGB") -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    image = Image.fromarray(pixels).convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buffer.getvalue()


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))


def good(key: str, seed: int, fmt="jpg", **kwargs) -> list[tuple[str, bytes]]:
    pil = {"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}[fmt]
    return [(f"{key}.{fmt}", image_bytes(seed, fmt=pil, **kwargs)),
            (f"{key}.txt", f"a photo number {seed}".encode()),
            (f"{key}.json", json.dumps({"key": key}).encode())]


def make_shards(folder: Path) -> dict:
    """Three tar shards, a truncated one and a file that is not a tar; what a correct
    conversion must find."""
    folder.mkdir(parents=True, exist_ok=True)
    jpeg = image_bytes(99)
    write_tar(folder / "00000.tar", [
        *good("a0", 0), *good("a1", 1, fmt="png"), *good("a2", 2, fmt="webp"),
        ("a3.jpg", b"not an image at all"), ("a3.txt", b"undecodable"),  # image undecodable
        ("a4.jpg", jpeg[: len(jpeg) // 2]), ("a4.txt", b"cut jpeg"),     # truncated image
        ("a5.jpg", image_bytes(5)),                                       # no caption
        ("a6.jpg", image_bytes(6)), ("a6.txt", b"  \n"),                  # empty caption
        ("a7.txt", b"no image"),                                          # no image
    ])
    write_tar(folder / "00001.tar", [*good("b0", 10, mode="L"), *good("b1", 11, size=(90, 20))])
    whole = folder / "whole.tar"
    write_tar(whole, [*good("c0", 20), *good("c1", 21), *good("c2", 22)])
    data = whole.read_bytes()
    cut = data.index(b"a photo number 22")  # inside the last example's caption
    (folder / "00002.tar").write_bytes(data[:cut])
    whole.unlink()
    (folder / "00003.tar").write_bytes(b"this is not a tar file" * 40)
    return {"captions": {"00000.tar/a0": "a photo number 0", "00000.tar/a1": "a photo number 1",
                         "00000.tar/a2": "a photo number 2", "00001.tar/b0": "a photo number 10",
                         "00001.tar/b1": "a photo number 11",
                         "00002.tar/c0": "a photo number 20", "00002.tar/c1": "a photo number 21"},
            "skipped": {"empty caption": 1, "image undecodable": 2, "no caption": 1,
                        "no image": 1, "truncated shard": 1}}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shards")
    return folder, make_shards(folder)


def test_shards_become_a_dataset_that_training_reads_with_bad_members_counted(tmp_path, shards):
    folder, want = shards
    lines = []
    report = convert_shards.convert_dataset([str(folder / "{00000..00003}.tar")], "web",
                                            str(tmp_path), workers=2, log=lines.append)
    assert report["examples"] == len(want["captions"]) == 7
    assert report["skipped"] == want["skipped"]
    assert report["unreadable_shards"] == [str(folder / "00003.tar")]
    assert [r["examples"] for r in report["shards"]] == [3, 2, 2, 0]
    assert any("could not be read" in line and "00003.tar" in line for line in lines)
    assert lines[-2].startswith("converted 7 examples") and "image undecodable: 2" in lines[-2]
    source = open_split("web", "train", str(tmp_path))
    assert len(source) == 7
    examples = [source[i] for i in range(len(source))]
    got = {e["image/filename"].decode(): e["captions"]["text"][0].decode() for e in examples}
    assert got == want["captions"]
    by_key = {e["image/filename"].decode(): e for e in examples}
    # stored as they came (RGB JPEG, PNG, WEBP: the same pixels), or converted to RGB
    np.testing.assert_array_equal(by_key["00000.tar/a1"]["image"],
                                  np.asarray(Image.open(io.BytesIO(image_bytes(1, fmt="PNG")))))
    assert by_key["00001.tar/b0"]["image"].shape == (30, 40, 3)  # grayscale -> RGB
    assert json.loads(by_key["00000.tar/a0"]["metadata"]) == {"key": "a0"}
    preprocess = image_text_preprocess(image_size=16, max_tokens=8)
    out = preprocess(examples[0])
    assert out["image"].shape == (16, 16, 3) and out["caption"].shape == (8,)
    # run again: nothing to do
    again = convert_shards.convert_dataset([str(folder / "{00000..00003}.tar")], "web",
                                           str(tmp_path), log=lines.append)
    assert again["examples"] == 7 and lines[-1].startswith("already converted")
    with pytest.raises(ConfigError, match="other inputs; pass --overwrite"):
        convert_shards.convert_dataset([str(folder / "00000.tar")], "web", str(tmp_path))


def test_a_second_converter_on_the_same_folder_stops_at_once(tmp_path, shards):
    import fcntl

    folder, _ = shards
    work = tmp_path / "held" / convert_shards.VERSION / convert_shards.WORK_DIR
    work.mkdir(parents=True)
    with open(work / "lock", "a") as held:  # another converter holds the folder
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ConfigError, match="being written by another convert_shards"):
            convert_shards.convert_dataset([str(folder / "00001.tar")], "held", str(tmp_path))


def test_max_side_resizes_and_the_output_is_byte_identical_across_runs(tmp_path, shards):
    folder, _ = shards
    inputs = [str(folder / "0000[01].tar")]
    for run, workers in (("one", 1), ("two", 2)):
        convert_shards.convert_dataset(inputs, "capped", str(tmp_path / run), max_side=32,
                                       workers=workers, log=lambda line: None)
    first, second = (sorted(p.relative_to(tmp_path / run) for p in (tmp_path / run).rglob("*")
                            if p.is_file()) for run in ("one", "two"))
    assert first == second and len(first) > 5
    for relative in first:
        assert (tmp_path / "one" / relative).read_bytes() == \
            (tmp_path / "two" / relative).read_bytes(), relative
    source = open_split("capped", "train", str(tmp_path / "one"))
    sizes = {source[i]["image/filename"].decode(): source[i]["image"].shape
             for i in range(len(source))}
    assert sizes["00001.tar/b1"] == (7, 32, 3)  # 90 x 20 -> 32 x 7
    assert sizes["00000.tar/a0"] == sizes["00001.tar/b0"] == (24, 32, 3)  # 40 x 30 -> 32 x 24


def test_parquet_rows_with_hugging_face_image_structs(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = {"key": ["p0", "p1", "p2"],
            "image": [{"bytes": image_bytes(30), "path": None}, {"bytes": b"junk", "path": None},
                      {"bytes": image_bytes(32), "path": None}],
            "text": ["first", "second", ""]}
    pq.write_table(pa.table(rows), tmp_path / "part.parquet", row_group_size=2)
    report = convert_shards.convert_dataset([str(tmp_path / "*.parquet")], "pq",
                                            str(tmp_path / "out"), image_column="image",
                                            caption_column="text", log=lambda line: None)
    assert report["examples"] == 1
    assert report["skipped"] == {"empty caption": 1, "image undecodable": 1}
    source = open_split("pq", "train", str(tmp_path / "out"))
    assert source[0]["image/filename"] == b"part.parquet/p0"
    with pytest.raises(ConfigError, match=r"no column 'jpg'.*--image_column"):
        convert_shards.convert_dataset([str(tmp_path / "part.parquet")], "pq2",
                                       str(tmp_path / "o2"), log=lambda line: None)


def test_brace_ranges_globs_and_bad_input(tmp_path, capsys):
    assert shard_readers.expand_braces("s{008..011}.tar") == [
        "s008.tar", "s009.tar", "s010.tar", "s011.tar"]
    assert shard_readers.expand_braces("{a,b}/{1..2}") == ["a/1", "a/2", "b/1", "b/2"]
    with pytest.raises(ConfigError, match="counts down"):
        shard_readers.expand_braces("{9..1}")
    with pytest.raises(ConfigError, match="matches no file"):
        shard_readers.input_files(["/nonexistent/{0..1}.tar"])
    with pytest.raises(ConfigError, match="--name"):
        convert_shards.convert_dataset(["x"], "Bad-Name", "/tmp")
    with pytest.raises(ConfigError, match=r"--staging_dir .*for a gs:// --data_dir only"):
        convert_shards.convert_dataset(["x"], "ok", "/tmp", staging_dir="/tmp/staging")
    # the command: exit 2, one line naming the pattern
    assert convert_shards.main(["--input", "/nonexistent/{0..1}.tar", "--name", "n",
                                "--data_dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --input '/nonexistent/{0..1}.tar': '/nonexistent/0.tar' matches no file (and 1 "
        "more of its 2 names)")


def test_killed_at_random_moments_the_rerun_converts_every_example_exactly_once(tmp_path):
    """kill -9 at random moments of the command (two workers), then the same command until it
    finishes: the folder equals an uninterrupted conversion's, byte for byte."""
    many = tmp_path / "many"
    many.mkdir()
    for i in range(8):  # more shards, so that kills land between and inside them
        write_tar(many / f"{i:05d}.tar",
                  [m for k in range(6) for m in good(f"k{k}", 100 + i * 6 + k)])
    args = ["--input", str(many / "{00000..00007}.tar"), "--name", "killed"]
    reference = tmp_path / "reference"  # in this process, one shard after another
    assert convert_shards.main([*args, "--workers", "1", "--data_dir", str(reference)]) == 0
    target = tmp_path / "target"
    command = [sys.executable, "-m", "contrastive_jax.training.data.convert_shards", *args,
               "--workers", "2", "--data_dir", str(target)]
    rng = random.Random(0)
    kills = 0
    for _ in range(2):
        proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        while proc.poll() is None and not list(target.rglob("*.json")):
            time.sleep(0.01)  # started converting: the first report or inputs.json written
        time.sleep(rng.uniform(0.0, 0.6))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        # returns once every process holding the pipes is gone: the killed command's workers
        # die with it (else they would go on writing into the folder the rerun writes)
        proc.communicate(timeout=60)
    assert kills >= 1
    final = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stderr[-2000:]
    assert "converted 48 examples" in final.stdout or "already converted" in final.stdout
    want = sorted(p.relative_to(reference) for p in reference.rglob("*") if p.is_file())
    got = sorted(p.relative_to(target) for p in target.rglob("*") if p.is_file())
    assert got == want
    for relative in want:
        assert (target / relative).read_bytes() == (reference / relative).read_bytes(), relative


def _files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative name -> bytes), the work folder's locks and
    inputs.json (which records the split) aside."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()
            and not p.name.startswith("lock") and p.name != "inputs.json"}


def test_three_parts_and_finalize_write_the_one_machine_conversion_byte_for_byte(
        tmp_path, shards, capsys):
    """``--num_parts=3 --part=I`` on each "machine" (the same folder), then ``--finalize``: the
    folder equals a one-machine conversion's; finalize before every part ran names the missing
    shards and their part (exit 2); a part with another --num_parts or bad flags: exit 2."""
    folder, _ = shards
    common = ["--input", str(folder / "{00000..00003}.tar"), "--name", "split", "--workers", "1"]
    assert convert_shards.main([*common, "--data_dir", str(tmp_path / "one")]) == 0
    parts = [*common, "--data_dir", str(tmp_path / "parts")]
    version = tmp_path / "parts" / "split" / convert_shards.VERSION
    for part in (0, 2):
        assert convert_shards.main([*parts, "--num_parts", "3", "--part", str(part)]) == 0
    out = capsys.readouterr().out
    assert "part 0 of 3: 2 of 4 shards, 3 examples" in out  # shards 0 and 3 (unreadable)
    assert "part 2 of 3: 1 of 4 shards, 2 examples" in out and "--finalize" in out
    assert not (version / "dataset_info.json").exists()
    assert sorted(p.name for p in version.glob("*.array_record-*")) == [
        f"split-train.array_record-{i:05d}-of-00004" for i in (0, 2, 3)]
    assert convert_shards.main([*parts, "--finalize"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {version}: 1 of 4 shards are not converted: 00001 (part 1 of 3); run their "
        "parts (--num_parts/--part), then --finalize again")
    assert not (version / "dataset_info.json").exists()
    for flags, says in ((["--num_parts", "2", "--part", "1"], "split with --num_parts=3: use"),
                        (["--part", "1"], "--part=1 needs --num_parts"),
                        (["--num_parts", "3", "--part", "3"], "--part=3: must be 0 to 2"),
                        (["--num_parts", "3"], "--num_parts=3 needs --part=I"),
                        (["--finalize", "--part", "0"], "drop --part")):
        assert convert_shards.main([*parts, *flags]) == 2, flags
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and says in err and "\n" not in err, (flags, err)
    assert convert_shards.main([*parts, "--num_parts", "3", "--part", "1"]) == 0
    assert convert_shards.main([*parts, "--finalize"]) == 0
    assert "converted 7 examples" in capsys.readouterr().out
    one = _files(tmp_path / "one")
    assert len(one) == 4 + 2 + 1 + 4  # shards, dataset_info + features, report, shard reports
    assert _files(tmp_path / "parts") == one
