"""The benchmark metrics (docs/evaluation.md, "Metrics") against slow, obvious references:

- top-k accuracy and mean per-class recall of class scores (ties to the lower class index, a
  class with no example left out; scikit-learn's ``balanced_accuracy_score`` for the latter,
  CLIP_benchmark's definition);
- image-text retrieval Recall@k with several captions per image, in chunks (a full stable sort
  of every query's candidates as the reference; chunk sizes down to one query);
- big_vision's closed-form few-shot probe (the primal ridge solution in float64 as reference,
  its per-class seeded sampling);
- the linear probe: scikit-learn's ``LogisticRegression`` (the L-BFGS logistic regression CLIP's
  paper used) fitted in float64 to convergence on the same standardised rows, for each L2
  strength on the held-out split and for the chosen one on all training rows; the accuracy of
  :func:`linear_probe` is its logits'.
"""

import jax
import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import balanced_accuracy_score

from contrastive_jax.errors import InputError
from contrastive_jax.training.evaluation.classification_metrics import classification_metrics
from contrastive_jax.training.evaluation.probes import (
    fewshot_probe,
    linear_probe,
    linear_probe_logits,
    ridge_classifier,
)
from contrastive_jax.training.evaluation.retrieval import caption_retrieval_recall


def reference_classification(scores, labels, ks):
    """Each row's classes sorted by a stable sort of -score: the label's position."""
    out = {}
    order = [np.argsort(-row, kind="stable") for row in scores]
    rank = np.array([int(np.flatnonzero(o == y)[0]) if np.isfinite(row).all() else 10**9
                     for o, y, row in zip(order, labels, scores, strict=True)])
    for k in ks:
        if k <= scores.shape[1]:
            out[f"acc{k}"] = float(np.mean(rank < k))
    pred = np.array([o[0] if np.isfinite(row).all() else -1
                     for o, row in zip(order, scores, strict=True)])
    recalls = [np.mean(pred[labels == c] == c) for c in range(scores.shape[1])
               if np.any(labels == c)]
    out["mean_per_class_recall"] = float(np.mean(recalls))
    return out, pred


def test_classification_metrics_equal_the_sorting_reference_with_ties_and_empty_classes():
    rng = np.random.default_rng(0)
    # scores on a coarse grid: many ties; class 6 of 7 has no example
    scores = rng.integers(0, 4, size=(300, 7)).astype(np.float64)
    labels = rng.integers(0, 6, size=300)
    got = classification_metrics(scores, labels, ks=(1, 2, 5, 7))
    want, pred = reference_classification(scores, labels, (1, 2, 5, 7))
    assert got == pytest.approx(want, abs=1e-12)
    assert got["acc7"] == 1.0 and 0.1 < got["acc1"] < 0.5
    # scikit-learn's balanced accuracy of the first-maximum predictions (it leaves out a class
    # that only predictions name, as here class 6)
    with pytest.warns(UserWarning, match="y_pred contains classes not in y_true"):
        sk = balanced_accuracy_score(labels, np.argmax(scores, axis=1))
    assert got["mean_per_class_recall"] == pytest.approx(sk, abs=1e-12)
    assert np.array_equal(pred, np.argmax(scores, axis=1))


def test_a_non_finite_score_is_wrong_at_every_k_and_bad_shapes_say_what_is_wrong():
    scores = np.array([[0.9, 0.1, 0.0], [np.nan, 1.0, 0.0], [0.0, 0.2, 0.1]])
    got = classification_metrics(scores, np.array([0, 1, 1]), ks=(1, 3))
    assert got == {"acc1": 2 / 3, "acc3": 2 / 3, "mean_per_class_recall": 0.75}
    assert "acc5" not in got  # 3 classes
    with pytest.raises(InputError, match=r"labels must be integers in \[0, 3\)"):
        classification_metrics(scores, np.array([0, 1, 3]))
    with pytest.raises(InputError, match="scores must be"):
        classification_metrics(scores[0], np.array([0]))


