"""SimCLR's NT-Xent on 2N augmented views with the self-similarity mask ([SimCLR] §2.1;
docs/derivations.md §9)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from contrastive_jax.errors import InputError
from contrastive_jax.losses.info_nce import row_losses
from contrastive_jax.losses.parts.normalize import l2_normalize
from contrastive_jax.losses.parts.similarity import similarities
from contrastive_jax.losses.parts.validation import (
    check_block_size,
    check_has_negatives,
    check_ids,
    check_impl,
    check_pair,
    check_positive,
    loss_dtype,
)
from contrastive_jax.losses.tiling.custom_vjps import DEFAULT_BLOCK_SIZE, Setup, infonce_tiled_jit
from contrastive_jax.losses.tiling.row_exchange import RowExchange

Array = jax.Array

IMPLS = ("autodiff", "dense_vjp", "tiled")


def nt_xent(
    z1: Array,
    z2: Array,
    temperature: Array | float,
    *,
    impl: str = "tiled",
    block_size: int | None = None,
    normalize: bool = True,
    positive_ids: Array | None = None,
) -> Array:
    """Normalised-temperature cross-entropy over the 2N views ``[z1; z2]``.

    Args:
      z1, z2: (N, d) embeddings of the two views, N >= 2; ``z1[i]`` and ``z2[i]`` are a positive
        pair. L2-normalised inside.
      temperature: ``tau > 0`` (a Python number is checked; a traced value cannot be).
      impl: ``"tiled"`` (default; never builds the 2N x 2N matrix; visits only the tiles on and
        above the diagonal of the symmetric similarity, the two views kept apart; memory
        O(N d + block^2); see :mod:`contrastive_jax.losses.tiling.custom_vjps`), ``"dense_vjp"``
        (the same hand-written backward, docs/derivations.md §9.3: ``grad_{Z_hat} = (G + G^T)
        Z_hat / tau``, on whole-view tiles: dense memory; ``"analytic"``, its old name, is a
        deprecated alias) or ``"autodiff"`` (the only one that composes with forward-mode
        transforms).
      block_size: rows per tile for ``impl="tiled"`` (default ``DEFAULT_BLOCK_SIZE``); an error
        for the other impls.
      normalize: ``False`` drops the L2 normalisation: dot-product logits ``z_i . z_j / tau``
        (SimCLR Table 5's "no l2 norm" rows; docs/derivations.md §12.4 shows this loss rewards
        growing norms). An ablation, so only ``impl="autodiff"`` implements it (an error otherwise).
      positive_ids: optional (N,) integers, one per example (both its views share it): view
        ``j`` is a positive of anchor ``i`` iff their ids are equal and ``j != i`` (SupCon's
        positives when the ids are labels, [SupCon]; docs/derivations.md §5). Default: each
        example's other view alone.

    Returns:
      Scalar: the mean over all 2N anchors (docs/derivations.md §9.1 step 6).

    Math (docs/derivations.md §9.1). With ``Z_hat = [z1_hat; z2_hat]`` (2N, d) and ``S = Z_hat
    Z_hat^T / tau``, anchor
    ``i`` has positive ``pi(i) = (i + N) mod 2N`` and the candidates ``j != i``: the self
    similarity (always ``1 / tau``, the largest possible) is masked out, otherwise the loss
    degenerates. Row loss ``-S_{i,pi(i)} + log sum_{j != i} exp(S_ij)``. With all 2N embeddings
    identical it is ``log(2N - 1)``, chance level. ``dL/dS = (P - Y)/(2N)`` (docs/derivations.md
    §9.2, :func:`contrastive_jax.analytic.batch.nt_xent_logit_grad`) and, since ``S`` is symmetric
    in
    ``Z_hat``, ``grad_{Z_hat} L = (G + G^T) Z_hat / tau``; ``dL/dtau = -sum_ij G_ij S_ij / tau``
    (docs/derivations.md §9.3, §9.4).

    References:
      docs/derivations.md §9 (the loss, its gradient by symmetry), §13 (the tiled pass);
      [SimCLR] Chen et al. 2020, https://arxiv.org/abs/2002.05709.

    Example (identical orthonormal views at tau 0.1: each of the 2N rows loses
    ``log(1 + 6 e^-10)``):

      >>> import jax.numpy as jnp
      >>> from contrastive_jax.losses import nt_xent
      >>> print(f"{float(nt_xent(jnp.eye(4), jnp.eye(4), 0.1)):.3e}")
      2.724e-04
    """
    check_pair("z1", z1, "z2", z2)
    check_has_negatives("z1", jnp.shape(z1)[0])
    check_positive("temperature", temperature)
    impl = check_impl(impl, IMPLS)
    check_ids("positive_ids", positive_ids, jnp.shape(z1)[0])
    block_size = check_block_size(block_size, impl, DEFAULT_BLOCK_SIZE)
    if not normalize and impl != "autodiff":
        raise InputError(f"normalize=False (dot-product logits) is implemented by "
                         f"impl='autodiff' only; got impl={impl!r}")
    dtype = loss_dtype(z1, z2)
    z1, z2 = jnp.asarray(z1).astype(dtype), jnp.asarray(z2).astype(dtype)
    temperature = jnp.asarray(temperature).astype(dtype)
    n = z1.shape[0]
    if impl == "autodiff":
        return _nt_xent_forward(jnp.concatenate([z1, z2], axis=0), temperature, normalize,
                                positive_ids)
    ids = jnp.arange(n, dtype=jnp.int32) if positive_ids is None else jnp.asarray(positive_ids)
    setup = Setup("nt_xent", RowExchange(), n if impl == "dense_vjp" else block_size,
                  by_id=positive_ids is not None)
    return infonce_tiled_jit(z1, z2, temperature, ids, setup)


def _nt_xent_forward(z, temperature, normalize=True, ids=None):
    z_hat = l2_normalize(z) if normalize else z
    logits = similarities(z_hat, z_hat) / temperature
    m = z.shape[0]
    not_self = ~jnp.eye(m, dtype=bool)
    if ids is None:
        positive = jnp.roll(jnp.eye(m, dtype=bool), m // 2, axis=1)
    else:
        both = jnp.concatenate([jnp.asarray(ids)] * 2)
        positive = (both[:, None] == both[None, :]) & not_self
    return jnp.mean(row_losses(logits, positive, candidates=not_self))
