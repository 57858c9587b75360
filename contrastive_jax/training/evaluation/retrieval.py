"""Retrieval Recall@k, both directions: between paired embeddings (a sample and its caption,
:func:`retrieval_recall`) and between images and their several captions
(:func:`caption_retrieval_recall`, bounded memory).
"""

from __future__ import annotations

import functools
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


SCORE_BUDGET = 2 ** 24  # scores of one chunk of queries (64 MiB in float32)


def caption_retrieval_recall(image_embeddings, text_embeddings, text_image, *,
                             ks: Sequence[int] = (1, 5, 10),
                             score_budget: int = SCORE_BUDGET) -> dict[str, float]:
    """Image-text retrieval Recall@k with several captions per image, both directions.

    image_embeddings (n_images, d), text_embeddings (n_texts, d), text_image (n_texts,) ints:
    caption ``t`` describes image ``text_image[t]``. Cosine similarities; candidates ranked by
    score, highest first, ties to the lower index (docs/evaluation.md, "Metrics"):

    - ``text_to_image_r{k}``: the fraction of captions whose image is among the first ``k``
      images;
    - ``image_to_text_r{k}``: the fraction of images with at least one of their captions among
      the first ``k`` captions (every caption of an image counts as its match: CLIP_benchmark's
      and DataComp's definition, [CLIP] Sec. 3.1.5 on MS-COCO / Flickr30k);
    - ``mean_r{k}``: their mean (DataComp's retrieval score is ``mean_r1``).

    Memory: the score matrix is never whole; queries go in chunks of at most ``score_budget``
    scores (:func:`first_match_ranks`). An image without a caption is an :class:`InputError`.
    """
    images = _features("image_embeddings", image_embeddings)
    texts = _features("text_embeddings", text_embeddings)
    owner = np.asarray(text_image)
    if images.shape[1] != texts.shape[1]:
        raise InputError(f"image and text embeddings need one width; got {images.shape} and "
                         f"{texts.shape}")
    if owner.shape != (len(texts),) or not np.issubdtype(owner.dtype, np.integer) or \
            (owner.size and (owner.min() < 0 or owner.max() >= len(images))):
        raise InputError(f"text_image must be ({len(texts)},) image indices in [0, "
                         f"{len(images)}); got shape {owner.shape}")
    if not ks or min(ks) < 1:
        raise InputError(f"ks must be positive integers; got {tuple(ks)}")
    missing = np.setdiff1d(np.arange(len(images)), owner)
    if missing.size:
        raise InputError(f"images {missing[:5].tolist()} have no caption (text_image names "
                         "every image at least once)")
    images, texts = unit_rows(images), unit_rows(texts)
    image_ids = np.arange(len(images))
    to_image = first_match_ranks(texts, images, owner, image_ids, score_budget=score_budget)
    to_text = first_match_ranks(images, texts, image_ids, owner, score_budget=score_budget)
    out = {}
    for k in ks:
        out[f"image_to_text_r{k}"] = float(np.mean(to_text < k))
        out[f"text_to_image_r{k}"] = float(np.mean(to_image < k))
        out[f"mean_r{k}"] = (out[f"image_to_text_r{k}"] + out[f"text_to_image_r{k}"]) / 2
    return out


def _features(name: str, x) -> np.ndarray:
    """``x`` as an (n, d) float array: float64 stays, anything else float32 (features of a
    large split are not doubled in memory)."""
    x = np.asarray(x)
    x = x if x.dtype == np.float64 else x.astype(np.float32)
    if x.ndim != 2:
        raise InputError(f"{name} must be (n, d); got shape {x.shape}")
    return x


def first_match_ranks(queries, candidates, query_ids, candidate_ids, *,
                      score_budget: int = SCORE_BUDGET) -> np.ndarray:
    """``(n_queries,)`` the rank of each query's first correct candidate (0 = the first).

    queries (n_q, d), candidates (n_c, d), unit rows; candidate ``j`` is correct for query ``i``
    when ``candidate_ids[j] == query_ids[i]``. Candidates ordered by ``q_i . c_j``, highest first,
    ties to the lower index; the rank of the best correct ``j*`` (the lowest index among the
    correct ones of the highest score) is ``#{wrong j : s_ij > s_ij*} + #{wrong j < j* : s_ij =
    s_ij*}``. A row with a non-finite score ranks ``n_c`` (never retrieved).

    Computed in chunks of ``max(1, score_budget // n_c)`` queries with one compiled program
    (the last chunk padded): the candidates stay on the device, each chunk's ``(chunk, n_c)``
    scores are reduced there, and only the ranks come back.
    """
    import jax.numpy as jnp

    n_q, n_c = len(queries), len(candidates)
    chunk = max(1, min(n_q, score_budget // max(n_c, 1)))
    cands = jnp.asarray(candidates)
    cand_ids = jnp.asarray(candidate_ids)
    ranks = []
    for start in range(0, n_q, chunk):
        q = np.asarray(queries[start:start + chunk])
        ids = np.asarray(query_ids[start:start + chunk])
        pad = chunk - len(q)
        if pad:
            q = np.concatenate([q, np.zeros((pad, q.shape[1]), q.dtype)])
            ids = np.concatenate([ids, np.repeat(ids[:1], pad)])
        ranks.append(np.asarray(_chunk_ranks(jnp.asarray(q), jnp.asarray(ids), cands,
                                             cand_ids))[:chunk - pad])
    return np.concatenate(ranks) if ranks else np.zeros((0,), np.int64)


def _chunk_ranks(q, q_ids, c, c_ids):
    return _jitted_chunk_ranks()(q, q_ids, c, c_ids)


@functools.cache
def _jitted_chunk_ranks():
    import jax
    import jax.numpy as jnp

    def ranks(q, q_ids, c, c_ids):
        s = q @ c.T
        correct = q_ids[:, None] == c_ids[None, :]
        best = jnp.max(jnp.where(correct, s, -jnp.inf), axis=1, keepdims=True)
        index = jnp.arange(c.shape[0])[None, :]
        first = jnp.min(jnp.where(correct & (s == best), index, c.shape[0]), axis=1,
                        keepdims=True)
        above = (~correct) & ((s > best) | ((s == best) & (index < first)))
        rank = jnp.sum(above, axis=1)
        finite = jnp.all(jnp.isfinite(s), axis=1)
        return jnp.where(finite & (first[:, 0] < c.shape[0]), rank, c.shape[0])

    return jax.jit(ranks)