def reference_caption_recall(images, texts, owner, ks):
    """A stable sort of every query's candidates by -cosine; the first correct one's place."""
    images = images / np.linalg.norm(images, axis=1, keepdims=True)
    texts = texts / np.linalg.norm(texts, axis=1, keepdims=True)
    s = images @ texts.T
    out = {}
    to_text = [int(np.flatnonzero(owner[np.argsort(-s[i], kind="stable")] == i)[0])
               for i in range(len(images))]
    to_image = [int(np.flatnonzero(np.argsort(-s[:, t], kind="stable") == owner[t])[0])
                for t in range(len(texts))]
    for k in ks:
        out[f"image_to_text_r{k}"] = float(np.mean(np.array(to_text) < k))
        out[f"text_to_image_r{k}"] = float(np.mean(np.array(to_image) < k))
        out[f"mean_r{k}"] = (out[f"image_to_text_r{k}"] + out[f"text_to_image_r{k}"]) / 2
    return out


@pytest.mark.parametrize("budget", [1, 37, 2 ** 24])
def test_caption_retrieval_counts_every_caption_and_equals_the_full_sort(budget):
    """5 captions per image (and one image with 2): a chunk of one query, a ragged chunk, all
    at once; identical captions and images, so that scores tie."""
    rng = np.random.default_rng(1)
    owner = np.concatenate([np.repeat(np.arange(11), 5), [11, 11]])
    rng.shuffle(owner)
    images = rng.integers(-2, 3, size=(12, 4)).astype(np.float64) + 0.5
    texts = images[owner] + rng.integers(-2, 3, size=(len(owner), 4))
    texts[::3] = texts[1::3][:len(texts[::3])]  # identical captions (of other images): ties
    images[5] = images[2]  # two identical images
    with jax.enable_x64(True):
        got = caption_retrieval_recall(images, texts, owner, ks=(1, 5, 10),
                                       score_budget=budget)
    want = reference_caption_recall(images, texts, owner, (1, 5, 10))
    assert got == pytest.approx(want, abs=1e-12)
    assert 0 < got["text_to_image_r1"] < 1 and 0 < got["image_to_text_r1"] < 1


def test_caption_retrieval_in_float32_and_its_input_checks():
    rng = np.random.default_rng(2)
    owner = np.repeat(np.arange(40), 5)
    images = rng.normal(size=(40, 16)).astype(np.float32)
    texts = (images[owner] + 1.5 * rng.normal(size=(200, 16))).astype(np.float32)
    got = caption_retrieval_recall(images, texts, owner, score_budget=1000)
    want = reference_caption_recall(images.astype(np.float64), texts.astype(np.float64),
                                    owner, (1, 5, 10))
    assert got == pytest.approx(want, abs=1e-12)
    texts[3, 0] = np.nan  # that caption is never retrieved, nor finds its image
    nan = caption_retrieval_recall(images, texts, owner)
    assert nan["text_to_image_r10"] <= want["text_to_image_r10"]
    with pytest.raises(InputError, match=r"images \[39\] have no caption"):
        caption_retrieval_recall(images, texts[:195], owner[:195])
    with pytest.raises(InputError, match="one width"):
        caption_retrieval_recall(images[:, :8], texts, owner)


