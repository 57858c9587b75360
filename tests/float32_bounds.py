"""What float32 can guarantee for the contrastive losses: tolerances derived, not tuned.

Every float32 test of a loss asserts ``|got - exact| <= bound``, with ``bound`` computed here from
the test's own data by a first-order rounding-error analysis (Higham, *Accuracy and Stability of
Numerical Algorithms*, 2nd ed., ch. 2-3). ``u = 2^-24`` is float32's unit roundoff and
``gamma(n) = n u / (1 - n u)``.

Assumptions, the only ones:

- A1. IEEE float32 with round-to-nearest. Sums and dot products may run in any order (XLA
  reassociates, vectorises and blocks them differently per processor and flag): every order
  obeys the ``gamma(n)`` bounds below, which is what makes the tests independent of the CPU.
- A2. XLA's float32 ``exp``, ``log``, ``log1p``, ``softplus`` and ``sigmoid`` are within
  ``C_FN u`` (4 ulps) of the exact result wherever that result is a normal number (measured on
  2M arguments: at most 5u, also with XLA's reassociating fast-math flags).
- A3. A result below float32's smallest normal number (``TINY``) is off by at most ``TINY``.

The derivation, step by step (each function below names its step):

1. Cosines (:func:`cosine_error`). A row normalised in float32, ``x / max(||x||, eps)``, has
   components with relative error ``<= gamma(d) / 2 + 2u`` (the sum of squares ``gamma(d)``,
   halved by the square root, plus the root's and the division's roundings); the dot product of
   two such rows adds ``gamma(d) sum_k |x_k y_k| <= gamma(d)``.
   So ``|c_32 - c| <= 2 gamma(d) + 4u``.
2. Logits (:func:`logit_error`). ``z = s c`` (or ``c / tau``):
   ``|z_32 - z| <= s |c_32 - c| + u |z| <= Delta_z``.
3. One InfoNCE row, ``l = softplus(t)``, ``t = log sum_{j in neg} exp(z_j - z_pos)``. Perturbing
   the logits moves ``t`` by at most ``2 Delta_z`` (``sum_j |dt/dz_j| = 2``). Evaluating ``t`` from
   the float32 logits, in any of the library's forms (max shift, differences to it, ``exp``, a sum
   of K positive terms, ``log``, the difference to the positive), adds
   ``delta_t <= u (6 M + K + C_FN (1 + log K) + log K)`` with ``M = max |z|`` (:func:`eval_error`).
   Then ``dl/dt = sigmoid(t) = 1 - e^{-l}`` and ``softplus`` itself adds ``C_FN u l``.
4. The loss, ``L = sum_i w_i l_i`` over A rows (:func:`loss_bound`):
   ``|L_32 - L| <= sum_i w_i [(1 - e^{-l_i}) (2 Delta_z + delta_t) + C_FN u l_i]
   + (A + 1) u L + TINY``.
   Since ``1 - e^{-l} <= min(l, 1)``, this is at most ``(2 Delta_z + delta_t + ...) L``: a small
   multiple of ``eps * max|logit|`` relative to the loss, the size of the rounding of one logit.
5. Gradients (:func:`clip_grad_bounds`, :func:`nt_xent_grad_bounds`). With
   ``Gamma = dL/dZ``, each float32 entry ``p_ij = exp(z_ij - lse_i)`` (and ``1 - p_pos``) has
   relative error ``eps_G <= 2 Delta_z + delta_t + 2 C_FN u``; ``g = s Gamma Y_hat`` in float32 is
   off by ``s (eps_G + gamma(N) + gamma(d) / 2 + 2u) |Gamma| |Y_hat|`` row by row, and the
   normalisation's VJP ``(g - (x_hat . g) x_hat) / ||x||`` adds ``(3 gamma(d) + 8u) |g| / ||x||``.
   The logit-scale gradient ``sum_ij Gamma_ij z_ij`` is off by
   ``(eps_G + gamma(N^2)) sum |Gamma| |z| + Delta_z sum |Gamma|``. Bounds are on the Frobenius
   norm of each gradient.

What a bound can and cannot catch: it is what float32 guarantees, so any error larger than the
rounding of one logit fails it: each row's hardest negative dropped, the positive counted among
the negatives, a scale off by 1e-3 (``tests/test_float32_bounds.py`` shows each failing on 36
data sets). A scale off by one
float32 ulp changes every logit by at most ``eps |z|``, less than the rounding ``s c`` itself
incurs: no float32 test can tell it from rounding, and the float64 tests (1e-12) catch it.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

U = 2.0**-24  # float32 unit roundoff (eps / 2)
C_FN = 8.0  # A2: elementary functions within 8u
TINY = float(np.finfo(np.float32).tiny)  # A3


def gamma(n: int) -> float:
    """``n u / (1 - n u)``: the relative error bound of an n-term float32 sum or dot product."""
    return n * U / (1.0 - n * U)


def cosine_error(dim: int) -> float:
    """Step 1: bound on ``|c_32 - c|`` for the cosine of two float32 rows of length ``dim``."""
    return 2.0 * gamma(dim) + 4.0 * U


def logit_error(scale: float, max_logit: float, dim: int | None, *,
                scale_roundings: float = 1.0, extra_cosine_error: float = 0.0) -> float:
    """Step 2: ``Delta_z``. ``dim=None``: the logits are given exactly (``info_nce``).

    ``scale_roundings``: relative roundings (in u) between the exact ``scale`` and the float32
    number each logit is multiplied by, plus the product's own (1): a learned scale is
    ``exp(log_scale)`` (C_FN more), a temperature's reciprocal one more (see
    :func:`scale_of`). ``extra_cosine_error``: more error in the cosines than step 1's.
    """
    cos = 0.0 if dim is None else scale * (cosine_error(dim) + extra_cosine_error)
    return cos + scale_roundings * U * max_logit


def scale_of(kind: str, third, max_scale: float = 100.0) -> tuple[float, float]:
    """The exact scale a float32 loss stands for and its ``scale_roundings``.

    CLIP: ``third`` is the float32 log-scale; the exact scale is ``min(e^third, max_scale)`` and
    the loss's float32 ``exp`` adds ``C_FN`` u (none where the cap binds: the scale is then
    ``max_scale`` exactly). NT-Xent
    and MoCo: ``third`` is the float32 temperature; the scale ``1 / tau`` is rounded once.
    """
    third = float(np.float32(third))
    if kind == "clip":
        scale = math.exp(third)
        return (max_scale, 1.0) if scale >= max_scale else (scale, 1.0 + C_FN)
    return 1.0 / third, 2.0


def eval_error(max_logit: float, negatives: int) -> float:
    """Step 3: ``delta_t``, the evaluation of a row's ``t`` from its float32 logits."""
    k = max(negatives, 1)
    return U * (6.0 * max_logit + k + C_FN * (1.0 + math.log(k)) + math.log(k))


