"""grain pipelines: seeded streams, per-host shards, checkpointable state, global arrays."""

import grain
import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import PartitionSpec as P

from contrastive_jax.errors import ConfigError
from contrastive_jax.mesh import make_mesh
from contrastive_jax.training.data import (
    HostShard,
    default_data_config,
    eval_dataset,
    eval_iterator,
    open_split,
    standard_preprocess,
    train_dataset,
    train_iterator,
)


@pytest.fixture(scope="module")
def mnist1d_test():
    return open_split("mnist1d", "test")  # 1000 examples


def indices(ds, steps):
    it = iter(ds)
    return [np.asarray(next(it)["index"]) for _ in range(steps)]


def test_same_seed_same_stream_other_seed_other_stream(mnist1d_test):
    def make(seed):
        return train_dataset(mnist1d_test, global_batch_size=50, seed=seed,
                             shard=HostShard(0, 1))
    a, b, c = indices(make(0), 5), indices(make(0), 5), indices(make(1), 5)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(np.concatenate(a), np.concatenate(c))


def test_each_epoch_is_a_new_permutation_of_the_split(mnist1d_test):
    ds = train_dataset(mnist1d_test, global_batch_size=100, seed=3, shard=HostShard(0, 1))
    stream = np.concatenate(indices(ds, 30))  # 3 epochs of 1000
    epochs = stream.reshape(3, 1000)
    for epoch in epochs:
        np.testing.assert_array_equal(np.sort(epoch), np.arange(1000))
    assert not np.array_equal(epochs[0], epochs[1])
    assert not np.array_equal(epochs[0], np.arange(1000))  # shuffled


def test_two_processes_get_disjoint_shards_whose_union_is_the_split(mnist1d_test):
    steps = 1000 // 40  # one epoch of global batches of 40
    single = indices(train_dataset(mnist1d_test, global_batch_size=40, seed=7,
                                   shard=HostShard(0, 1)), steps)
    hosts = [indices(train_dataset(mnist1d_test, global_batch_size=40, seed=7,
                                   shard=HostShard(p, 2)), steps) for p in range(2)]
    assert hosts[0][0].shape == (20,)
    first, second = np.concatenate(hosts[0]), np.concatenate(hosts[1])
    assert not set(first) & set(second)
    np.testing.assert_array_equal(np.sort(np.concatenate([first, second])), np.arange(1000))
    # each step's global batch is the same set of examples as with one process
    for k in range(steps):
        np.testing.assert_array_equal(np.sort(np.concatenate([hosts[0][k], hosts[1][k]])),
                                      np.sort(single[k]))