def test_fewshot_probe_is_the_ridge_solution_on_each_seeds_per_class_sample():
    rng = np.random.default_rng(3)
    classes, d = 4, 6
    means = 3 * rng.normal(size=(classes, d))
    train_y = rng.integers(0, classes, size=120)
    train_x = means[train_y] + rng.normal(size=(120, d))
    test_y = rng.integers(0, classes, size=80)
    test_x = means[test_y] + rng.normal(size=(80, d))
    got = fewshot_probe(train_x, train_y, test_x, test_y, num_classes=classes,
                        shots=(1, 5), seeds=(0, 1), l2=2.0 ** 10)
    for seed in (0, 1):
        rng_s = np.random.default_rng(seed)
        per_class = [rng_s.permutation(np.flatnonzero(train_y == c)) for c in range(classes)]
        for shots in (1, 5):
            rows = np.concatenate([p[:shots] for p in per_class])
            x = train_x[rows]
            mean, std = x.mean(0), x.std(0) + 1e-5
            a = np.hstack([(x - mean) / std, np.full((len(x), 1), 100.0)])
            y = 2 * np.eye(classes)[train_y[rows]] - 1
            w = np.linalg.inv(a.T @ a + 2.0 ** 10 * np.eye(d + 1)) @ a.T @ y  # primal
            t = np.hstack([(test_x - mean) / std, np.full((80, 1), 100.0)])
            acc = np.mean(np.argmax(t @ w, 1) == test_y)
            assert got[f"{shots}shot_seed{seed}"] == pytest.approx(acc, abs=1e-12)
            # the dual form (fewer rows than features at 1 shot) is the same matrix
            w_got, _, _ = ridge_classifier(x, train_y[rows], classes, 2.0 ** 10)
            np.testing.assert_allclose(w_got, w, rtol=1e-9, atol=1e-12)
    assert got["5shot"] == pytest.approx((got["5shot_seed0"] + got["5shot_seed1"]) / 2)
    assert got["5shot"] > 0.8  # separable classes: the probe works


def test_linear_probe_logits_give_the_probes_accuracy():
    rng = np.random.default_rng(4)
    means = 2 * rng.normal(size=(3, 5))
    train_y, test_y = rng.integers(0, 3, 90), rng.integers(0, 3, 30)
    train_x = means[train_y] + rng.normal(size=(90, 5))
    test_x = means[test_y] + rng.normal(size=(30, 5))
    logits, l2, held = linear_probe_logits(train_x, train_y, test_x, l2_grid=(1e-4, 1e-2))
    probe = linear_probe(train_x, train_y, test_x, test_y, l2_grid=(1e-4, 1e-2))
    assert logits.shape == (30, 3) and l2 == probe["l2"] and held == probe["holdout_accuracy"]
    assert probe["accuracy"] == classification_metrics(logits, test_y)["acc1"] > 0.8


def reference_logistic_logits(fit_x, fit_y, test_x, l2):
    """scikit-learn's multinomial logistic regression in float64 (intercept unpenalised):
    ``sum_i CE_i + ||W||^2 / (2C)`` is ``n`` times the probe's ``mean_i CE_i + l2 ||W||^2`` at
    ``C = 1 / (2 n l2)``; features standardised by the fitted rows' mean and std (+ 1e-6)."""
    mean, std = fit_x.mean(0), fit_x.std(0) + 1e-6
    model = LogisticRegression(C=1 / (2 * len(fit_x) * l2), tol=1e-12, max_iter=100_000)
    model.fit((fit_x - mean) / std, fit_y)
    return model.decision_function((test_x - mean) / std)


def test_linear_probe_is_scikit_learns_logistic_regression_on_the_held_out_choice():
    rng = np.random.default_rng(4)
    means = rng.normal(size=(3, 5))  # overlapping classes: the l2 choice matters
    train_y, test_y = rng.integers(0, 3, 90), rng.integers(0, 3, 30)
    train_x = means[train_y] + rng.normal(size=(90, 5))
    test_x = means[test_y] + rng.normal(size=(30, 5))
    grid = (1e-3, 1e-1)
    logits, l2, held = linear_probe_logits(train_x, train_y, test_x, l2_grid=grid)
    order = np.random.default_rng(0).permutation(90)  # the probe's seeded 20% held out
    fit, out = order[:72], order[72:]
    want = {g: float(np.mean(np.argmax(reference_logistic_logits(
        train_x[fit], train_y[fit], train_x[out], g), 1) == train_y[out])) for g in grid}
    assert held == want and l2 == max(grid, key=lambda g: (want[g], g)) == 0.1
    reference = reference_logistic_logits(train_x, train_y, test_x, l2)

    def centred(z):  # logits are defined up to a constant per row (softmax's shift)
        return z - z.mean(1, keepdims=True)

    np.testing.assert_allclose(centred(logits), centred(reference), atol=2e-4)
