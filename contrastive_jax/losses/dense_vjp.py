"""Dense losses with a backward pass written from docs/derivations.md §8.6 and §9.3
(``impl="analytic"``).

The forward pass forms the N x N logits once and keeps them; the backward pass builds
``Gamma`` from them and the saved log-sum-exps in one elementwise pass
(:func:`contrastive_jax.losses.tile_kernels.tile_logit_grad`, the whole matrix as one tile), then
``grad_U_hat = s Gamma V_hat`` and ``grad_V_hat = s Gamma^T U_hat``: three matmuls in all and no
autodiff temporaries. Each positive is handled by its own logit, as in the tiled losses.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from contrastive_jax.losses.normalize import l2_normalize, l2_normalize_vjp
from contrastive_jax.losses.similarity import MATMUL_PRECISION, similarities
from contrastive_jax.losses.temperature import clip_active, logit_scale
from contrastive_jax.losses.tile_kernels import (
    DIRECTION_WEIGHTS,
    make_plan,
    negative_probabilities,
    negatives_mask,
    negatives_minus_positive,
    partner_grads,
    tile_logit_grad,
    tile_normaliser,
)

Array = jax.Array

def _whole_matrix_mask(n: int, exclude: str) -> Array:
    return negatives_mask(make_plan(n, n, symmetric=False, exclude=exclude), 0, 0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def clip_loss_analytic(x, y, log_scale, max_scale, direction):
    """Dense ``clip_loss`` with the backward pass of docs/derivations.md §8.6, on arrays already in
    the compute dtype."""
    return _clip_fwd(x, y, log_scale, max_scale, direction)[0]


def _clip_fwd(x, y, log_scale, max_scale, direction):
    n = x.shape[0]
    scale = logit_scale(log_scale, max_scale)
    cosines = similarities(l2_normalize(x), l2_normalize(y))
    tile = jnp.where(_whole_matrix_mask(n, "diagonal"), scale * cosines, -jnp.inf)
    positive = scale * jnp.diagonal(cosines)
    w_row, w_col = DIRECTION_WEIGHTS[direction]
    rows = tile_normaliser(tile, 1) if w_row else None
    cols = tile_normaliser(tile, 0) if w_col else None
    loss = 0.0
    if w_row:
        loss += w_row * jnp.mean(jax.nn.softplus(negatives_minus_positive(rows, positive)))
    if w_col:
        loss += w_col * jnp.mean(jax.nn.softplus(negatives_minus_positive(cols, positive)))
    return loss, (x, y, log_scale, cosines, rows, cols)


def _clip_bwd(max_scale, direction, residuals, g):
    x, y, log_scale, cosines, rows, cols = residuals
    n = x.shape[0]
    x_hat, y_hat = l2_normalize(x), l2_normalize(y)
    scale = logit_scale(log_scale, max_scale)
    positive_cos = jnp.diagonal(cosines)
    positive = scale * positive_cos
    w_row, w_col = DIRECTION_WEIGHTS[direction]
    alpha = g * w_row / n if w_row else None
    beta = g * w_col / n if w_col else None
    gamma, total = tile_logit_grad(
        cosines, scale * cosines, _whole_matrix_mask(n, "diagonal"),
        negative_probabilities(rows, positive, alpha) if w_row else None,
        negative_probabilities(cols, positive, beta) if w_col else None,
        positive_cos, positive_cos)
    # The positives: Gamma_ii = -(alpha (1 - p^r_ii) + beta (1 - p^c_ii)).
    gamma_ii = 0.0
    if w_row:
        gamma_ii -= alpha * jax.nn.sigmoid(negatives_minus_positive(rows, positive))
    if w_col:
        gamma_ii -= beta * jax.nn.sigmoid(negatives_minus_positive(cols, positive))
    g_x_hat = scale * (jnp.matmul(gamma, y_hat, precision=MATMUL_PRECISION)
                       + gamma_ii[:, None] * y_hat)
    g_y_hat = scale * (jnp.matmul(gamma.T, x_hat, precision=MATMUL_PRECISION)
                       + gamma_ii[:, None] * x_hat)
    g_log_scale = jnp.where(clip_active(log_scale, max_scale), 0.0, scale * total)
    g_log_scale = g_log_scale.astype(log_scale.dtype)
    return l2_normalize_vjp(x, g_x_hat), l2_normalize_vjp(y, g_y_hat), g_log_scale


clip_loss_analytic.defvjp(_clip_fwd, _clip_bwd)


@jax.custom_vjp
def nt_xent_analytic(z, temperature):
    """Dense ``nt_xent`` with the backward pass of docs/derivations.md §9.3 on the stacked views
    ``z = [z1; z2]`` (2N, d)."""
    return _nt_xent_fwd(z, temperature)[0]


def _partners(m: int) -> Array:
    return (jnp.arange(m) + m // 2) % m


def _nt_xent_fwd(z, temperature):
    m = z.shape[0]
    z_hat = l2_normalize(z)
    cosines = similarities(z_hat, z_hat)
    negatives = tile_normaliser(
        jnp.where(_whole_matrix_mask(m, "nt_xent"), cosines / temperature, -jnp.inf), 1)
    positive = cosines[jnp.arange(m), _partners(m)] / temperature
    loss = jnp.mean(jax.nn.softplus(negatives_minus_positive(negatives, positive)))
    return loss, (z, temperature, cosines, negatives)


def _nt_xent_bwd(residuals, g):
    z, temperature, cosines, negatives = residuals
    m = z.shape[0]
    positive_cos = cosines[jnp.arange(m), _partners(m)]
    positive = positive_cos / temperature
    z_hat = l2_normalize(z)
    alpha = g / m
    # G = (P - Y)/(2N) on the negatives and grad_Z_hat = (G + G^T) Z_hat / tau. S is symmetric,
    # so (G^T)_ij = w_j exp(S_ij - shift_j): the row and column terms of one elementwise pass
    # give G + G^T without transposing an N x N array; the centred sum then counts G twice.
    weights = negative_probabilities(negatives, positive, alpha)
    sym_gamma, _ = tile_logit_grad(cosines, cosines / temperature,
                                   _whole_matrix_mask(m, "nt_xent"), weights, weights,
                                   positive_cos, positive_cos, with_total=False)
    g_negatives = jnp.matmul(sym_gamma, z_hat, precision=MATMUL_PRECISION)
    # sum_ij G_ij C_ij without another N x N pass: row i of (G + G^T) Z_hat dotted with z_hat_i
    # gives sum_j (G + G^T)_ij C_ij (twice G's share, C being symmetric); the partners add
    # sum_i G_{i, pi(i)} C_{i, pi(i)}. Row dots, then a dot product (not one long reduction).
    row_dots = jnp.sum(z_hat * g_negatives, axis=1)
    # G_{i, pi(i)} = -(1 - p_{i, pi(i)}) / (2N)
    partner = -alpha * jax.nn.sigmoid(negatives_minus_positive(negatives, positive))
    per_row = 0.5 * row_dots + partner * positive_cos
    total = jnp.dot(per_row, jnp.ones_like(per_row), precision=MATMUL_PRECISION)
    g_z_hat = (g_negatives + partner_grads(partner, z_hat)) / temperature
    g_temperature = (-total / temperature**2).astype(temperature.dtype)
    return l2_normalize_vjp(z, g_z_hat), g_temperature


nt_xent_analytic.defvjp(_nt_xent_fwd, _nt_xent_bwd)
