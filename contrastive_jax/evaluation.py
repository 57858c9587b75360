"""Evaluation of frozen representations (all deterministic, NumPy/JAX arrays in, floats out).

Classification from features ``(n, d)`` and integer labels (004: linear probing):

- :func:`linear_probe`: multinomial logistic regression on standardised features, fitted by
  L-BFGS (optax) to convergence; the L2 strength is picked on a held-out part of the training
  features, then the probe is refitted on all of them.
- :func:`knn_accuracy`: cosine kNN with votes weighted by ``exp(sim / T)`` (Wu et al. 2018,
  the usual SSL kNN monitor).

Dual encoders (CLIP, 001), on the normalised embeddings the loss compares:

- :func:`zero_shot_accuracy`: each class's weight is the mean of its normalised prompt
  embeddings over templates, renormalised (CLIP's prompt ensembling); predict the class of
  highest cosine.
- :func:`retrieval_recall`: Recall@k in both directions; a query is a hit when a correct
  candidate ranks in its top k, ties with wrong candidates counted against it.

Geometry of the embedding (Wang & Isola 2020, "Understanding contrastive representation
learning through alignment and uniformity on the hypersphere"):

- :func:`alignment`: ``E ||x_hat - y_hat||^alpha`` over positive pairs (0 = perfectly aligned).
- :func:`uniformity`: ``log E_{i != j} exp(-t ||x_hat_i - x_hat_j||^2)`` (0 = all points equal,
  more negative = more uniform on the sphere).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

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
    train_x, test_x = np.asarray(train_x, np.float32), np.asarray(test_x, np.float32)
    train_y, test_y = np.asarray(train_y), np.asarray(test_y)
    if train_x.ndim != 2 or test_x.ndim != 2 or train_x.shape[1] != test_x.shape[1]:
        raise ValueError(f"features must be (n, d) with equal d; got {train_x.shape}, "
                         f"{test_x.shape}")
    k = int(num_classes or max(train_y.max(), test_y.max()) + 1)
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
    return {"accuracy": _accuracy(params, tst_x, test_y), "l2": best,
            "holdout_accuracy": scores}


def knn_accuracy(train_x, train_y, test_x, test_y, *, k: int = 20, temperature: float = 0.07,
                 num_classes: int | None = None, chunk: int = 1024) -> float:
    """Weighted cosine kNN: each test row votes ``sum_{j in top-k} exp(sim_j / T) [y_j = c]``."""
    if k < 1 or temperature <= 0:
        raise ValueError(f"need k >= 1 and temperature > 0; got k={k}, T={temperature}")
    train_y, test_y = np.asarray(train_y), np.asarray(test_y)
    classes = int(num_classes or max(train_y.max(), test_y.max()) + 1)
    train_n = _unit(np.asarray(train_x, np.float32))
    test_n = _unit(np.asarray(test_x, np.float32))
    k = min(k, len(train_n))
    labels = jax.nn.one_hot(train_y, classes)
    correct = 0
    for start in range(0, len(test_n), chunk):
        sims = jnp.asarray(test_n[start:start + chunk]) @ jnp.asarray(train_n).T
        top, idx = jax.lax.top_k(sims, k)
        votes = jnp.einsum("nk,nkc->nc", jnp.exp(top / temperature), labels[idx])
        correct += int(np.sum(np.argmax(np.asarray(votes), 1) == test_y[start:start + chunk]))
    return correct / len(test_n)


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def _matrix(name: str, x, ndim: int = 2) -> np.ndarray:
    x = np.asarray(x, np.float64)
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} axes; got shape {x.shape}")
    return x


def zero_shot_weights(prompt_embeddings) -> np.ndarray:
    """Class weights ``(C, d)`` from prompt embeddings ``(C, T, d)`` (T templates per class).

    ``w_c = normalise(mean_t normalise(e_ct))``: CLIP's prompt ensembling (Radford et al.
    2021, Sec. 3.1.4). A ``(C, d)`` input is one template per class.
    """
    e = np.asarray(prompt_embeddings, np.float64)
    if e.ndim == 2:
        e = e[:, None]
    if e.ndim != 3:
        raise ValueError(f"prompt embeddings must be (classes, templates, d); got {e.shape}")
    return _unit(_unit(e).mean(axis=1))


def zero_shot_accuracy(sample_embeddings, labels, prompt_embeddings) -> float:
    """Accuracy of ``argmax_c cos(x_i, w_c)`` with ``w`` from :func:`zero_shot_weights`.

    sample_embeddings (n, d) from the sample tower, labels (n,) ints in [0, C),
    prompt_embeddings (C, T, d) or (C, d) from the text tower. No training on labels.
    """
    x = _matrix("sample_embeddings", sample_embeddings)
    w = zero_shot_weights(prompt_embeddings)
    labels = np.asarray(labels)
    if w.shape[1] != x.shape[1]:
        raise ValueError(f"sample embeddings have d={x.shape[1]}, prompts d={w.shape[1]}")
    if labels.shape != (len(x),) or labels.min() < 0 or labels.max() >= len(w):
        raise ValueError(f"labels must be ({len(x)},) ints in [0, {len(w)}); got shape "
                         f"{labels.shape}, range [{labels.min()}, {labels.max()}]")
    return float(np.mean(np.argmax(_unit(x) @ w.T, axis=1) == labels))


def _recall(queries, candidates, query_ids, candidate_ids, ks, chunk) -> dict[int, float]:
    hits = {k: 0 for k in ks}
    for start in range(0, len(queries), chunk):
        sims = queries[start:start + chunk] @ candidates.T
        correct = query_ids[start:start + chunk, None] == candidate_ids[None, :]
        if not correct.any(axis=1).all():
            raise ValueError("a query has no correct candidate (check the match ids)")
        best = np.where(correct, sims, -np.inf).max(axis=1)
        # wrong candidates at least as close as the best correct one: its rank (0 = first)
        rank = np.sum(~correct & (sims >= best[:, None]), axis=1)
        for k in ks:
            hits[k] += int(np.sum(rank < k))
    return {k: hits[k] / len(queries) for k in ks}


def retrieval_recall(x, y, *, match_ids=None, ks: Sequence[int] = (1, 5, 10),
                     chunk: int = 1024) -> dict[str, float]:
    """Recall@k of pair retrieval by cosine similarity, both directions.

    x (n, d) and y (n, d): ``x[i]`` and ``y[i]`` are a pair (a sample and its caption).
    ``x_to_y``: query ``x[i]``, candidates all of ``y``; ``y_to_x`` the other way. A candidate
    ``j`` is correct for query ``i`` iff ``match_ids[j] == match_ids[i]`` (default
    ``arange(n)``: only the pair itself; pass caption ids so that identical captions, which
    have identical embeddings, all count). Returns ``{"x_to_y_r1": ..., "y_to_x_r10": ...}``.
    """
    x, y = _matrix("x", x), _matrix("y", y)
    if x.shape != y.shape:
        raise ValueError(f"x and y must be paired (n, d) arrays of one shape; got {x.shape} "
                         f"and {y.shape}")
    if not ks or min(ks) < 1:
        raise ValueError(f"ks must be positive integers; got {ks}")
    ids = np.arange(len(x)) if match_ids is None else np.asarray(match_ids)
    if ids.shape != (len(x),):
        raise ValueError(f"match_ids must be ({len(x)},); got {ids.shape}")
    x, y = _unit(x), _unit(y)
    out = {}
    for name, (q, c) in {"x_to_y": (x, y), "y_to_x": (y, x)}.items():
        for k, r in _recall(q, c, ids, ids, tuple(ks), chunk).items():
            out[f"{name}_r{k}"] = r
    return out


def alignment(x, y, alpha: float = 2.0) -> float:
    """``mean_i ||x_hat_i - y_hat_i||^alpha`` over positive pairs (Wang & Isola 2020, Eq. 4).

    x, y (n, d), paired by row; normalised here. In [0, 2^alpha]: 0 when every pair points
    the same way, 2^alpha when every pair is antipodal.
    """
    x, y = _matrix("x", x), _matrix("y", y)
    if x.shape != y.shape:
        raise ValueError(f"x and y must have one shape; got {x.shape} and {y.shape}")
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0; got {alpha}")
    return float(np.mean(np.linalg.norm(_unit(x) - _unit(y), axis=1) ** alpha))


def uniformity(x, t: float = 2.0, chunk: int = 1024) -> float:
    """``log mean_{i != j} exp(-t ||x_hat_i - x_hat_j||^2)`` (Wang & Isola 2020, Eq. 5).

    x (n, d), n >= 2, normalised here; all ordered pairs ``i != j`` (the same mean as over
    ``i < j``). In [-4t, 0]: 0 when all points coincide. Computed in float64 with a stable
    log-sum-exp in chunks (memory ``O(chunk * n)``). Reference values: on the unit circle the
    uniform distribution gives ``-2t + log I_0(2t)``; ``n`` vertices of a regular simplex give
    ``-t (2 + 2 / (n - 1))``.
    """
    x = _unit(_matrix("x", x))
    n = len(x)
    if n < 2:
        raise ValueError(f"uniformity needs at least 2 points; got {n}")
    if t <= 0:
        raise ValueError(f"t must be > 0; got {t}")
    parts = []
    for start in range(0, n, chunk):
        block = x[start:start + chunk]
        d2 = np.maximum(2.0 - 2.0 * block @ x.T, 0.0)  # ||a - b||^2 of unit vectors
        rows = np.arange(len(block))
        d2[rows, start + rows] = np.inf  # i == j left out
        e = -t * d2
        top = e.max()
        parts.append(top + np.log(np.sum(np.exp(e - top))))
    parts = np.asarray(parts)
    top = parts.max()
    return float(top + np.log(np.sum(np.exp(parts - top))) - np.log(n * (n - 1)))
