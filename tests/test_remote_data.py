"""``data.data_dir = gs://...``: a prepared dataset read from a bucket (the loopback GCS server
of tests/test_remote_paths.py) gives the local copy's batches and trains to the same
parameters; a missing dataset or bucket is an error naming it, and an unreachable endpoint is
an error within the bounded wait, not a hang."""

import json
import re
import subprocess
import sys
from pathlib import Path

import gcsfs
import numpy as np
import pytest

from contrastive_jax.errors import DatasetNotPreparedError
from contrastive_jax.mesh import make_mesh
from contrastive_jax.training import train
from contrastive_jax.training.data import train_iterator
from contrastive_jax.training.data.prepare import prepare
from contrastive_jax.training.data.sources import STORAGE_TIMEOUT_ENV, open_split

sys.path.insert(0, str(Path(__file__).parent))
from test_remote_paths import BUCKET, gcs  # noqa: F401 (the fixture)
from trained_workdirs import simclr_quick_config, simclr_quick_workdir
from xla_environment import child_environment


@pytest.fixture(scope="module")
def bucket_data(gcs):  # noqa: F811 (the fixture above)
    """``gs://BUCKET/tfds`` holding a copy of the prepared mnist1d (the quick configs' data)."""
    local = prepare("mnist1d", verbose=False)  # the run's data dir (tests/conftest.py)
    fs = gcsfs.GCSFileSystem()
    fs.put(str(Path(local.data_dir).parent), f"{BUCKET}/tfds/mnist1d", recursive=True)
    return f"gs://{BUCKET}/tfds"


def test_a_run_on_gs_data_reads_the_local_batches_and_trains_the_same_model(bucket_data,
                                                                            tmp_path):
    config = simclr_quick_config()
    mesh = make_mesh({"data": -1})
    local = train_iterator(config.data, mesh)
    config.data.data_dir = bucket_data
    remote = train_iterator(config.data, mesh)
    for _ in range(2):
        a, b = next(local), next(remote)
        for key in a:
            np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]))
    results = train.train_and_evaluate(config, str(tmp_path / "remote"))
    want = json.loads((simclr_quick_workdir(tmp_path / "local") / "results.json").read_text())
    assert results["steps"] == 6
    assert results["params_sha256"] == want["params_sha256"]


def test_a_missing_dataset_or_bucket_names_it(bucket_data):
    with pytest.raises(DatasetNotPreparedError, match=r"(?s)'digits' is not prepared in "
                                                      rf"data_dir gs://{BUCKET}/tfds \(not there"
                                                      r"\).*prepare digits"):
        open_split("digits", "train", bucket_data)
    with pytest.raises(DatasetNotPreparedError, match="gs://no-such-bucket-here/tfds"):
        open_split("mnist1d", "train", "gs://no-such-bucket-here/tfds")


def test_an_unreachable_bucket_is_an_error_within_the_bounded_wait(bucket_data):
    """In a child process: the storage call left waiting in its thread (the bound cannot stop
    it) must not outlive the test, and its clients must not see this process's settings."""
    dead = "http://127.0.0.1:9"  # every client pointed at a port nobody listens on
    env = {**child_environment(), "STORAGE_EMULATOR_HOST": dead,
           "CLOUD_STORAGE_EMULATOR_ENDPOINT": dead, STORAGE_TIMEOUT_ENV: "3"}
    code = ("from contrastive_jax.training.data.sources import open_split\n"
            f"open_split('mnist1d', 'train', {bucket_data!r})")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)  # without the bound: minutes of silent retries
    assert run.returncode == 1
    assert re.search(r"DataError: opening mnist1d\[train\] in gs://\S+ did not answer within "
                     r"3 s\..*CONTRASTIVE_JAX_STORAGE_TIMEOUT_S", run.stderr), run.stderr[-2000:]


def test_shards_in_a_bucket_convert_like_local_ones(bucket_data, tmp_path):
    """convert_shards reads gs:// tars (a brace range) as it reads local ones."""
    from test_convert_shards import good, write_tar

    from contrastive_jax.training.data import convert_shards

    fs = gcsfs.GCSFileSystem()
    for i in range(2):
        write_tar(tmp_path / f"{i:05d}.tar", [m for k in range(3) for m in good(f"k{i}{k}",
                                                                                3 * i + k)])
        fs.put(str(tmp_path / f"{i:05d}.tar"), f"{BUCKET}/shards/{i:05d}.tar")
    remote = convert_shards.convert_dataset([f"gs://{BUCKET}/shards/{{00000..00001}}.tar"],
                                            "remote",
                                            str(tmp_path / "out"), workers=1, log=lambda line: None)
    local = convert_shards.convert_dataset([str(tmp_path / "0000[01].tar")], "local",
                                           str(tmp_path / "out"), workers=1, log=lambda line: None)
    assert remote["examples"] == local["examples"] == 6
    folder = tmp_path / "out"
    for shard in range(2):
        a = (folder / "remote/1.0.0" / f"remote-train.array_record-{shard:05d}-of-00002")
        b = (folder / "local/1.0.0" / f"local-train.array_record-{shard:05d}-of-00002")
        assert a.read_bytes() == b.read_bytes()  # the same records, byte for byte


def test_a_tokenizer_built_into_a_bucket_loads_from_it_with_the_local_ids(bucket_data, tmp_path):
    """The pod recipe's tokenizer path: ``build_tokenizer --output=gs://...`` writes the model
    into the bucket, and ``data.preprocess.tokenizer.path = gs://...`` loads it; the ids equal
    those of the same build written locally."""
    from contrastive_jax.training.data import build_tokenizer
    from contrastive_jax.training.data.text.text_tokenizers import load_tokenizer

    local = prepare("digit_captions/mnist1d", verbose=False)
    data_dir = str(Path(local.data_dir).parents[1])
    common = ["--dataset=digit_captions/mnist1d", f"--data_dir={data_dir}", "--split=train",
              "--caption_key=caption", "--vocab_size=40"]
    remote = f"gs://{BUCKET}/tokenizers/digits.model"
    assert build_tokenizer.main([*common, f"--output={remote}"]) == 0
    assert build_tokenizer.main([*common, f"--output={tmp_path / 'digits.model'}"]) == 0
    assert gcsfs.GCSFileSystem().exists(remote.removeprefix("gs://"))
    from_bucket = load_tokenizer({"kind": "sentencepiece", "path": remote})
    from_disk = load_tokenizer({"kind": "sentencepiece", "path": str(tmp_path / "digits.model")})
    texts = ["a signal of the digit seven", "three"]
    for text in texts:
        np.testing.assert_array_equal(from_bucket.encode(text, 12), from_disk.encode(text, 12))
    assert all(np.any(np.asarray(from_bucket.encode(t, 12)) != 0) for t in texts)
