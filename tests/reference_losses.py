"""Deliberately slow, obvious NumPy references, written line by line from the definitions of
docs/derivations.md (§8.1, §9.1, §10.1).

Plain Python loops over every row, column and candidate, so that nothing is shared with the
vectorised JAX code under test. Similarities are float64; each log-sum-exp and its difference with
the positive logit are evaluated in 50-digit arithmetic (mpmath), so that the reference stays
exact for the tiny losses of well-separated rows (``lse - z_pos`` ~ 1e-13 cancels in float64).
"""

from __future__ import annotations

import math

import mpmath
import numpy as np

mpmath.mp.dps = 50


def normalize_rows(x: np.ndarray) -> np.ndarray:
    """docs/derivations.md §8.1 step 1 (§2): divide each embedding by its L2 norm (a zero row stays
    zero)."""
    out = np.zeros_like(x, dtype=np.float64)
    for i, row in enumerate(np.asarray(x, np.float64)):
        norm = math.sqrt(sum(float(v) * float(v) for v in row))
        out[i] = row / norm if norm > 0 else row
    return out


def logsumexp(values) -> mpmath.mpf:
    """docs/derivations.md §8.1 step 3 (§6.1): m + log(sum exp(v - m)), in 50-digit arithmetic."""
    values = [mpmath.mpf(v) for v in values]
    m = max(values)
    return m + mpmath.log(mpmath.fsum(mpmath.exp(v - m) for v in values))


def clip_loss(x, y, logit_scale: float) -> float:
    """docs/derivations.md §8.1, steps 1-5."""
    xi, yt = normalize_rows(x), normalize_rows(y)
    n = len(xi)
    logits = [[logit_scale * float(np.dot(xi[i], yt[j])) for j in range(n)] for i in range(n)]
    loss_img = 0.0
    for i in range(n):  # step 3: rows, target on the diagonal
        loss_img += logsumexp(logits[i]) - logits[i][i]
    loss_img /= n
    loss_txt = 0.0
    for j in range(n):  # step 4: columns
        column = [logits[i][j] for i in range(n)]
        loss_txt += logsumexp(column) - logits[j][j]
    loss_txt /= n
    return float(0.5 * (loss_img + loss_txt))  # step 5


def nt_xent(z1, z2, tau: float, normalize: bool = True) -> float:
    """docs/derivations.md §9.1 ([SimCLR] Algorithm 1): 2N views, S[i][i] = -inf, positive = the
    other view of the same x.

    ``normalize=False``: dot products instead of cosines (SimCLR Table 5's "no l2 norm").
    """
    n = len(z1)
    views = np.concatenate([np.asarray(z1, np.float64), np.asarray(z2, np.float64)], axis=0)
    views = normalize_rows(views) if normalize else views
    m = 2 * n
    s = [[float(np.dot(views[i], views[j])) / tau for j in range(m)] for i in range(m)]
    total = 0.0
    for i in range(m):
        j = (i + n) % m  # partner_index(i)
        others = [s[i][k] for k in range(m) if k != i]
        total += logsumexp(others) - s[i][j]
    return float(total / m)


def info_nce(logits, positives) -> float:
    """mean_i -log(sum_{j in P(i)} softmax(logits_i)_j); positives: indices or a bool mask."""
    logits = np.asarray(logits, np.float64)
    positives = np.asarray(positives)
    total = 0.0
    for i, row in enumerate(logits):
        pos = [positives[i]] if positives.ndim == 1 else np.nonzero(positives[i])[0]
        finite = [float(v) for v in row if v != -math.inf]
        total += logsumexp(finite) - logsumexp([float(row[j]) for j in pos])
    return float(total / len(logits))


def moco_infonce(q, k, queue, tau: float) -> float:
    """docs/derivations.md §10.1 ([MoCo] §3.1): (1 + K)-way classification, positive q.k first,
    negatives from the queue."""
    qn, kn, qun = normalize_rows(q), normalize_rows(k), normalize_rows(queue)
    total = 0.0
    for i in range(len(qn)):
        row = [float(np.dot(qn[i], kn[i])) / tau]
        row += [float(np.dot(qn[i], qun[j])) / tau for j in range(len(qun))]
        total += logsumexp(row) - row[0]
    return float(total / len(qn))
