"""Linear probe and kNN on data whose answer is known."""

import numpy as np
import pytest

from contrastive_jax.evaluation import knn_accuracy, linear_probe


def blobs(n, d, classes, spread, seed):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((classes, d)) * 3
    labels = rng.integers(0, classes, n)
    return centres[labels] + spread * rng.standard_normal((n, d)), labels


def test_linear_probe_separable_and_chance():
    x, y = blobs(600, 16, 5, 0.3, 0)
    result = linear_probe(x[:400], y[:400], x[400:], y[400:])
    assert result["accuracy"] == 1.0
    assert set(result["holdout_accuracy"]) == {1e-6, 1e-5, 1e-4, 1e-3, 1e-2}
    rng = np.random.default_rng(1)  # labels independent of the features: chance
    noise = rng.standard_normal((2000, 8))
    labels = rng.integers(0, 4, 2000)
    chance = linear_probe(noise[:1500], labels[:1500], noise[1500:], labels[1500:])
    assert abs(chance["accuracy"] - 0.25) < 0.06


def test_linear_probe_matches_a_known_linear_rule():
    """Labels = argmax of a fixed linear map: a probe recovers it almost exactly, while an
    over-regularised probe picked on held-out data cannot be the worse of the grid."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((10, 3))
    x = rng.standard_normal((3000, 10))
    y = np.argmax(x @ w, axis=1)
    result = linear_probe(x[:2000], y[:2000], x[2000:], y[2000:], l2_grid=(1e-6, 1.0))
    assert result["l2"] == 1e-6 and result["accuracy"] > 0.97
    assert result["holdout_accuracy"][1.0] < result["holdout_accuracy"][1e-6]


def test_knn_on_clusters_and_by_hand():
    x, y = blobs(500, 8, 4, 0.2, 3)
    assert knn_accuracy(x[:400], y[:400], x[400:], y[400:], k=10) == 1.0
    # by hand: one test point, neighbours at cos 1.0 (class 0) and cos 0.8 (two of class 1);
    # weights exp(1/0.07) vs 2 exp(0.8/0.07): class 0 wins at T=0.07, class 1 at T=10
    train = np.array([[1.0, 0.0], [0.8, 0.6], [0.8, -0.6]])
    labels = np.array([0, 1, 1])
    test = np.array([[1.0, 0.0]])
    assert knn_accuracy(train, labels, test, np.array([0]), k=3, temperature=0.07) == 1.0
    assert knn_accuracy(train, labels, test, np.array([1]), k=3, temperature=10.0) == 1.0
    with pytest.raises(ValueError, match="k >= 1"):
        knn_accuracy(train, labels, test, np.array([0]), k=0)
