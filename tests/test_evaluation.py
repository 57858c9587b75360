"""Every evaluation on data whose answer is known."""

import math

import numpy as np
import pytest

from contrastive_jax.training.evaluation import (
    alignment,
    knn_accuracy,
    linear_probe,
    retrieval_recall,
    uniformity,
    zero_shot_accuracy,
    zero_shot_weights,
)


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


def test_zero_shot_recovers_a_known_fraction():
    """Classes along orthogonal axes, 8 noisy templates each; 3 of every 4 samples lie near
    their own class's axis and 1 near the next class's: accuracy exactly 0.75."""
    rng = np.random.default_rng(0)
    classes, d = 10, 16
    axes = np.eye(classes, d)
    prompts = 5.0 * axes[:, None] + 0.3 * rng.standard_normal((classes, 8, d))
    labels = np.arange(400) % classes
    shown = np.where(np.arange(400) % 4 == 3, (labels + 1) % classes, labels)
    samples = axes[shown] + 0.05 * rng.standard_normal((400, d))
    assert zero_shot_accuracy(samples, labels, prompts) == 0.75
    assert zero_shot_accuracy(samples, shown, prompts) == 1.0


def test_zero_shot_weights_are_the_renormalised_mean_of_unit_prompts():
    """Prompt ensembling normalises each prompt first: a long prompt does not dominate."""
    prompts = np.array([[[3.0, 0.0], [0.0, 0.5]]])  # one class, two templates
    np.testing.assert_allclose(zero_shot_weights(prompts), [[2 ** -0.5, 2 ** -0.5]],
                               rtol=1e-15)
    with pytest.raises(ValueError, match="d=3, prompts d=2"):
        zero_shot_accuracy(np.ones((4, 3)), np.zeros(4, int), prompts)


def _slow_recall(x, y, ids, k):
    """Query by query: sort candidates by cosine, wrong ones first among equals."""
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    y = y / np.linalg.norm(y, axis=1, keepdims=True)
    hits = 0
    for i in range(len(x)):
        sims = [float(x[i] @ y[j]) for j in range(len(y))]
        order = sorted(range(len(y)), key=lambda j: (-sims[j], ids[j] == ids[i]))
        hits += any(ids[j] == ids[i] for j in order[:k])
    return hits / len(x)


@pytest.mark.parametrize("shift, expected", [(0, (1, 1, 1)), (2, (0, 1, 1)), (3, (0, 0, 1))])
def test_retrieval_recall_on_a_circle_with_known_ranks(shift, expected):
    """x_i on a circle at angle 2 pi i / n, y_i = x_{i + s}: for query x_i the candidates
    within s steps (2s - 1 of them) and the tie at -s rank before y_i, so its rank is 2s;
    hit@k iff 2s < k, in both directions."""
    n = 40
    angles = 2 * np.pi * np.arange(n) / n
    x = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    y = np.roll(x, -shift, axis=0)
    recall = retrieval_recall(x, y)
    for direction in ("x_to_y", "y_to_x"):
        got = tuple(recall[f"{direction}_r{k}"] for k in (1, 5, 10))
        assert got == expected


def test_retrieval_recall_matches_a_slow_reference_with_duplicate_captions():
    """Random pairs where several samples share a caption (identical text embeddings): with
    caption ids as match ids every identical caption counts; with the default only the pair."""
    rng = np.random.default_rng(3)
    caption_id = rng.integers(0, 12, 60)
    texts = rng.standard_normal((12, 8))[caption_id]
    samples = texts + 0.9 * rng.standard_normal((60, 8))
    for ids in (caption_id, np.arange(60)):
        got = retrieval_recall(samples, texts, match_ids=ids if ids is caption_id else None,
                               ks=(1, 3, 10))
        for k in (1, 3, 10):
            assert got[f"x_to_y_r{k}"] == _slow_recall(samples, texts, ids, k)
            assert got[f"y_to_x_r{k}"] == _slow_recall(texts, samples, ids, k)
    # duplicates are ties with wrong candidates under exact-pair ids: counted against
    assert (retrieval_recall(samples, texts, match_ids=caption_id)["x_to_y_r1"]
            > retrieval_recall(samples, texts)["x_to_y_r1"])


def test_alignment_known_values():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 6))
    assert alignment(x, 3.0 * x) == pytest.approx(0.0, abs=1e-15)  # scale is ignored
    assert alignment(x, -x) == pytest.approx(4.0, rel=1e-14)  # antipodal: ||2 x_hat||^2
    theta = 0.3  # pairs at a fixed angle: ||x_hat - y_hat||^2 = 2 - 2 cos(theta)
    a = np.stack([np.ones(10), np.zeros(10)], 1)
    b = np.stack([np.full(10, math.cos(theta)), np.full(10, math.sin(theta))], 1)
    assert alignment(a, b) == pytest.approx(2 - 2 * math.cos(theta), rel=1e-14)
    assert alignment(a, b, alpha=1) == pytest.approx(math.sqrt(2 - 2 * math.cos(theta)),
                                                     rel=1e-14)


@pytest.mark.parametrize("n", [2, 5, 33])
def test_uniformity_of_a_regular_simplex(n):
    """n unit vectors with pairwise dot -1/(n-1): every ||x_i - x_j||^2 = 2 + 2/(n-1)."""
    simplex = np.eye(n) - 1.0 / n
    t = 2.0
    assert uniformity(simplex, t) == pytest.approx(-t * (2 + 2 / (n - 1)), rel=1e-12)
    assert uniformity(simplex, t, chunk=3) == pytest.approx(uniformity(simplex, t), rel=1e-12)


def test_uniformity_limits():
    """All points equal: 0 (the maximum). n equally spaced points on the circle tend to the
    uniform distribution's -2t + log I_0(2t) (E exp(2t cos theta) = I_0(2t))."""
    assert uniformity(np.ones((7, 3))) == pytest.approx(0.0, abs=1e-15)
    angles = 2 * np.pi * np.arange(2000) / 2000
    circle = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    for t in (0.5, 2.0):
        expected = -2 * t + math.log(np.i0(2 * t))
        assert uniformity(circle, t, chunk=256) == pytest.approx(expected, abs=2e-3)
    with pytest.raises(ValueError, match="at least 2"):
        uniformity(np.ones((1, 3)))
