"""Geometry of normalised embeddings: alignment and uniformity on the sphere.

Wang & Isola 2020, "Understanding contrastive representation learning through alignment and
uniformity on the hypersphere" ([AlignUniform], docs/references.md; docs/derivations.md).
"""

from __future__ import annotations

import numpy as np

from contrastive_jax.errors import InputError


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Each row divided by its norm (a zero row stays zero): (..., d) -> (..., d)."""
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def as_matrix(name: str, x, ndim: int = 2) -> np.ndarray:
    """``x`` as a float64 array of ``ndim`` axes; an :class:`InputError` naming ``name`` if not."""
    x = np.asarray(x, np.float64)
    if x.ndim != ndim:
        raise InputError(f"{name} must have {ndim} axes; got shape {x.shape}")
    return x


def alignment(x, y, alpha: float = 2.0) -> float:
    """``mean_i ||x_hat_i - y_hat_i||^alpha`` over positive pairs (Wang & Isola 2020, Eq. 4).

    x, y (n, d), paired by row; normalised here. In [0, 2^alpha]: 0 when every pair points
    the same way, 2^alpha when every pair is antipodal.
    """
    x, y = as_matrix("x", x), as_matrix("y", y)
    if x.shape != y.shape:
        raise InputError(f"x and y must have one shape; got {x.shape} and {y.shape}")
    if alpha <= 0:
        raise InputError(f"alpha must be > 0; got {alpha}")
    return float(np.mean(np.linalg.norm(unit_rows(x) - unit_rows(y), axis=1) ** alpha))


def uniformity(x, t: float = 2.0, chunk: int = 1024) -> float:
    """``log mean_{i != j} exp(-t ||x_hat_i - x_hat_j||^2)`` (Wang & Isola 2020, Eq. 5).

    x (n, d), n >= 2, normalised here; all ordered pairs ``i != j`` (the same mean as over
    ``i < j``). In [-4t, 0]: 0 when all points coincide. Computed in float64 with a stable
    log-sum-exp in chunks (memory ``O(chunk * n)``). Reference values: on the unit circle the
    uniform distribution gives ``-2t + log I_0(2t)``; ``n`` vertices of a regular simplex give
    ``-t (2 + 2 / (n - 1))``.
    """
    x = unit_rows(as_matrix("x", x))
    n = len(x)
    if n < 2:
        raise InputError(f"uniformity needs at least 2 points; got {n}")
    if t <= 0:
        raise InputError(f"t must be > 0; got {t}")
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
