"""Closed-form gradients for one anchor against K candidates (docs/derivations.md §3, §4, §7, §12).

Notation of docs/derivations.md §1.1 and §4: anchor ``u`` (d,), candidates ``v_1..v_K`` as the rows
of ``candidates`` (K, d), cosine similarities ``c_j = u_hat . v_hat_j``, logits ``z_j = c_j / tau``,
softmax ``p`` and one-hot ``y`` on the positive. The literature puts the positive at index 1; here
``positive`` is any index. Loss: ``l = -log p_positive``. Batch a function with ``jax.vmap``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from contrastive_jax.analytic import batch
from contrastive_jax.losses.parts.similarity import MATMUL_PRECISION

Array = jax.Array


def _unit(x: Array) -> Array:
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def cosine_similarities(u: Array, candidates: Array) -> Array:
    """``c_j = u_hat . v_hat_j``: (d,), (K, d) -> (K,) (docs/derivations.md §1.1, §3)."""
    return jnp.matmul(_unit(candidates), _unit(u), precision=MATMUL_PRECISION)


def infonce_logit_grad(logits: Array, positive: int | Array) -> Array:
    """``grad_z l = p - y`` (docs/derivations.md §4.2): (K,) -> (K,).

    ``p_pos - 1`` is evaluated as ``-(sum_{j != pos} p_j)`` (see
    :func:`contrastive_jax.analytic.batch.softmax_minus_onehot`).
    """
    return batch.softmax_minus_onehot(logits, jnp.arange(logits.shape[-1]) == positive)


def infonce_similarity_grad(
    similarities: Array, positive: int | Array, temperature: Array | float
) -> Array:
    """``grad_c l = (p - y) / tau`` with ``p = softmax(c / tau)`` (docs/derivations.md §4.3): (K,)
    -> (K,)."""
    return infonce_logit_grad(similarities / temperature, positive) / temperature


def cosine_grads(u: Array, v: Array) -> tuple[Array, Array]:
    """``grad_u c = (v_hat - c u_hat)/||u||`` and ``grad_v c = (u_hat - c v_hat)/||v||``
    (docs/derivations.md §3.1).

    (d,), (d,) -> (d,), (d,). ``u . grad_u c = 0`` and ``||grad_u c|| = sqrt(1 - c^2) / ||u||``.
    """
    nu, nv = jnp.linalg.norm(u), jnp.linalg.norm(v)
    u_hat, v_hat = u / nu, v / nv
    c = jnp.dot(u_hat, v_hat, precision=MATMUL_PRECISION)
    return (v_hat - c * u_hat) / nu, (u_hat - c * v_hat) / nv


def infonce_anchor_grad(
    u: Array, candidates: Array, positive: int | Array, temperature: Array | float
) -> Array:
    """``grad_u l = [sum_j p_j v_hat_j - v_hat_pos - (sum_j p_j c_j - c_pos) u_hat] / (tau ||u||)``.

    docs/derivations.md §4.4. (d,), (K, d) -> (d,).
    """
    c = cosine_similarities(u, candidates)
    w = infonce_logit_grad(c / temperature, positive)  # p - y
    v_hat, u_hat = _unit(candidates), _unit(u)
    pull = jnp.matmul(w, v_hat, precision=MATMUL_PRECISION)  # sum_j p_j v_hat_j - v_hat_pos
    radial = jnp.dot(w, c)  # sum_j p_j c_j - c_pos
    return (pull - radial * u_hat) / (temperature * jnp.linalg.norm(u))


def infonce_candidate_grads(
    u: Array, candidates: Array, positive: int | Array, temperature: Array | float
) -> Array:
    """``grad_{v_j} l = (p_j - y_j) (u_hat - c_j v_hat_j) / (tau ||v_j||)`` (docs/derivations.md
    §4.5).

    (d,), (K, d) -> (K, d): row j is the gradient w.r.t. candidate j.
    """
    c = cosine_similarities(u, candidates)
    w = infonce_logit_grad(c / temperature, positive)
    norms = jnp.linalg.norm(candidates, axis=-1)
    v_hat, u_hat = _unit(candidates), _unit(u)
    return (w / (temperature * norms))[:, None] * (u_hat[None, :] - c[:, None] * v_hat)


def softmax_weight_ratio(c_j: Array, c_k: Array, temperature: Array | float) -> Array:
    """``p_j / p_k = exp((c_j - c_k) / tau)`` (docs/derivations.md §7.1): the temperature as
    hardness dial."""
    return jnp.exp((c_j - c_k) / temperature)


def _hardest_negative(similarities: Array, positive: int | Array) -> Array:
    k = similarities.shape[-1]
    is_pos = jnp.arange(k) == positive
    return jnp.argmax(jnp.where(is_pos, -jnp.inf, similarities))


def low_temperature_loss_limit(
    similarities: Array, positive: int | Array, temperature: Array | float
) -> Array:
    """``l -> max(0, max_{j != pos} c_j - c_pos) / tau`` as ``tau -> 0`` (docs/derivations.md §7.2).

    A hinge on the hardest negative; the gap to the true loss decays like
    ``exp(-margin / tau)`` (assuming a unique maximum).
    """
    hardest = similarities[_hardest_negative(similarities, positive)]
    return jnp.maximum(0.0, hardest - similarities[positive]) / temperature


def low_temperature_grad_limit(
    similarities: Array, positive: int | Array, temperature: Array | float
) -> Array:
    """``grad_c l -> (e_{j*} - e_pos) / tau`` as ``tau -> 0``, ``j*`` the arg-max
    (docs/derivations.md §7.2).

    Zero when the positive is the top candidate, else a push of size ``1/tau`` on the single
    hardest negative and an equal pull on the positive. (K,) -> (K,).
    """
    k = similarities.shape[-1]
    top = jnp.argmax(similarities)
    return (jax.nn.one_hot(top, k, dtype=similarities.dtype)
            - jax.nn.one_hot(positive, k, dtype=similarities.dtype)) / temperature


def high_temperature_grad_limit(
    num_candidates: int, positive: int | Array, temperature: Array | float
) -> Array:
    """``grad_c l -> (1/K - y) / tau``, uniform weights, as ``tau -> inf`` (docs/derivations.md
    §7.3)."""
    y = jax.nn.one_hot(positive, num_candidates,
                       dtype=jnp.promote_types(jnp.result_type(temperature), jnp.float32))
    return (1.0 / num_candidates - y) / temperature


def rescaled_anchor_grad(grad_u: Array, alpha: Array | float) -> Array:
    """``grad_u l(alpha u) = grad_u l(u) / alpha`` for ``alpha > 0`` (docs/derivations.md §12.1)."""
    return grad_u / alpha


def linear_weight_grad(grad_u: Array, x: Array) -> Array:
    """``grad_W l = (grad_u l) x^T`` for a linear encoder ``u = W x`` (docs/derivations.md
    §12.2)."""
    return jnp.outer(grad_u, x)


def temperature_grad(
    similarities: Array, positive: int | Array, temperature: Array | float
) -> Array:
    """``dl/dtau = (c_pos - sum_j p_j c_j) / tau^2`` (docs/derivations.md §7.4)."""
    p = jax.nn.softmax(similarities / temperature)
    return (similarities[positive] - jnp.dot(p, similarities)) / temperature**2


def anchor_log_scale_grad(similarities: Array, positive: int | Array,
                          log_scale: Array | float) -> Array:
    """``dl/dt = (sum_j p_j c_j - c_pos) / tau`` with ``tau = exp(-t)`` (docs/derivations.md §7.5).

    Negative (so descent raises ``t`` and sharpens the softmax) exactly when the positive beats
    the softmax-weighted average similarity.
    """
    temperature = jnp.exp(-log_scale)
    p = jax.nn.softmax(similarities / temperature)
    return (jnp.dot(p, similarities) - similarities[positive]) / temperature


def dot_product_anchor_grad(
    u: Array, candidates: Array, positive: int | Array, temperature: Array | float
) -> Array:
    """``grad_u l = sum_j (p_j - y_j) v_j / tau`` for logits ``z_j = u . v_j / tau``
    (docs/derivations.md §12.4)."""
    z = jnp.matmul(candidates, u, precision=MATMUL_PRECISION) / temperature
    return jnp.matmul(infonce_logit_grad(z, positive), candidates,
                      precision=MATMUL_PRECISION) / temperature


def dot_product_ray_derivative(
    u: Array, candidates: Array, positive: int | Array, temperature: Array | float
) -> Array:
    """``d/dalpha l(alpha u) at alpha = 1`` ``= sum_j p_j z_j - z_pos`` (docs/derivations.md §12.4).

    Negative whenever the positive has the largest logit: dot-product logits reward growing
    ``||u||`` (docs/derivations.md §12.4).
    """
    z = jnp.matmul(candidates, u, precision=MATMUL_PRECISION) / temperature
    return jnp.dot(jax.nn.softmax(z), z) - z[positive]