class Dense(NamedTuple):
    """Float64 quantities of a dense InfoNCE-type loss that the bounds are computed from.

    ``logits`` (A, K) with ``-inf`` where excluded, ``positive`` (A,) index of each row's
    positive, ``weights`` (A,) the weight of each row in the loss, ``rows`` (A,) the row losses,
    ``gamma`` the gradient of the loss w.r.t. ``logits`` (finite entries only).
    """

    logits: np.ndarray
    positive: np.ndarray
    weights: np.ndarray
    rows: np.ndarray
    gamma: np.ndarray

    @property
    def loss(self) -> float:
        return float(np.sum(self.weights * self.rows))

    @property
    def max_logit(self) -> float:
        finite = self.logits[np.isfinite(self.logits)]
        return float(np.max(np.abs(finite)))

    @property
    def negatives(self) -> int:
        return int(np.max(np.sum(np.isfinite(self.logits), axis=1))) - 1


def dense_info_nce(logits, positive, weights) -> Dense:
    """:class:`Dense` of ``sum_i w_i (-log softmax(logits_i)[positive_i])``, one positive a row."""
    z = np.asarray(logits, np.float64)
    positive = np.asarray(positive)
    weights = np.broadcast_to(np.asarray(weights, np.float64), positive.shape)
    a = np.arange(z.shape[0])
    z_pos = z[a, positive]
    gaps = np.where(np.isfinite(z), z - z_pos[:, None], -np.inf)
    gaps[a, positive] = -np.inf
    shift = np.max(gaps, axis=1, keepdims=True)
    t = shift[:, 0] + np.log(np.sum(np.exp(gaps - shift), axis=1))
    rows = np.logaddexp(0.0, t)
    lse = z_pos + np.logaddexp(0.0, t)
    p = np.where(np.isfinite(z), np.exp(z - lse[:, None]), 0.0)
    p[a, positive] = np.expm1(-rows)  # p_pos - 1 = e^{-l} - 1, without cancellation
    return Dense(z, positive, weights, rows, weights[:, None] * p)


