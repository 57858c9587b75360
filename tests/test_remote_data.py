"""``data.data_dir = gs://...``: a prepared dataset read from a bucket (the loopback GCS server
of tests/test_remote_paths.py) gives the local copy's batches and trains to the same
parameters; a missing dataset or bucket is an error naming it, and an unreachable endpoint is
an error within the bounded wait, not a hang."""

import json
import sys
from pathlib import Path

import gcsfs
import numpy as np
import pytest

from contrastive_jax.errors import DataError, DatasetNotPreparedError
from contrastive_jax.mesh import make_mesh
from contrastive_jax.training import train
from contrastive_jax.training.data import train_iterator
from contrastive_jax.training.data.prepare import prepare
from contrastive_jax.training.data.sources import STORAGE_TIMEOUT_ENV, open_split

sys.path.insert(0, str(Path(__file__).parent))
from test_remote_paths import BUCKET, gcs  # noqa: F401 (the fixture)
from trained_workdirs import simclr_quick_config, simclr_quick_workdir


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


def test_an_unreachable_bucket_is_an_error_within_the_bounded_wait(bucket_data, monkeypatch):
    # every client pointed at a port nobody listens on: each retries for minutes unbounded
    dead = "http://127.0.0.1:9"
    for key in ("STORAGE_EMULATOR_HOST", "CLOUD_STORAGE_EMULATOR_ENDPOINT"):
        monkeypatch.setenv(key, dead)
    monkeypatch.setenv(STORAGE_TIMEOUT_ENV, "3")
    gcsfs.GCSFileSystem.clear_instance_cache()
    with pytest.raises(DataError, match=r"opening mnist1d\[train\] in gs://.* did not answer "
                                        r"within 3 s.*CONTRASTIVE_JAX_STORAGE_TIMEOUT_S"):
        open_split("mnist1d", "train", bucket_data)  # without the bound: minutes, silently
    gcsfs.GCSFileSystem.clear_instance_cache()
