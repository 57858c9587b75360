"""The stream of image-text shards (data.source = "shards"): which reader reads which shard,
every good member once per epoch with the bad ones counted by reason, an exact resume from any
state (threads or grain worker processes), parquet like tar, held-out shards as the
evaluation split, and bad input refused with what to change."""

import json
import sys
from collections import Counter
from pathlib import Path

import ml_collections
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_convert_shards import good, image_bytes, make_shards, write_tar

from contrastive_jax.errors import ConfigError
from contrastive_jax.mesh import make_mesh
from contrastive_jax.training.data import default_data_config
from contrastive_jax.training.data.example_preprocessing import make_preprocess
from contrastive_jax.training.data.pipeline import HostShard, eval_iterator
from contrastive_jax.training.data.stream import shard_list
from contrastive_jax.training.data.stream.heldout_shards import HeldoutShards
from contrastive_jax.training.data.stream.shard_stream import (
    ShardStream,
    StreamSpec,
)
from contrastive_jax.training.data.stream.stream_iterators import (
    StreamBatches,
    stream_dataset,
    stream_spec,
    stream_train_iterator,
)


def keys(example, epoch=0, position=0):
    """A preprocessing that keeps what identifies an example (and fails as the image_text
    one does on an image that does not decode)."""
    from contrastive_jax.training.data import image_crops

    image_crops.evaluation_image(example["image"], 8)  # a DataError if it does not decode
    return {"key": example["image/filename"], "caption": example["captions"]["text"][0],
            "epoch": epoch, "position": position}


@pytest.fixture(scope="module")
def bad_shards(tmp_path_factory):
    """test_convert_shards's shards: 7 good examples, 5 bad members, a cut tar and a file that
    is not a tar; ``(files, what a correct reading finds)``."""
    folder = tmp_path_factory.mktemp("stream_bad")
    truth = make_shards(folder)
    return [str(folder / f"{i:05d}.tar") for i in range(4)], truth


@pytest.fixture(scope="module")
def good_shards(tmp_path_factory):
    """Six tars of 5 examples each (tiny JPEGs of several sizes)."""
    folder = tmp_path_factory.mktemp("stream_good")
    for s in range(6):
        write_tar(folder / f"{s:05d}.tar", [m for k in range(5)
                                            for m in good(f"s{s}k{k}", 10 * s + k,
                                                          size=(24 + 4 * k, 20 + 2 * s))])
    return str(folder / "{00000..00005}.tar")


def test_each_epoch_every_shard_is_read_by_exactly_one_reader():
    for processes, workers in ((1, 0), (2, 3), (3, 1)):
        for epoch in range(3):
            lists = [shard_list.reader_shards(10, 7, epoch, process=p, processes=processes,
                                              worker=w, workers=workers)
                     for p in range(processes) for w in range(max(1, workers))]
            assert sorted(i for shards in lists for i in shards) == list(range(10))
            assert max(map(len, lists)) - min(map(len, lists)) <= 1
    orders = [list(shard_list.epoch_order(10, 7, e)) for e in range(3)]
    assert orders[0] != orders[1] != orders[2]  # a new order each epoch, from (seed, epoch)
    assert orders[0] == list(np.random.default_rng((7, 0)).permutation(10))
    assert list(shard_list.epoch_order(10, 7, 1, shuffle=False)) == list(range(10))


def test_every_good_member_once_per_epoch_and_the_bad_ones_counted(bad_shards):
    files, truth = bad_shards
    spec = StreamSpec(tuple(files), buffer=1, shuffle=False)
    stream = iter(ShardStream(spec, keys))
    out = [next(stream) for _ in range(7)]
    assert [o["key"] for o in out] == list(truth["captions"])  # file order, nothing twice
    assert {o["key"]: o["caption"] for o in out} == truth["captions"]
    want = {**truth["skipped"], "unreadable shard": 1}  # 00003.tar is not a tar
    state = stream.get_state()
    assert state["skipped"] == want
    assert state["failed"] == {files[3]: 1}
    again = [next(stream) for _ in range(7)]  # epoch 1: the same examples, counted again
    assert [o["key"] for o in again] == list(truth["captions"])
    assert {o["epoch"] for o in again} == {1}
    assert stream.get_state()["skipped"] == {k: 2 * v for k, v in want.items()}
    # position t R + r (R = 1): the draws, of which a3's and a4's (undecodable) give nothing
    assert [o["position"] for o in out + again] == [0, 1, 2, 5, 6, 7, 8, 9, 10, 11, 14, 15, 16,
                                                    17]