def loss_bound(parts: Dense | list[Dense], delta_z: float) -> float:
    """Step 4: bound on ``|L_32 - L|`` for a loss that is the sum of the ``parts``' losses."""
    parts = parts if isinstance(parts, list) else [parts]
    total, loss, rows = 0.0, 0.0, 0
    for part in parts:
        delta_t = eval_error(part.max_logit, part.negatives)
        sens = -np.expm1(-part.rows)  # 1 - e^{-l} = sigmoid(t)
        total += float(np.sum(part.weights * (sens * (2.0 * delta_z + delta_t)
                                              + C_FN * U * part.rows)))
        loss += part.loss
        rows += part.rows.shape[0]
    return total + (rows + 1) * U * abs(loss) + TINY


def _normalise(x) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, np.float64)
    norms = np.maximum(np.linalg.norm(x, axis=1), 1e-12)
    return x / norms[:, None], norms


def clip_dense(x, y, scale: float, direction: str = "both") -> list[Dense]:
    """The float64 parts of ``clip_loss``: rows (x -> y) and/or columns (y -> x)."""
    x_hat, _ = _normalise(x)
    y_hat, _ = _normalise(y)
    z = scale * x_hat @ y_hat.T
    n = z.shape[0]
    w_row, w_col = {"both": (0.5, 0.5), "x_to_y": (1.0, 0.0), "y_to_x": (0.0, 1.0)}[direction]
    parts = []
    if w_row:
        parts.append(dense_info_nce(z, np.arange(n), w_row / n))
    if w_col:
        parts.append(dense_info_nce(z.T, np.arange(n), w_col / n))
    return parts


