"""Retrieval Recall@k between paired embeddings (a sample and its caption), both directions."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from contrastive_jax.errors import InputError
from contrastive_jax.training.evaluation.geometry import as_matrix, unit_rows


def _recall(queries, candidates, query_ids, candidate_ids, ks, chunk) -> dict[int, float]:
    hits = {k: 0 for k in ks}
    for start in range(0, len(queries), chunk):
        sims = queries[start:start + chunk] @ candidates.T
        correct = query_ids[start:start + chunk, None] == candidate_ids[None, :]
        if not correct.any(axis=1).all():
            raise InputError("a query has no correct candidate (check the match ids)")
        best = np.where(correct, sims, -np.inf).max(axis=1)
        # wrong candidates at least as close as the best correct one: its rank (0 = first)
        rank = np.sum(~correct & (sims >= best[:, None]), axis=1)
        for k in ks:
            hits[k] += int(np.sum(rank < k))
    return {k: hits[k] / len(queries) for k in ks}


def retrieval_recall(x, y, *, match_ids=None, ks: Sequence[int] = (1, 5, 10),
                     chunk: int = 1024) -> dict[str, float]:
    """Recall@k of pair retrieval by cosine similarity, both directions.

    x (n, d) and y (n, d): ``x[i]`` and ``y[i]`` are a pair (a sample and its caption).
    ``x_to_y``: query ``x[i]``, candidates all of ``y``; ``y_to_x`` the other way. A candidate
    ``j`` is correct for query ``i`` iff ``match_ids[j] == match_ids[i]`` (default
    ``arange(n)``: only the pair itself; pass caption ids so that identical captions, which
    have identical embeddings, all count). Returns ``{"x_to_y_r1": ..., "y_to_x_r10": ...}``.
    """
    x, y = as_matrix("x", x), as_matrix("y", y)
    if x.shape != y.shape:
        raise InputError(f"x and y must be paired (n, d) arrays of one shape; got {x.shape} "
                         f"and {y.shape}")
    if not ks or min(ks) < 1:
        raise InputError(f"ks must be positive integers; got {ks}")
    ids = np.arange(len(x)) if match_ids is None else np.asarray(match_ids)
    if ids.shape != (len(x),):
        raise InputError(f"match_ids must be ({len(x)},); got {ids.shape}")
    x, y = unit_rows(x), unit_rows(y)
    out = {}
    for name, (q, c) in {"x_to_y": (x, y), "y_to_x": (y, x)}.items():
        for k, r in _recall(q, c, ids, ids, tuple(ks), chunk).items():
            out[f"{name}_r{k}"] = r
    return out