def test_a_restored_stream_continues_exactly(good_shards):
    """A state taken at any draw, through JSON, restores a fresh iterator (another object,
    its buffer read again from the shards) that yields what the uninterrupted one does, over
    epoch boundaries; for each of 2 processes x 2 workers."""
    files = shard_list.list_shards(good_shards)
    for process in range(2):
        for worker in range(2):
            spec = StreamSpec(tuple(files), seed=3, buffer=6, process=process, processes=2,
                              workers=2)
            dataset = ShardStream(spec, keys)
            dataset.set_slice(slice(worker, None, 2))
            whole = iter(dataset)
            reference = [next(whole) for _ in range(40)]  # 4 epochs of this reader's 10
            for cut in (0, 1, 9, 23):
                first = iter(dataset)
                for _ in range(cut):
                    next(first)
                state = json.loads(json.dumps(first.get_state()))
                resumed = iter(dataset)
                resumed.set_state(state)
                assert [next(resumed) for _ in range(40 - cut)] == reference[cut:]
    # the readers of one epoch together: every example of the 6 shards once
    seen = []
    for process in range(2):
        for worker in range(2):
            spec = StreamSpec(tuple(files), seed=3, buffer=1, process=process, processes=2,
                              workers=2, shuffle=True)
            dataset = ShardStream(spec, keys)
            dataset.set_slice(slice(worker, None, 2))
            reader = iter(dataset)
            n = 5 * len(shard_list.reader_shards(6, 3, 0, process=process, processes=2,
                                                 worker=worker, workers=2))
            seen += [next(reader)["key"] for _ in range(n)]
    assert sorted(seen) == sorted(f"{s:05d}.tar/s{s}k{k}" for s in range(6) for k in range(5))


def _config(pattern: str, **overrides) -> ml_collections.ConfigDict:
    config = default_data_config()
    config.update({"source": "shards", "shards": pattern, "batch_size": 4,
                   "eval_batch_size": 4, "shuffle_buffer": 5, "seed": 1,
                   "preprocess": {"name": "image_text", "image_size": 16, "max_tokens": 8,
                                  "crop": "random"}, **overrides})
    return config


def test_worker_processes_resume_their_batches_exactly(good_shards):
    """grain worker processes (one reader each): the batches after a restored state equal
    the uninterrupted run's, images (random crops from the stream position) included."""
    config = _config(good_shards, worker_count=2)
    spec = stream_spec(config, HostShard(0, 1))
    preprocess = make_preprocess(config, training=True)

    def batches():
        return iter(stream_dataset(spec, preprocess, global_batch_size=4))

    whole = batches()
    reference = [next(whole) for _ in range(9)]
    cut = batches()
    for _ in range(4):
        next(cut)
    state = json.loads(json.dumps(cut.get_state()))
    cut.close()
    resumed = batches()
    resumed.set_state(state)
    for want in reference[4:]:
        got = next(resumed)
        for key in ("image", "caption"):
            np.testing.assert_array_equal(got[key], want[key])
    whole.close()
    resumed.close()
    assert reference[0]["image"].shape == (4, 16, 16, 3)


def test_parquet_shards_stream_the_examples_of_the_same_tars(tmp_path, good_shards):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from contrastive_jax.training.data.shard_readers import tar_examples

    tars = shard_list.list_shards(good_shards)
    for path in tars[:2]:
        rows = list(tar_examples(path, Counter()))
        table = pa.table({"key": [r.key for r in rows], "jpg": [r.image for r in rows],
                          "caption": [r.caption for r in rows]})
        pq.write_table(table, tmp_path / Path(path).name.replace(".tar", ".parquet"),
                       row_group_size=2)
    parquet = shard_list.list_shards(str(tmp_path / "*.parquet"))
    outputs = []
    for files in (tars[:2], parquet):
        stream = iter(ShardStream(StreamSpec(tuple(files), seed=5, buffer=3), keys))
        outputs.append([next(stream) for _ in range(23)])
        state = json.loads(json.dumps(stream.get_state()))
        resumed = iter(ShardStream(StreamSpec(tuple(files), seed=5, buffer=3), keys))
        resumed.set_state(state)
        assert next(resumed) == next(stream)
    strip = [[{**o, "key": o["key"].split("/", 1)[1]} for o in out] for out in outputs]
    assert strip[0] == strip[1]


def test_heldout_shards_are_the_evaluation_split(bad_shards):
    files, truth = bad_shards
    held = HeldoutShards(StreamSpec(tuple(files)))
    assert len(held) == 7
    assert held.skipped == {**truth["skipped"], "unreadable shard": 1}
    assert [held[i]["image/filename"] for i in range(7)] == list(truth["captions"])
    import pickle  # as grain sends it to its worker processes: without the cached shard

    copy = pickle.loads(pickle.dumps(held))
    assert copy._cache is None and copy[6]["image/filename"] == held[6]["image/filename"]
    config = _config(" ".join(files[:1]), heldout_shards=" ".join(files), eval_split="heldout",
                     eval_batch_size=8)
    mesh = make_mesh({"data": -1})
    batches = list(eval_iterator(config, mesh))
    mask = np.concatenate([np.asarray(b["mask"]) for b in batches])
    assert mask.tolist() == [True] * 7 + [False]  # 7 examples in 1 padded batch of 8
    with pytest.raises(ConfigError, match="no split 'train' to evaluate on"):
        eval_iterator(config, mesh, split="train")