def nt_xent_dense(z1, z2, tau: float) -> Dense:
    """The float64 part of ``nt_xent`` over the 2N views, self-similarity excluded."""
    z_hat, _ = _normalise(np.concatenate([np.asarray(z1), np.asarray(z2)]))
    m = z_hat.shape[0]
    s = z_hat @ z_hat.T / tau
    s[np.arange(m), np.arange(m)] = -np.inf
    return dense_info_nce(s, (np.arange(m) + m // 2) % m, 1.0 / m)


def moco_dense(q, k, queue, tau: float) -> Dense:
    """The float64 part of ``moco_infonce``: row i is [q_i . k_i, q_i . queue] / tau."""
    q_hat, _ = _normalise(q)
    k_hat, _ = _normalise(k)
    queue_hat, _ = _normalise(queue)
    logits = np.concatenate([np.sum(q_hat * k_hat, axis=1, keepdims=True),
                             q_hat @ queue_hat.T], axis=1) / tau
    return dense_info_nce(logits, np.zeros(len(q_hat), int), 1.0 / len(q_hat))


def siglip_bound(x, y, scale: float, bias: float, delta_z: float) -> tuple[float, float]:
    """``(exact loss, bound)`` for SigLIP's ``(1/N) sum_ij softplus(-z_ij (s c_ij + b))``.

    Steps 2-4 for independent binary terms: each pair's logit is off by ``Delta_z`` plus the
    rounding of ``+ b``, ``u (M + |b|)``; ``|d softplus(-z l) / dl| = sigmoid(-z l)``;
    ``softplus`` adds ``C_FN u`` of each term and the sum of N^2 terms ``gamma(N^2)``.
    """
    x_hat, _ = _normalise(x)
    y_hat, _ = _normalise(y)
    n = x_hat.shape[0]
    logits = scale * x_hat @ y_hat.T + bias
    signed = -(2 * np.eye(n) - 1) * logits
    loss = float(np.sum(np.logaddexp(0.0, signed))) / n
    sens = float(np.sum(1.0 / (1.0 + np.exp(-signed)))) / n
    max_logit = float(np.max(np.abs(scale * x_hat @ y_hat.T)))
    per_logit = delta_z + U * (max_logit + abs(bias))
    return loss, sens * per_logit + (C_FN + gamma(n * n) / U + 1) * U * loss + TINY


def _vjp_rows(g_abs, g, norms, dim: int, coeff: float) -> np.ndarray:
    """Step 5, row by row: the error of the normalisation VJP of ``g`` (N, d) at the unit rows."""
    rows = coeff * np.linalg.norm(g_abs, axis=1) + (3 * gamma(dim) + 8 * U) * np.linalg.norm(
        g, axis=1)
    return rows / norms


def clip_grad_bounds(x, y, scale: float, direction: str, delta_z: float
                     ) -> tuple[np.ndarray, np.ndarray, float]:
    """Step 5 for ``clip_loss``: per-row error bounds (N,) of ``grad_x`` and ``grad_y`` and the
    bound of ``grad_log_scale`` (for an unclipped scale; it is exactly 0 where the clip is
    active)."""
    x_hat, nx = _normalise(x)
    y_hat, ny = _normalise(y)
    n, dim = x_hat.shape
    parts = clip_dense(x, y, scale, direction)
    gam = np.zeros((n, n))
    for part, side in zip(parts, _directions(direction), strict=True):
        gam += part.gamma.T if side == "cols" else part.gamma
    z = scale * x_hat @ y_hat.T
    eps_g = (2 * delta_z + max(eval_error(p.max_logit, p.negatives) for p in parts)
             + 2 * C_FN * U)
    coeff = eps_g + gamma(n) + gamma(dim) / 2 + 2 * U
    bx = _vjp_rows(scale * np.abs(gam) @ np.abs(y_hat), scale * gam @ y_hat, nx, dim, coeff)
    by = _vjp_rows(scale * np.abs(gam).T @ np.abs(x_hat), scale * gam.T @ x_hat, ny, dim, coeff)
    bs = (eps_g + gamma(n * n)) * float(np.sum(np.abs(gam * z))) + delta_z * float(
        np.sum(np.abs(gam)))
    return bx, by, bs


def _directions(direction: str) -> list[str]:
    return {"both": ["rows", "cols"], "x_to_y": ["rows"], "y_to_x": ["cols"]}[direction]


def nt_xent_grad_bounds(z1, z2, tau: float, delta_z: float
                        ) -> tuple[np.ndarray, np.ndarray, float]:
    """Step 5 for ``nt_xent``: per-row error bounds (N,) of ``grad_z1``, ``grad_z2`` and the
    bound of ``grad_tau``."""
    z_hat, norms = _normalise(np.concatenate([np.asarray(z1), np.asarray(z2)]))
    m, dim = z_hat.shape
    part = nt_xent_dense(z1, z2, tau)
    g = part.gamma
    eps_g = 2 * delta_z + eval_error(part.max_logit, part.negatives) + 2 * C_FN * U
    coeff = eps_g + gamma(2 * m) + gamma(dim) / 2 + 2 * U
    rows = _vjp_rows((np.abs(g) + np.abs(g).T) @ np.abs(z_hat) / tau, (g + g.T) @ z_hat / tau,
                     norms, dim, coeff)
    s = np.where(np.isfinite(part.logits), part.logits, 0.0)
    bt = ((eps_g + gamma(m * m)) * float(np.sum(np.abs(g * s))) + delta_z * float(
        np.sum(np.abs(g)))) / tau + U * abs(float(np.sum(g * s)) / tau)
    n = m // 2
    return rows[:n], rows[n:], bt


def encoder_grad_bounds(a, b, w, grad_x, grad_y, rows_x, rows_y) -> tuple[float, float, float]:
    """Bounds (Frobenius) on the errors of ``grad_w``, ``grad_a``, ``grad_b`` of
    ``loss(a @ w, b @ w)``, from the float64 embedding gradients and their per-row bounds.

    For rows ``a @ w`` computed exactly in float32 (small dyadic numbers: the tests choose them
    so), the loss's bounds hold unchanged for the embeddings.

    ``grad_w = a^T grad_x + b^T grad_y``: the bounds propagated through the products plus the
    products' own rounding, ``gamma(N) || |a|^T |grad_x| ||``; ``grad_a = grad_x w^T`` alike.
    """
    a, b, w = (np.asarray(v, np.float64) for v in (a, b, w))
    gx, gy = np.asarray(grad_x, np.float64), np.asarray(grad_y, np.float64)
    ex, ey = float(np.linalg.norm(rows_x)), float(np.linalg.norm(rows_y))
    n = a.shape[0]
    bw = (np.linalg.norm(a, 2) * ex + np.linalg.norm(b, 2) * ey
          + gamma(n) * (np.linalg.norm(np.abs(a).T @ np.abs(gx))
                        + np.linalg.norm(np.abs(b).T @ np.abs(gy))))
    w_norm, d = np.linalg.norm(w, 2), w.shape[1]
    ba = w_norm * ex + gamma(d) * np.linalg.norm(np.abs(gx) @ np.abs(w).T)
    bb = w_norm * ey + gamma(d) * np.linalg.norm(np.abs(gy) @ np.abs(w).T)
    return float(bw), float(ba), float(bb)


class Bounds(NamedTuple):
    """Float32 bounds for one loss evaluation: on the loss, per row of the two embedding
    gradients, and on the scale's (log-scale or temperature) gradient; ``scale`` is the exact
    scale (``1 / tau`` for NT-Xent) and ``third`` the float64 value of the third argument."""

    loss: float
    rows_x: np.ndarray
    rows_y: np.ndarray
    third_grad: float
    scale: float
    third: float


def bounds_for(kind: str, x, y, third, direction: str = "both",
               extra_cosine_error: float = 0.0, max_scale: float = 100.0) -> Bounds:
    """All the float32 bounds of ``clip_loss`` (``kind="clip"``, ``third`` the log-scale) or
    ``nt_xent`` (``third`` the temperature) on float32 rows ``x``, ``y``."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    dim = x.shape[1]
    scale, roundings = scale_of(kind, third, max_scale)
    if kind == "clip":
        parts = clip_dense(x, y, scale, direction)
        delta_z = logit_error(scale, max(p.max_logit for p in parts), dim,
                              scale_roundings=roundings, extra_cosine_error=extra_cosine_error)
        bx, by, bt = clip_grad_bounds(x, y, scale, direction, delta_z)
        return Bounds(loss_bound(parts, delta_z), bx, by, bt, scale, math.log(scale))
    part = nt_xent_dense(x, y, 1.0 / scale)
    delta_z = logit_error(scale, part.max_logit, dim, scale_roundings=roundings,
                          extra_cosine_error=extra_cosine_error)
    bx, by, bt = nt_xent_grad_bounds(x, y, 1.0 / scale, delta_z)
    return Bounds(loss_bound(part, delta_z), bx, by, bt, scale, 1.0 / scale)


def assert_rows_within(got, want, row_bounds, what: str = "") -> None:
    """Row ``i`` of ``got`` within ``row_bounds[i]`` (Euclidean) of row ``i`` of ``want``."""
    diff = np.linalg.norm(np.asarray(got, np.float64) - np.asarray(want, np.float64), axis=1)
    worst = int(np.argmax(diff / np.maximum(row_bounds, 1e-300)))
    assert np.all(diff <= row_bounds), (
        f"{what}: row {worst} error {diff[worst]:.3g} above its float32 bound "
        f"{row_bounds[worst]:.3g}")


def within(got, want, bound: float) -> bool:
    """``||got - want|| <= bound`` (Frobenius), got in float32 or float64, want float64."""
    diff = np.asarray(got, np.float64) - np.asarray(want, np.float64)
    return float(np.linalg.norm(diff.ravel())) <= bound


def assert_within(got, want, bound: float, what: str = "") -> None:
    """:func:`within`, with the error, the bound and their ratio in the message."""
    diff = float(np.linalg.norm((np.asarray(got, np.float64)
                                 - np.asarray(want, np.float64)).ravel()))
    assert diff <= bound, f"{what}: error {diff:.3g} above the float32 bound {bound:.3g}"