def test_finite_epochs_give_every_host_the_same_number_of_batches(mnist1d_test):
    counts = [len(list(train_dataset(mnist1d_test, global_batch_size=48, seed=0, num_epochs=2,
                                     shard=HostShard(p, 3)))) for p in range(3)]
    assert counts == [2000 // 48] * 3


def test_restored_state_continues_the_exact_stream(mnist1d_test):
    ds = train_dataset(mnist1d_test, global_batch_size=64, seed=5, shard=HostShard(1, 2),
                       read_options=grain.ReadOptions(num_threads=2, prefetch_buffer_size=3))
    it = iter(ds)
    for _ in range(17):  # past the first epoch boundary (1000 / 64)
        next(it)
    state = it.get_state()
    expected = [np.asarray(next(it)["index"]) for _ in range(4)]
    fresh = iter(ds)
    fresh.set_state(state)
    got = [np.asarray(next(fresh)["index"]) for _ in range(4)]
    assert all(np.array_equal(x, y) for x, y in zip(expected, got, strict=True))


def test_a_state_saved_by_two_processes_continues_one_process_at_the_same_batch(mnist1d_test):
    """What ``--resplit_data`` relies on (run/checkpoints.py): every process's saved state is
    the batch index, so one process set to it reads the global batch the two would have."""
    hosts = [iter(train_dataset(mnist1d_test, global_batch_size=40, seed=3,
                                shard=HostShard(p, 2))) for p in range(2)]
    for it in hosts:
        for _ in range(30):  # past the first epoch boundary (1000 / 40)
            next(it)
    states = [it.get_state() for it in hosts]
    assert states[0] == states[1] == {"next_index": 30}
    both = np.concatenate([np.asarray(next(it)["index"]) for it in hosts])
    single = iter(train_dataset(mnist1d_test, global_batch_size=40, seed=3,
                                shard=HostShard(0, 1)))
    single.set_state(states[1])
    np.testing.assert_array_equal(np.sort(np.asarray(next(single)["index"])), np.sort(both))


def config_for(**overrides):
    config = default_data_config()
    config.update(overrides)
    return config


def test_train_iterator_gives_global_arrays_sharded_over_data():
    mesh = make_mesh({"data": -1})
    it = train_iterator(config_for(batch_size=16, seed=2), mesh)
    batch = next(it)
    assert batch["signal"].shape == (16, 40, 1) and batch["signal"].dtype == np.float32
    assert batch["label"].dtype == np.int32
    assert batch["signal"].sharding.spec == P("data")
    assert len(batch["signal"].sharding.device_set) == jax.device_count() == 8
    host = next(iter(train_dataset(open_split("mnist1d", "train"), global_batch_size=16,
                                   seed=2, shard=HostShard(0, 1))))
    for key in host:
        np.testing.assert_array_equal(np.asarray(batch[key]), host[key])


def test_checkpointed_iterator_restores_through_orbax(tmp_path):
    mesh = make_mesh({"data": -1})
    config = config_for(batch_size=8, seed=11)
    it = train_iterator(config, mesh)
    for _ in range(6):
        next(it)
    manager = ocp.CheckpointManager(tmp_path / "ckpt")
    manager.save(6, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
    manager.wait_until_finished()
    expected = [np.asarray(next(it)["index"]) for _ in range(3)]
    fresh = train_iterator(config, mesh)
    manager.restore(6, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(fresh)))
    got = [np.asarray(next(fresh)["index"]) for _ in range(3)]
    assert all(np.array_equal(x, y) for x, y in zip(expected, got, strict=True))
    manager.close()


def test_eval_pass_covers_the_split_once_with_padding(mnist1d_test):
    hosts = [list(eval_dataset(mnist1d_test, global_batch_size=96, shard=HostShard(p, 2)))
             for p in range(2)]
    assert len(hosts[0]) == len(hosts[1]) == 11  # ceil(1000 / 96)
    seen = np.concatenate([b["index"][b["mask"]] for host in hosts for b in host])
    np.testing.assert_array_equal(np.sort(seen), np.arange(1000))
    assert sum(int((~b["mask"]).sum()) for host in hosts for b in host) == 11 * 96 - 1000
    padding = hosts[1][-1]
    assert (padding["signal"][~padding["mask"]] == 0).all()
    mesh = make_mesh({"data": -1})
    batches = list(eval_iterator(config_for(eval_batch_size=200), mesh))
    assert len(batches) == 5 and all(b["mask"].shape == (200,) for b in batches)
    assert int(sum(b["mask"].sum() for b in batches)) == 1000


def test_preprocess_types_and_feature_selection():
    pre = standard_preprocess(("image", "label"))
    out = pre({"image": np.full((8, 8, 1), 255, np.uint8), "label": 3, "index": 1})
    assert set(out) == {"image", "label"}
    assert out["image"].dtype == np.float32 and out["image"].max() == 1.0
    assert out["label"].dtype == np.int32
    with pytest.raises(ConfigError, match=r"data\.features"):
        pre({"label": 1})


def test_images_arrive_as_floats_in_unit_range():
    mesh = make_mesh({"data": -1})
    batch = next(train_iterator(config_for(name="digits", batch_size=32), mesh))
    image = np.asarray(batch["image"])
    assert image.shape == (32, 8, 8, 1) and image.dtype == np.float32
    assert 0.0 <= image.min() and image.max() <= 1.0 and image.max() > 0.5


def test_generated_dataset_through_the_same_pipeline():
    mesh = make_mesh({"data": -1})
    config = config_for(name="correlated_gaussians", batch_size=64,
                        options={"dim": 20, "mutual_information": 6.0, "num_examples": 640})
    batch = next(train_iterator(config, mesh))
    assert batch["x"].shape == (64, 20) and batch["y"].shape == (64, 20)


def test_bad_configs_say_what_to_change(mnist1d_test):
    mesh = make_mesh({"data": -1})
    with pytest.raises(ValueError, match=r"unknown data config fields.*batchsize"):
        train_iterator(ml_collections.ConfigDict({"batchsize": 8}), mesh)
    with pytest.raises(ValueError, match="process count 3"):
        train_dataset(mnist1d_test, global_batch_size=8, seed=0, shard=HostShard(0, 3))
    with pytest.raises(ValueError, match="fewer than one global batch"):
        train_dataset(mnist1d_test, global_batch_size=2000, seed=0, shard=HostShard(0, 1))
    with pytest.raises(ValueError, match="8"):  # 12 rows over 8 devices
        next(train_iterator(config_for(batch_size=12), mesh))
    # the evaluation batch is checked when the training stream is built (before any training),
    # and the message names the evaluation field
    with pytest.raises(ConfigError, match=r"data.eval_batch_size must be a positive integer; "
                                          r"got 0"):
        train_iterator(config_for(batch_size=8, eval_batch_size=0), mesh)
    with pytest.raises(ConfigError, match=r"process count 3; change data\.eval_batch_size"):
        eval_dataset(mnist1d_test, global_batch_size=8, shard=HostShard(0, 3))


def test_image_text_preprocess_resizes_crops_and_tokenises(tmp_path):
    from contrastive_jax.training.data.example_preprocessing import image_text_preprocess

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("<pad>\n<unk>\n<bos>\n<eos>\na\nphoto\nof\ndog\n")
    pre = image_text_preprocess(image_size=16, max_tokens=5, vocabulary=str(vocab))
    # 20 x 40 image: left half 0, right half 255; the shorter side becomes 16 (32 wide), the
    # centre 16 columns are kept: 8 dark then 8 bright
    image = np.zeros((20, 40, 3), np.uint8)
    image[:, 20:] = 255
    out = pre({"image": image, "captions": {"text": [b"A photo of a dog.", b"other"]}})
    assert out["image"].shape == (16, 16, 3) and out["image"].dtype == np.uint8  # to the device
    np.testing.assert_array_equal(out["image"][:, :6], 0)  # bicubic rings next to the edge
    np.testing.assert_array_equal(out["image"][:, 10:], 255)
    # <bos> a photo of <eos> in the file's ids, cut at 5 tokens
    np.testing.assert_array_equal(out["caption"], [2, 4, 5, 6, 3])
    with pytest.raises(ConfigError, match=r"\(H, W, 3\) uint8"):
        pre({"image": image[..., 0], "captions": {"text": ["a"]}})
    # extra_features: the label beside them, as the standard preprocessing gives it
    labelled = image_text_preprocess(image_size=16, max_tokens=5, vocabulary=str(vocab),
                                     extra_features=("label",))
    out = labelled({"image": image, "captions": {"text": [b"a dog"]}, "label": np.int64(7)})
    assert sorted(out) == ["caption", "image", "label"]
    assert out["label"] == 7 and out["label"].dtype == np.int32
    with pytest.raises(ConfigError, match=r"features \['label'\] not in the dataset; it has "
                                          r"\['captions', 'image'\]; change "
                                          r"data.preprocess.extra_features"):
        labelled({"image": image, "captions": {"text": [b"a dog"]}})
    with pytest.raises(ConfigError, match=r"extra_features must be a list of feature names"):
        image_text_preprocess(image_size=16, vocabulary=str(vocab), extra_features="label")
