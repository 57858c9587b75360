"""The InfoNCE lower bound on mutual information (docs/derivations.md §15; [CPC], [Poole])."""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp

from contrastive_jax.errors import InputError

Array = jax.Array


def mi_lower_bound(loss: Array | float, num_candidates: int) -> Array:
    """``I(X;Y) >= log N - L_N`` (docs/derivations.md §15.1), in nats.

    Args:
      loss: the InfoNCE loss ``L_N`` (a batch mean, or its expectation).
      num_candidates: ``N``, the number of candidates per anchor (the batch size for in-batch
        negatives; ``K + 1`` for a queue of K).

    Limits (docs/derivations.md §15.3): (1) since ``L_N >= 0`` the certificate never exceeds ``log
    N``: with finite negatives it saturates when the true MI is large (Poole et al. 2019: ``log 64 =
    4.16`` nats at batch 64); (2) a single batch's ``log N - L`` is a Monte-Carlo sample of the
    bound and may exceed the true MI; (3) it holds only when the negatives are drawn independently
    from the marginal ``p_Y``; with false negatives, queues of stale keys, stratified batches or
    correlated augmented views (§5.4) it is not a bound and must be re-derived.

    References:
      docs/derivations.md §15; [CPC] https://arxiv.org/abs/1807.03748; [Poole] Poole et al.
      2019, https://arxiv.org/abs/1905.06922.

    Example:

      >>> from contrastive_jax.losses import mi_lower_bound
      >>> print(f"{float(mi_lower_bound(1.0, 64)):.4f}")
      3.1589
    """
    if isinstance(num_candidates, bool) or not isinstance(num_candidates, numbers.Integral):
        raise InputError(f"num_candidates must be an integer; got {num_candidates!r}.")
    if num_candidates < 2:
        raise InputError(
            "num_candidates must be >= 2 (the bound is log N - L with N >= 2); "
            f"got {num_candidates}."
        )
    return math.log(num_candidates) - jnp.asarray(loss)
