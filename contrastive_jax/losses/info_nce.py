"""One-directional InfoNCE over K candidates per anchor (docs/derivations.md §4, §5)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from contrastive_jax.errors import InputError
from contrastive_jax.losses.parts.validation import check_has_negatives, loss_dtype

Array = jax.Array


def masked_logsumexp(logits: Array, mask: Array, axis: int = -1) -> Array:
    """``log sum_{j in mask} exp(logits_j)`` along ``axis``, max-shifted (derivations.md §6.1).

    An empty mask gives ``-inf`` with a zero (not NaN) gradient; ``-inf`` logits are allowed and
    contribute nothing. A NaN among the masked logits gives NaN (never the empty row's
    ``-inf``, which would let the NaN vanish from the loss). The shift is under
    ``stop_gradient``: the result does not depend on it, so the gradient is exactly the masked
    softmax.
    """
    masked = jnp.where(mask, logits, -jnp.inf)
    shift = jnp.max(masked, axis=axis, keepdims=True)
    shift = lax.stop_gradient(jnp.where(jnp.isfinite(shift), shift, 0.0))
    # exp of -inf (not of a masked-out finite value) so that no inf * 0 reaches the gradient.
    total = jnp.sum(jnp.exp(jnp.where(mask, logits - shift, -jnp.inf)), axis=axis, keepdims=True)
    nonempty = total > 0
    empty = jnp.where(jnp.isnan(total), jnp.nan, -jnp.inf)
    lse = jnp.where(nonempty, jnp.log(jnp.where(nonempty, total, 1.0)) + shift, empty)
    return jnp.squeeze(lse, axis=axis)


def positive_relative_loss(lse_negatives: Array, lse_positives: Array) -> Array:
    """``-log(sum_pos p)`` from the two log-sum-exps: ``softplus(lse_neg - lse_pos)``.

    Algebraically this is ``lse_all - lse_pos``, but it never subtracts two large, nearly equal
    numbers: at logit scale 100 a well-separated row has a loss of ~1e-10, which the textbook
    ``lse - z_pos`` loses entirely to float32 cancellation, while ``softplus`` of a very negative
    argument returns ``exp(argument)`` to full relative precision (see JAX_NOTES "Tiled losses").
    """
    return jax.nn.softplus(lse_negatives - lse_positives)


def info_nce(logits: Array, positives: Array) -> Array:
    """Mean one-directional InfoNCE: ``mean_i -log sum_{j in P(i)} softmax(logits_i)_j``.

    Args:
      logits: (A, K) scores ``z_ij`` of anchor ``i`` against candidate ``j`` (already divided by
        the temperature). A logit of ``-inf`` removes that candidate (e.g. the self-similarity
        in NT-Xent); it receives a zero gradient.
      positives: either an integer array (A,) giving the index of each anchor's positive, or a
        boolean (A, K) mask with one or more positives per row.

    Returns:
      Scalar, float32 (float64 for float64 logits): the mean over the A anchors.

    Math. With one positive ``y`` (docs/derivations.md §4.1-4.2) the row loss is
    ``-z_y + log sum_j exp(z_j)`` and its gradient w.r.t. the logits is ``p - e_y`` (divided by A
    for the mean). With a set ``P`` of positives (false negatives such as duplicate captions,
    docs/derivations.md §5.1-5.2, §5.4) it is ``-log sum_{j in P} p_j = lse_all - lse_P``, with
    gradient ``p - q`` where
    ``q`` is the softmax restricted to ``P``. Each row is evaluated as
    ``softplus(lse_negatives - lse_positives)`` (see :func:`positive_relative_loss`), which is
    overflow-free at any scale and keeps tiny losses to full relative precision.

    A row whose mask has no positive (or whose integer index is out of range under ``jit``) has
    loss ``+inf``: the positive has probability zero. Concrete out-of-range indices and empty
    concrete masks raise ``ValueError`` instead.

    References:
      docs/derivations.md §4 (one positive, ``p - y``), §5 (several positives), §6 (the stable
      row form); [CPC] van den Oord et al. 2018, https://arxiv.org/abs/1807.03748.

    Example:

      >>> import jax.numpy as jnp
      >>> from contrastive_jax.losses import info_nce
      >>> print(f"{float(info_nce(jnp.array([[2.0, 0.0, 0.0]]), jnp.array([0]))):.6f}")
      0.239545
    """
    shape = jnp.shape(logits)
    if len(shape) != 2:
        raise InputError(
            f"logits must be rank-2 (anchors, candidates); got shape {shape}. "
            "For a single anchor pass logits[None]."
        )
    num_anchors, num_candidates = shape
    check_has_negatives("logits", num_candidates, what="number of candidates (axis 1)")
    logits = jnp.asarray(logits, loss_dtype(logits))
    pos_mask = positive_mask(positives, num_anchors, num_candidates)
    return jnp.mean(row_losses(logits, pos_mask))


def row_losses(logits: Array, pos_mask: Array, candidates: Array | None = None) -> Array:
    """Per-anchor InfoNCE ``-log sum_{j in P} p_j`` along axis 1, without input checks.

    (A, K) logits, (A, K) boolean positives, optional (A, K) boolean candidate mask (the
    softmax runs over the candidates only) -> (A,). The building block of every loss here.
    """
    negatives = ~pos_mask if candidates is None else candidates & ~pos_mask
    lse_pos = masked_logsumexp(logits, pos_mask)
    lse_neg = masked_logsumexp(logits, negatives)
    return positive_relative_loss(lse_neg, lse_pos)


def paired_row_losses(logits: Array, axis: int = 1) -> Array:
    """Per-row (``axis=1``) or per-column (``axis=0``) InfoNCE of a square (N, N) ``logits``
    whose positives are its diagonal: ``softplus(lse_{j != i} z_ij - z_ii)`` -> (N,).

    The same stable form as :func:`row_losses` (docs/derivations.md §6.2) for the one-positive
    case, in the passes a textbook ``log_softmax`` takes: one max over the negatives (the
    diagonal masked with an iota compare that XLA fuses into the reduction), one exp-sum, the
    diagonal read directly (O(N), no masked log-sum-exp over N x N for the positives), no
    transpose for the columns. Under autodiff the backward is one elementwise pass before the
    two matmuls. The shift is the largest negative, so the sum is >= 1 (no ``log 0``) unless
    it is NaN, which then reaches the loss (a NaN that XLA:CPU's fused ``max`` drops still
    reaches the sum). The diagonal enters the sum as ``exp(-inf) = 0``, whose gradient is 0
    (masking after the ``exp`` would multiply an overflowing ``exp`` by 0: NaN).

    References:
      docs/derivations.md §6.2 (the stable row form), §8.1 (CLIP's rows and columns).
    """
    other = 1 - axis
    diagonal = (lax.broadcasted_iota(jnp.int32, logits.shape, axis)
                == lax.broadcasted_iota(jnp.int32, logits.shape, other))
    negatives = jnp.where(diagonal, -jnp.inf, logits)
    shift = jnp.max(negatives, axis=axis, keepdims=True)
    shift = lax.stop_gradient(jnp.where(jnp.isfinite(shift), shift, 0.0))
    total = jnp.sum(jnp.exp(negatives - shift), axis=axis)
    lse_negatives = jnp.log(total) + jnp.squeeze(shift, axis)
    return positive_relative_loss(lse_negatives, jnp.diagonal(logits))


def positive_mask(positives: Array, num_anchors: int, num_candidates: int) -> Array:
    """Boolean (A, K) mask of positives from indices (A,) or a mask (A, K), with checks."""
    dtype = jnp.result_type(positives)
    shape = jnp.shape(positives)
    if dtype == jnp.bool_:
        if shape != (num_anchors, num_candidates):
            raise InputError(
                f"a boolean positives mask must have the logits' shape "
                f"{(num_anchors, num_candidates)}; got {shape}."
            )
        if not isinstance(positives, jax.core.Tracer):
            empty = ~jnp.any(jnp.asarray(positives), axis=1)
            if bool(jnp.any(empty)):
                rows = jnp.nonzero(empty)[0][:5].tolist()
                raise InputError(
                    f"positives mask has no positive in row(s) {rows}: every anchor needs at "
                    "least one positive candidate."
                )
        return jnp.asarray(positives)
    if not jnp.issubdtype(dtype, jnp.integer):
        raise InputError(
            f"positives must be integer indices (A,) or a boolean mask (A, K); got dtype {dtype}."
        )
    if shape != (num_anchors,):
        raise InputError(
            f"integer positives must have shape (anchors,) = ({num_anchors},); got {shape}."
        )
    if not isinstance(positives, jax.core.Tracer):
        idx = jnp.asarray(positives)
        bad = (idx < 0) | (idx >= num_candidates)
        if bool(jnp.any(bad)):
            raise InputError(
                f"positive indices must lie in [0, {num_candidates}); got "
                f"{jnp.asarray(idx)[bad][:5].tolist()}."
            )
    return jnp.arange(num_candidates)[None, :] == jnp.asarray(positives)[:, None]
