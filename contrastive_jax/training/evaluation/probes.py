"""Classification probes on fixed features ``(n, d)`` (no gradient reaches the encoder) with
integer labels.

- :func:`linear_probe`: multinomial logistic regression on standardised features, fitted by
  L-BFGS (optax) to convergence; the L2 strength is picked on a held-out part of the training
  features, then the probe is refitted on all of them (CLIP's linear-probe protocol, [CLIP]
  §3.2 and App. A.3, docs/references.md; not [SimCLR]'s SGD on augmented crops,
  docs/evaluation.md "Linear probe");
- :func:`fewshot_probe`: big_vision's closed-form few-shot probe (ridge regression to +-1
  targets on 1/5/10/25 examples per class, 3 seeds);
- :func:`knn_votes` / :func:`knn_accuracy`: cosine kNN with votes weighted by ``exp(sim / T)``
  ([InstDisc], the usual self-supervised kNN monitor; k = 20, T = 0.07 as [DINO] reports it).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from contrastive_jax.errors import InputError
from contrastive_jax.training.evaluation.geometry import unit_rows
from contrastive_jax.training.evaluation.task_table import KNN_K, KNN_TEMPERATURE

L2_GRID = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2)


def _standardise(train: np.ndarray, *others: np.ndarray):
    mean, std = train.mean(0), train.std(0) + 1e-6
    return [(a - mean) / std for a in (train, *others)]


@jax.jit
def _fit_logistic(x, y_onehot, l2, max_iter):
    """argmin_W,b mean CE(softmax(xW + b), y) + l2 ||W||^2 by L-BFGS (at most max_iter steps)."""
    d, k = x.shape[1], y_onehot.shape[1]

    def objective(params):
        logits = x @ params["w"] + params["b"]
        ce = -jnp.mean(jnp.sum(y_onehot * jax.nn.log_softmax(logits), axis=1))
        return ce + l2 * jnp.sum(params["w"] ** 2)

    solver = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(objective)
    params = {"w": jnp.zeros((d, k), x.dtype), "b": jnp.zeros((k,), x.dtype)}

    def step(carry):
        params, state, i = carry
        value, grad = value_and_grad(params, state=state)
        updates, state = solver.update(grad, state, params, value=value, grad=grad,
                                       value_fn=objective)
        return optax.apply_updates(params, updates), state, i + 1

    def running(carry):
        _, state, i = carry
        grad = optax.tree_utils.tree_get(state, "grad")
        return (i == 0) | ((i < max_iter) & (optax.tree_utils.tree_norm(grad) > 1e-5))

    params, _, _ = jax.lax.while_loop(running, step, (params, solver.init(params), 0))
    return params


def _accuracy(params, x, y) -> float:
    return float(np.mean(np.argmax(np.asarray(x @ params["w"] + params["b"]), 1) == y))


def linear_probe(train_x, train_y, test_x, test_y, *, num_classes: int | None = None,
                 l2_grid: Sequence[float] = L2_GRID, holdout: float = 0.2, seed: int = 0,
                 max_iter: int = 500) -> dict:
    """Test accuracy of a logistic-regression probe; the L2 strength chosen on held-out data.

    ``holdout`` of the training rows (a seeded permutation) score each value of ``l2_grid``;
    the best is refitted on every training row and scored on the test rows. Returns
    ``{"accuracy", "l2", "holdout_accuracy": {l2: acc}}``.
    """
    test_y = np.asarray(test_y)
    logits, best, scores = linear_probe_logits(train_x, train_y, test_x, test_y,
                                               num_classes=num_classes, l2_grid=l2_grid,
                                               holdout=holdout, seed=seed, max_iter=max_iter)
    return {"accuracy": float(np.mean(np.argmax(logits, 1) == test_y)), "l2": best,
            "holdout_accuracy": scores}


def linear_probe_logits(train_x, train_y, test_x, test_y=None, *,
                        num_classes: int | None = None, l2_grid: Sequence[float] = L2_GRID,
                        holdout: float = 0.2, seed: int = 0, max_iter: int = 500
                        ) -> tuple[np.ndarray, float, dict[float, float]]:
    """``(test logits (n_test, C), the chosen l2, {l2: held-out accuracy})`` of the probe of
    :func:`linear_probe` (CLIP's linear-probe protocol: logistic regression on frozen features,
    the regulariser chosen on a held-out part of the training split, [CLIP] Sec. 3.2 and
    App. A.3): ``min_{W,b} mean_i CE(softmax(x_i W + b), y_i) + l2 ||W||^2`` on standardised
    features (the training rows' mean and std). ``test_y`` only widens the class count.
    """
    train_x, test_x = np.asarray(train_x, np.float32), np.asarray(test_x, np.float32)
    train_y = np.asarray(train_y)
    if train_x.ndim != 2 or test_x.ndim != 2 or train_x.shape[1] != test_x.shape[1]:
        raise InputError(f"features must be (n, d) with equal d; got {train_x.shape}, "
                         f"{test_x.shape}")
    top = train_y.max() if test_y is None or not np.size(test_y) else \
        max(train_y.max(), np.max(test_y))
    k = int(num_classes or top + 1)
    order = np.random.default_rng(seed).permutation(len(train_x))
    cut = int(len(train_x) * (1 - holdout))
    fit, held = order[:cut], order[cut:]
    scores = {}
    fit_x, held_x = _standardise(train_x[fit], train_x[held])
    for l2 in l2_grid:
        params = _fit_logistic(jnp.asarray(fit_x), jax.nn.one_hot(train_y[fit], k),
                               jnp.float32(l2), max_iter)
        scores[float(l2)] = _accuracy(params, held_x, train_y[held])
    best = max(scores, key=lambda l2: (scores[l2], l2))  # ties: the stronger regulariser
    all_x, tst_x = _standardise(train_x, test_x)
    params = _fit_logistic(jnp.asarray(all_x), jax.nn.one_hot(train_y, k), jnp.float32(best),
                           max_iter)
    return np.asarray(tst_x @ params["w"] + params["b"]), best, scores


FEWSHOT_SHOTS = (1, 5, 10, 25)
FEWSHOT_SEEDS = (0, 1, 2)
FEWSHOT_L2 = 2.0 ** 10
FEWSHOT_BIAS = 100.0  # the constant feature that carries the bias (almost unregularised)


def fewshot_probe(train_x, train_y, test_x, test_y, *, num_classes: int,
                  shots: Sequence[int] = FEWSHOT_SHOTS, seeds: Sequence[int] = FEWSHOT_SEEDS,
                  l2: float = FEWSHOT_L2) -> dict[str, float]:
    """big_vision's closed-form few-shot probe: ``{"{s}shot": mean accuracy over the seeds,
    "{s}shot_seed{r}": each seed's}`` for each ``s`` in ``shots``.

    For seed ``r``, each class's training rows are permuted by ``numpy.random.default_rng(r)``
    (classes in order, one generator per seed) and the first ``s`` kept (fewer when a class has
    fewer). On those rows: features standardised by their own mean and std (+ 1e-5), a constant
    feature ``FEWSHOT_BIAS`` appended, targets ``2 onehot(y) - 1``, and the ridge regression
    ``W = (X^T X + l2 I)^-1 X^T Y`` (computed as ``X^T (X X^T + l2 I)^-1 Y`` when there are
    fewer rows than features: the same matrix); a test row predicts ``argmax_c (x W)_c``
    (ties to the lower class). docs/evaluation.md, "Few-shot probe"; Zhai et al. 2022 [LiT] /
    big_vision's ``fewshot_lsr`` evaluator, ``l2 = 2^10`` by default.
    """
    train_x, test_x = np.asarray(train_x, np.float64), np.asarray(test_x, np.float64)
    train_y, test_y = np.asarray(train_y), np.asarray(test_y)
    if train_x.ndim != 2 or test_x.ndim != 2 or train_x.shape[1] != test_x.shape[1]:
        raise InputError(f"features must be (n, d) with equal d; got {train_x.shape}, "
                         f"{test_x.shape}")
    if not shots or min(shots) < 1 or l2 <= 0:
        raise InputError(f"need shots >= 1 and l2 > 0; got shots={tuple(shots)}, l2={l2}")
    out: dict[str, float] = {}
    for r in seeds:
        rng = np.random.default_rng(r)
        per_class = [rng.permutation(np.flatnonzero(train_y == c)) for c in range(num_classes)]
        for s in shots:
            rows = np.concatenate([idx[:s] for idx in per_class])
            w, mean, std = ridge_classifier(train_x[rows], train_y[rows], num_classes, l2)
            pred = np.argmax(_with_bias((test_x - mean) / std) @ w, axis=1)
            out[f"{s}shot_seed{r}"] = float(np.mean(pred == test_y))
    for s in shots:
        out[f"{s}shot"] = float(np.mean([out[f"{s}shot_seed{r}"] for r in seeds]))
    return out


def ridge_classifier(x, y, num_classes: int, l2: float
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(W (d + 1, C), mean (d,), std (d,))`` of :func:`fewshot_probe`'s regression on rows
    ``x (n, d)`` with labels ``y (n,)`` (float64)."""
    mean, std = x.mean(0), x.std(0) + 1e-5
    a = _with_bias((x - mean) / std)
    targets = 2.0 * np.eye(num_classes)[y] - 1.0
    n, d = a.shape
    if n >= d:
        w = np.linalg.solve(a.T @ a + l2 * np.eye(d), a.T @ targets)
    else:
        w = a.T @ np.linalg.solve(a @ a.T + l2 * np.eye(n), targets)
    return w, mean, std


def _with_bias(x: np.ndarray) -> np.ndarray:
    return np.concatenate([x, np.full((len(x), 1), FEWSHOT_BIAS)], axis=1)


KNN_SCORE_BUDGET = 2 ** 27  # similarities per device call (512 MiB of float32)


def knn_votes(train_x, train_y, test_x, *, k: int = KNN_K, temperature: float = KNN_TEMPERATURE,
              num_classes: int | None = None, chunk: int | None = None) -> np.ndarray:
    """Weighted cosine kNN scores ``(n_test, C)`` float32: test row ``i`` gives class ``c``
    ``v_ic = sum_{j in top-k(i)} exp((s_ij - m_i) / T) [y_j = c]``, with
    ``s_ij = <x_i, t_j> / (|x_i| |t_j|)`` and ``m_i = max_j s_ij``.

    train_x (n, d), train_y (n,) ints, test_x (m, d); ``top-k(i)``: the ``min(k, n)`` training
    rows of highest ``s_ij`` (``jax.lax.top_k``; of equal similarities the lower index first).
    ``C = num_classes`` (default ``max(train_y) + 1``). The vote of [InstDisc] and [DINO]
    (``sum exp(s / T)``; k = 20, T = 0.07 by default, as [DINO] reports), docs/derivations.md
    §17.2, scaled per row by ``exp(-m_i / T)``: the nearest neighbour weighs 1, no row's ranking
    of the classes changes, and the votes stay finite for any ``T > 0`` (``exp(1 / T)``
    overflows float32 below ``T = 0.0113``).

    Memory: the device holds the unit training rows, their labels as integers, and the
    similarities of ``chunk`` test rows to all of them (default: as many rows as keep those
    within :data:`KNN_SCORE_BUDGET`, at most 1,024; ImageNet's 1.28 million training images:
    104 test rows a call, [DINO]'s 100) plus ``chunk x k x C`` one-hot votes.
    """
    if k < 1 or temperature <= 0:
        raise InputError(f"need k >= 1 and temperature > 0; got k={k}, T={temperature}")
    train_x, test_x = np.asarray(train_x, np.float32), np.asarray(test_x, np.float32)
    train_y = np.asarray(train_y)
    if train_x.ndim != 2 or test_x.ndim != 2 or train_x.shape[1] != test_x.shape[1] or \
            train_y.shape != (len(train_x),) or not len(train_x):
        raise InputError(f"need train (n, d) with n >= 1 labels and test (m, d); got "
                         f"{train_x.shape}, {train_y.shape}, {test_x.shape}")
    classes = int(num_classes or train_y.max() + 1)
    chunk = chunk or min(1024, max(1, KNN_SCORE_BUDGET // len(train_x)))
    train_n, test_n = jnp.asarray(unit_rows(train_x)), unit_rows(test_x)
    labels = jnp.asarray(train_y, jnp.int32)
    k = min(k, len(train_x))
    out = [np.asarray(_knn_chunk(jnp.asarray(test_n[start:start + chunk]), train_n, labels, k,
                                 classes, jnp.float32(temperature)))
           for start in range(0, len(test_n), chunk)]
    return np.concatenate(out) if out else np.zeros((0, classes), np.float32)


@functools.partial(jax.jit, static_argnums=(3, 4))
def _knn_chunk(test, train, labels, k: int, classes: int, temperature):
    top, idx = jax.lax.top_k(test @ train.T, k)
    weights = jnp.exp((top - top[:, :1]) / temperature)
    return jnp.einsum("nk,nkc->nc", weights, jax.nn.one_hot(labels[idx], classes,
                                                             dtype=weights.dtype))


def knn_accuracy(train_x, train_y, test_x, test_y, *, k: int = KNN_K,
                 temperature: float = KNN_TEMPERATURE, num_classes: int | None = None,
                 chunk: int | None = None) -> float:
    """Top-1 accuracy of :func:`knn_votes` (the predicted class: the first of the highest
    votes)."""
    train_y, test_y = np.asarray(train_y), np.asarray(test_y)
    classes = int(num_classes or max(train_y.max(), test_y.max()) + 1)
    votes = knn_votes(train_x, train_y, test_x, k=k, temperature=temperature,
                      num_classes=classes, chunk=chunk)
    return float(np.mean(np.argmax(votes, 1) == test_y))
