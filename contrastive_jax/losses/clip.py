"""Symmetric CLIP InfoNCE with a learnable, clipped logit scale.

Derivation: docs/derivations.md §8 (definition §8.1, Gamma §8.3, backward §8.4, logit scale §8.5,
clip §7.6); [CLIP].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from contrastive_jax.losses.info_nce import paired_row_losses, row_losses
from contrastive_jax.losses.parts.normalize import l2_normalize
from contrastive_jax.losses.parts.similarity import similarities
from contrastive_jax.losses.parts.temperature import logit_scale
from contrastive_jax.losses.parts.validation import (
    check_block_size,
    check_choice,
    check_has_negatives,
    check_ids,
    check_impl,
    check_pair,
    check_positive,
    check_scalar,
    loss_dtype,
)
from contrastive_jax.losses.tiling.custom_vjps import DEFAULT_BLOCK_SIZE, Setup, infonce_tiled_jit
from contrastive_jax.losses.tiling.row_exchange import RowExchange

Array = jax.Array

DIRECTIONS = ("both", "x_to_y", "y_to_x")
IMPLS = ("autodiff", "dense_vjp", "tiled")


def clip_loss(
    x: Array,
    y: Array,
    log_scale: Array | float,
    *,
    max_scale: float = 100.0,
    direction: str = "both",
    impl: str = "tiled",
    block_size: int | None = None,
    positive_ids: Array | None = None,
) -> Array:
    """CLIP's symmetric InfoNCE on paired embeddings; row i of ``x`` matches row i of ``y``.

    Args:
      x, y: (N, d) raw embeddings (float32, bfloat16 or float64), N >= 2; L2-normalised inside.
      log_scale: scalar, the learnable log of the logit scale ``s = 1 / tau``.
      max_scale: the cap on ``s`` (CLIP: 100).
      direction: ``"both"`` for ``0.5 (L_x->y + L_y->x)``, or ``"x_to_y"`` / ``"y_to_x"`` for one
        side.
      impl: ``"tiled"`` (default: never builds the N x N logits; online log-sum-exp over
        (block, block) tiles forward, tiles recomputed backward; memory O(N d + block^2); see
        :mod:`contrastive_jax.losses.tiling.custom_vjps`), ``"dense_vjp"`` (the same hand-written
        backward pass, docs/derivations.md §8.4, on a single N x N tile: dense memory, a reference
        for the tiling; ``"analytic"``, its old name, is a deprecated alias) or ``"autodiff"``
        (reverse mode through the dense forward). All three agree to float rounding. ``"tiled"``
        and ``"dense_vjp"`` are reverse-mode only (``jax.grad``, ``jax.vjp``); use
        ``"autodiff"`` for ``jax.jvp``, ``jax.jacfwd`` or ``jax.hessian``. The default is the
        only one whose memory is O(N d); speed and memory of the three: docs/benchmarks.md.
      block_size: rows per tile for ``impl="tiled"`` (default ``DEFAULT_BLOCK_SIZE``, chosen by the
        block sweep of docs/benchmarks.md; clamped to N; when it does not divide N the last block
        overlaps the one before). An error for the other impls.
      positive_ids: optional (N,) integers, one per pair: ``y_j`` is a positive of ``x_i`` (and
        ``x_j`` of ``y_i``) iff ``ids[i] == ids[j]`` (duplicate captions, same-class pairs:
        multi-positive InfoNCE, docs/derivations.md §5). Default: each pair alone.

    Returns:
      Scalar loss in float32 (float64 for float64 inputs).

    Math (docs/derivations.md §8.1, steps 1-5). ``Z = s x_hat y_hat^T`` with
    ``s = min(exp(log_scale), max_scale)``; ``L_x->y = mean_i (lse_j Z_ij - Z_ii)`` over rows,
    ``L_y->x = mean_j (lse_i Z_ij - Z_jj)`` over columns, each evaluated relative to the positive
    (``softplus(lse_neg - Z_ii)``) so no step overflows or cancels. Logits and log-sum-exps are
    float32 for half-precision inputs.

    Gradients. ``dL/dZ = Gamma = (P_r + P_c - 2I)/(2N)`` (§8.3), ``grad_{x_hat} = s Gamma y_hat``,
    ``grad_{y_hat} = s Gamma^T x_hat`` (§8.4), projected through the normalisation (§2.2). For
    ``log_scale``: ``dL/dlog_scale = sum_ij Gamma_ij Z_ij`` (§8.5: per row
    ``(sum_j p_j c_j - c_i) / tau``) while ``exp(log_scale) < max_scale``; where the clip is
    active (``log_scale >= log(max_scale)``) the gradient w.r.t. ``log_scale`` is exactly 0: the
    scale is the constant ``max_scale`` there, and the temperature stops learning until an
    optimiser step (or a clamp of the parameter, as open_clip does) brings it below the cap.

    References:
      docs/derivations.md §8 (the loss, Gamma, the two-matmul backward), §7.6 (the clip),
      §13 (the tiled passes); [CLIP] Radford et al. 2021, https://arxiv.org/abs/2103.00020.

    Example (orthonormal pairs at scale 10: each row and column loses ``log(1 + 3 e^-10)``):

      >>> import jax.numpy as jnp
      >>> from contrastive_jax.losses import clip_loss
      >>> print(f"{float(clip_loss(jnp.eye(4), jnp.eye(4), jnp.log(10.0))):.3e}")
      1.362e-04
    """
    check_pair("x", x, "y", y)
    check_has_negatives("x", jnp.shape(x)[0])
    check_scalar("log_scale", log_scale)
    check_positive("max_scale", max_scale, allow_inf=True)
    check_ids("positive_ids", positive_ids, jnp.shape(x)[0])
    check_choice("direction", direction, DIRECTIONS)
    impl = check_impl(impl, IMPLS)
    block_size = check_block_size(block_size, impl, DEFAULT_BLOCK_SIZE)
    dtype = loss_dtype(x, y)
    x, y = jnp.asarray(x).astype(dtype), jnp.asarray(y).astype(dtype)
    log_scale = jnp.asarray(log_scale).astype(dtype)
    n = x.shape[0]
    if impl == "autodiff":
        return _clip_forward(x, y, log_scale, float(max_scale), direction, positive_ids)
    ids = jnp.arange(n, dtype=jnp.int32) if positive_ids is None else jnp.asarray(positive_ids)
    w_row, w_col = DIRECTION_WEIGHTS[direction]
    setup = Setup("clip", RowExchange(), n if impl == "dense_vjp" else block_size, w_row, w_col,
                  float(max_scale), by_id=positive_ids is not None)
    return infonce_tiled_jit(x, y, log_scale, ids, setup)


# Weights (rows x -> y, columns y -> x) of the two InfoNCE directions.
DIRECTION_WEIGHTS = {"both": (0.5, 0.5), "x_to_y": (1.0, 0.0), "y_to_x": (0.0, 1.0)}


def positives(n: int, ids: Array | None) -> Array:
    """(n, n) boolean: ``ids[i] == ids[j]`` (the diagonal without ids)."""
    if ids is None:
        return jnp.eye(n, dtype=bool)
    ids = jnp.asarray(ids)
    return ids[:, None] == ids[None, :]


def _clip_forward(x, y, log_scale, max_scale, direction, ids=None):
    x_hat, y_hat = l2_normalize(x), l2_normalize(y)
    logits = logit_scale(log_scale, max_scale) * similarities(x_hat, y_hat)
    w_row, w_col = DIRECTION_WEIGHTS[direction]
    if ids is None:  # each pair alone: the diagonal, two fused passes per direction
        loss = 0.0
        if w_row:
            loss += w_row * jnp.mean(paired_row_losses(logits, axis=1))
        if w_col:
            loss += w_col * jnp.mean(paired_row_losses(logits, axis=0))
        return loss
    mask = positives(logits.shape[0], ids)
    loss = 0.0
    if w_row:
        loss += w_row * jnp.mean(row_losses(logits, mask))
    if w_col:
        loss += w_col * jnp.mean(row_losses(logits.T, mask.T))
    return loss
