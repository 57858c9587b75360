"""Closed-form gradients of batch losses: the N x N logit matrix and the embedding matrices.

Each function implements one formula of docs/derivations.md and names it; the gradient-check
table (``experiments/gradcheck.py``) compares every one with ``jax.grad`` of the library loss.
Notation: ``U``, ``V`` are (N, d) raw embeddings, ``U_hat``, ``V_hat`` their L2-normalised rows,
``Z = s U_hat V_hat^T`` the logits with scale ``s = 1 / tau``, ``P_r`` the row softmax of ``Z``
and ``P_c`` its column softmax.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from contrastive_jax.losses.parts.similarity import MATMUL_PRECISION, similarities

Array = jax.Array


def _matmul(a: Array, b: Array) -> Array:
    return jnp.matmul(a, b, precision=MATMUL_PRECISION)


def softmax_minus_onehot(logits: Array, onehot: Array, axis: int = -1) -> Array:
    """``softmax(logits) - Y`` along ``axis``, ``Y`` a boolean one-hot of the positives (§4.2).

    The positive entry ``p_pos - 1`` is formed as ``-(sum of the other p_j)``, which is the same
    number but keeps full relative precision when the positive dominates (``p_pos = 1 - 1e-5``
    would leave only two significant digits of ``p_pos - 1`` in float32). A ``-inf`` logit is an
    excluded candidate and gets 0.
    """
    probs = jax.nn.softmax(logits, axis=axis)
    others = jnp.sum(jnp.where(onehot, 0.0, probs), axis=axis, keepdims=True)
    return jnp.where(onehot, -others, probs)


def row_logit_grad(logits: Array) -> Array:
    """``dL_{x->y} / dZ = (P_r - I) / N`` (docs/derivations.md §8.2). (N, N) -> (N, N)."""
    n = logits.shape[0]
    return softmax_minus_onehot(logits, jnp.eye(n, dtype=bool), axis=1) / n


def column_logit_grad(logits: Array) -> Array:
    """``dL_{y->x} / dZ = (P_c - I) / N`` (docs/derivations.md §8.2). (N, N)."""
    n = logits.shape[0]
    return softmax_minus_onehot(logits, jnp.eye(n, dtype=bool), axis=0) / n


def symmetric_logit_grad(logits: Array) -> Array:
    """``Gamma = dL_sym / dZ = (P_r + P_c - 2 I) / (2N)`` (docs/derivations.md §8.3). (N, N) -> (N,
    N).

    Its entries sum to 0, its diagonal is negative and its off-diagonal positive; ``P_c`` is not
    ``P_r^T``, so neither direction can be recovered from the other.
    """
    return 0.5 * (row_logit_grad(logits) + column_logit_grad(logits))


def nt_xent_logit_grad(logits: Array) -> Array:
    """``dL / dS = (P - Y) / (2N)`` for NT-Xent on 2N views (docs/derivations.md §9.2).

    ``logits``: (2N, 2N) ``S = Z_hat Z_hat^T / tau`` before the self mask. ``P`` is the row
    softmax over ``j != i`` (its diagonal is exactly 0) and ``Y`` is one-hot at the partner view
    ``(i + N) mod 2N``.
    """
    m = logits.shape[0]
    eye = jnp.eye(m, dtype=bool)
    partners = jnp.roll(eye, m // 2, axis=1)
    return softmax_minus_onehot(jnp.where(eye, -jnp.inf, logits), partners, axis=1) / m


def normalized_embedding_grads(
    u_hat: Array, v_hat: Array, logit_grad: Array, scale: Array | float
) -> tuple[Array, Array]:
    """``grad_{U_hat} L = s Gamma V_hat`` and ``grad_{V_hat} L = s Gamma^T U_hat``
    (docs/derivations.md §8.4).

    (N, d), (M, d), (N, M) -> (N, d), (M, d). ``s = 1 / tau`` is the logit scale; ``Gamma`` is any
    ``dL/dZ`` (row, column, symmetric).
    """
    return scale * _matmul(logit_grad, v_hat), scale * _matmul(logit_grad.T, u_hat)


def project_through_normalization(u: Array, grad_u_hat: Array) -> Array:
    """``grad_u L = (I - u_hat u_hat^T) grad_{u_hat} L / ||u||`` row-wise (docs/derivations.md
    §2.2, §2.4).

    (N, d), (N, d) -> (N, d). Each result row is orthogonal to the row of ``u`` (docs/derivations.md
    §2.4, §12.1).
    """
    norm = jnp.linalg.norm(u, axis=-1, keepdims=True)
    u_hat = u / norm
    return (grad_u_hat - u_hat * jnp.sum(u_hat * grad_u_hat, axis=-1, keepdims=True)) / norm


def symmetric_embedding_grads(
    u: Array, v: Array, temperature: Array | float
) -> tuple[Array, Array]:
    """Gradients of the symmetric (CLIP) loss w.r.t. the raw embeddings (docs/derivations.md §8.4).

    ``Gamma = (P_r + P_c - 2I)/(2N)``, ``grad_{U_hat} = Gamma V_hat / tau``,
    ``grad_{V_hat} = Gamma^T U_hat / tau``, then each row projected through its normalisation:
    two matmuls and a row-wise projection. (N, d), (N, d) -> (N, d), (N, d).
    """
    u_hat = u / jnp.linalg.norm(u, axis=-1, keepdims=True)
    v_hat = v / jnp.linalg.norm(v, axis=-1, keepdims=True)
    scale = 1.0 / temperature
    gamma = symmetric_logit_grad(scale * similarities(u_hat, v_hat))
    g_u_hat, g_v_hat = normalized_embedding_grads(u_hat, v_hat, gamma, scale)
    return project_through_normalization(u, g_u_hat), project_through_normalization(v, g_v_hat)


def batch_log_scale_grad(logits: Array, logit_grad: Array) -> Array:
    """``dL / d log s = sum_ij Gamma_ij Z_ij`` for logits ``Z = s C`` (docs/derivations.md §8.5).

    Since ``dZ / d log s = Z``. For one row with ``s = e^t = 1/tau`` this is §7.5's
    ``dl/dt = (sum_j p_j c_j - c_1) / tau``. (N, M), (N, M) -> scalar.
    """
    return jnp.sum(logit_grad * logits)


def one_directional_anchor_grads(
    u_hat: Array, v_hat: Array, temperature: Array | float
) -> Array:
    """``grad_{u_i} L_{x->y} = (sum_j p_ij v_j - v_i) / (B tau)`` (docs/derivations.md §8.2).

    (B, d), (B, d) -> (B, d). Here ``u_i``, ``v_j`` are the unit vectors of docs/derivations.md §8.2
    treated as free variables (no re-normalisation), so this is the gradient before the projection
    of §2.2.
    """
    b = u_hat.shape[0]
    probs = jax.nn.softmax(similarities(u_hat, v_hat) / temperature, axis=1)
    return (_matmul(probs, v_hat) - v_hat) / (b * temperature)