def test_bad_input_says_what_to_change(tmp_path, bad_shards, good_shards):
    files, _ = bad_shards
    with pytest.raises(ConfigError, match=r"data.shards '\S+/nope/\{0..3\}.tar': '\S+/0.tar' "
                                          r"matches no file \(and 3 more of its 4 names\)"):
        shard_list.list_shards(str(tmp_path / "nope/{0..3}.tar"))
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match="neither a webdataset tar"):
        shard_list.list_shards(str(tmp_path / "notes.txt"))
    with pytest.raises(ConfigError, match=r"00003\.tar is not a tar file"):
        shard_list.list_shards(files[3])
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"image": [image_bytes(0)], "text": ["a"]}), tmp_path / "p.parquet")
    with pytest.raises(ConfigError, match=r"no column 'jpg' \(its columns: \['image', 'text'\]\)"
                                          r"; set data.image_column"):
        shard_list.list_shards(str(tmp_path / "p.parquet"))
    with pytest.raises(ConfigError, match=r"6 shard\(s\) for 2 process\(es\) x 4 input worker\(s\)"
                                          r" = 8 readers.*lower data.worker_count to 3"):
        stream_spec(_config(good_shards, worker_count=4), HostShard(0, 2))
    with pytest.raises(ConfigError, match="leave it None and set total_steps"):
        stream_spec(_config(good_shards, num_epochs=2), HostShard(0, 1))
    mesh = make_mesh({"data": -1})
    with pytest.raises(ConfigError, match=r"in both data\.shards and data\.heldout_shards"):
        stream_train_iterator(_config(good_shards, heldout_shards=good_shards), mesh)
    # a resume with another shard list: refused in this process, before any reading
    config = _config(good_shards)
    state = stream_train_iterator(config, mesh).get_state()
    other = stream_train_iterator(_config(good_shards.replace("00005", "00004")), mesh)
    assert isinstance(other, StreamBatches)
    with pytest.raises(ConfigError, match="another shard list"):
        other.set_state(state)


def test_a_shard_that_keeps_failing_is_tried_again_then_skipped_and_named(tmp_path, good_shards,
                                                                        monkeypatch):
    """A read that fails with a network-like error (an OSError; here a folder named like a
    shard) is tried 3 times with a back-off, then the shard is skipped for the epoch and named;
    a reader whose shards give no example in a whole epoch stops with a DataError naming
    them."""
    from contrastive_jax.errors import DataError
    from contrastive_jax.training.data.stream import shard_stream

    waits = []
    monkeypatch.setattr(shard_stream.time, "sleep", waits.append)
    broken = tmp_path / "00009.tar"
    broken.mkdir()  # opening it raises IsADirectoryError
    files = (*shard_list.list_shards(good_shards)[:1], str(broken))
    stream = iter(ShardStream(StreamSpec(files, buffer=1, shuffle=False), keys))
    out = [next(stream)["key"] for _ in range(5)]
    assert out == [f"00000.tar/s0k{k}" for k in range(5)]
    state = stream.get_state()
    assert waits == [2.0, 4.0] and state["failed"] == {str(broken): 1}
    assert state["skipped"] == {"unreadable shard": 1}
    only_broken = iter(ShardStream(StreamSpec((str(broken),), buffer=1), keys))
    with pytest.raises(DataError, match=r"read no example from its 1 shard\(s\) in epoch 0 "
                                        r"\(failed: \{'\S+00009.tar': 1\}"):
        next(only_broken)


def test_the_plan_counts_the_streams_measured_host_rate():
    """The plan's host cores for a streamed config: the prepared data's images per
    core-second times the stream's measured ratio to it (gs:// tars 388.9 / 424.3, local
    395.9 / 424.3, experiments/results/image_input_stream.md)."""
    import importlib

    report = importlib.import_module("contrastive_jax.plan.report")  # the package's is a function

    def config(**data):
        return ml_collections.ConfigDict({"data": {"preprocess": {"name": "image_text"},
                                                   **data}})

    prepared = report.host_input(config()).examples_per_core_s
    remote = report.host_input(config(source="shards", shards="gs://b/{0..9}.tar"))
    local = report.host_input(config(source="shards", shards="/data/{0..9}.tar"))
    assert remote.examples_per_core_s == pytest.approx(prepared * 388.9 / 424.3)
    assert local.examples_per_core_s == pytest.approx(prepared * 395.9 / 424.3)
    assert "streamed from gs:// tars (0.92x" in remote.work
    assert remote.work.endswith("experiments/results/image_input_stream.md")
