"""Per-device sharded losses as custom VJPs that own their collectives.

The engine behind :mod:`contrastive_jax.losses.sharded` (read that module's docstring for the three
strategies and what each means). Every function here runs inside ``shard_map`` on one device's
rows, with the mesh axis in a static :class:`Setup`:

- :func:`streamed_loss`: passes of this device's anchors against all devices' candidates,
  chunk by chunk (:mod:`contrastive_jax.losses.chunk_stream`), gathered or passed round the ring;
  NT-Xent, and CLIP without gradient through the gather (one pass per direction).
- :func:`clip_one_pass`: exact CLIP, both directions from one tile pass, the column statistics
  merged across devices.

Forward and backward passes of several passes are sequenced (an optimization barrier) so their
chunks and accumulators share memory. The scale cotangent is psum'd inside each rule, as
``shard_map(check_vma=True)`` requires of a replicated input.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from contrastive_jax.losses.chunk_stream import (
    Embeddings,
    chunk_grads,
    chunk_normalisers,
    empty_stats,
    make_chunk_plan,
    to_partners,
    varying_like,
)
from contrastive_jax.losses.normalize import l2_normalize_vjp
from contrastive_jax.losses.tile_kernels import (
    Normaliser,
    RowWeights,
    negative_probabilities,
    negatives_minus_positive,
)

Array = jax.Array


def _ring_step(x, axis_name, size):
    return lax.ppermute(x, axis_name, [(i, (i + 1) % size) for i in range(size)])


class Setup(NamedTuple):
    """Static description of a sharded loss: its mesh axis, chunk kind, strategy and passes.

    ``passes``: ``(anchors, candidates, weight)`` triples, indices into the inputs; the loss is
    ``sum_p weight_p * sum over all anchors of pass p of their row loss``. CLIP runs ``x``
    against ``y`` and ``y`` against ``x`` (two passes over two inputs); NT-Xent runs ``[z1; z2]``
    against itself (one pass over one input).
    """

    axis_name: str
    size: int
    kind: str
    strategy: str
    block: int
    passes: tuple[tuple[int, int, float], ...]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def streamed_loss(inputs, scale, setup):
    """``sum_p weight_p sum_anchors softplus(lse_negatives - S_positive)``, over all devices."""
    return _streamed_fwd(inputs, scale, setup)[0]


def _sequenced(values, *after):
    """``values`` once ``after`` is computed: one pass runs after the other, so that their
    chunks and accumulators can share memory instead of being live at once."""
    return lax.optimization_barrier((values, after))[0]


def _streamed_fwd(inputs, scale, setup):
    loss, residuals = jnp.zeros((), scale.dtype), []
    for i, (p, q, weight) in enumerate(setup.passes):
        if i:
            inputs = _sequenced(inputs, loss)
        rows, residual = _forward_pass(inputs[p], inputs[q], scale, setup)
        loss = loss + weight * rows
        residuals.append(residual)
    return lax.psum(loss, setup.axis_name), (inputs, scale, tuple(residuals))


def _forward_pass(anchors, candidates, scale, setup):
    """One pass: the row-loss sum of this device's anchors against all chunks, and residuals."""
    axis_name, size = setup.axis_name, setup.size
    plan = make_chunk_plan(anchors.shape[0], setup.block, setup.kind)
    a = Embeddings.of(anchors)
    stats, _ = chunk_normalisers(a, Embeddings.of(candidates), scale, True, plan,
                                 empty_stats(plan.n, anchors.dtype))
    gathered = None
    if setup.strategy == "ring":
        def hop(_, carry):
            stats, chunk = carry
            chunk = _ring_step(chunk, axis_name, size)
            return chunk_normalisers(a, Embeddings.of(chunk), scale, False, plan, stats)[0], chunk

        stats, _ = lax.fori_loop(1, size, hop, varying_like((stats, candidates), anchors))
    else:
        gathered = lax.all_gather(candidates, axis_name)  # (D, n, d)
        me = lax.axis_index(axis_name)

        def chunk(k, stats):  # the own chunk is done: skip it
            c = Embeddings.of(lax.dynamic_index_in_dim(gathered, k, keepdims=False))
            return chunk_normalisers(a, c, scale, False, plan, stats)[0]

        stats = lax.fori_loop(0, size - 1, lambda j, s: chunk((me + 1 + j) % size, s),
                              varying_like(stats, anchors))
    negatives, positive_cos = stats
    rows = jax.nn.softplus(negatives_minus_positive(negatives, scale * positive_cos))
    return jnp.sum(rows), (negatives, positive_cos, gathered)


def _streamed_bwd(setup, residuals, g):
    inputs, scale, per_pass = residuals
    grads: list[Array | None] = [None] * len(inputs)

    # through the normalisation (docs/derivations.md §2.2) into the input's gradient
    def add(index, g_hat):
        grad = l2_normalize_vjp(inputs[index], scale * g_hat)
        grads[index] = grad if grads[index] is None else grads[index] + grad

    g_scale = jnp.zeros((), scale.dtype)
    for i in reversed(range(len(setup.passes))):
        p, q, weight = setup.passes[i]
        if i < len(setup.passes) - 1:
            inputs = _sequenced(inputs, [x for x in grads if x is not None])
        g_a, g_c, total = _backward_pass(inputs[p], inputs[q], scale, per_pass[i], g * weight,
                                         setup)
        if p == q:  # NT-Xent: anchors and candidates are the same rows
            add(p, g_a + g_c)
        else:
            add(p, g_a)
            add(q, g_c)
        g_scale = g_scale + total
    grads = [jnp.zeros_like(x) if d is None else d for x, d in zip(inputs, grads, strict=True)]
    return tuple(grads), lax.psum(g_scale, setup.axis_name).astype(scale.dtype)


def _backward_pass(anchors, candidates, scale, residual, g, setup):
    """One pass backward: ``Gamma C_hat`` (anchors), ``Gamma^T A_hat`` (this device's own
    candidates, from every device's anchors unless the strategy drops them), ``sum Gamma C``."""
    axis_name, size, strategy = setup.axis_name, setup.size, setup.strategy
    negatives, positive_cos, gathered = residual
    plan = make_chunk_plan(anchors.shape[0], setup.block, setup.kind)
    a, own = Embeddings.of(anchors), Embeddings.of(candidates)
    positive = scale * positive_cos
    weights = negative_probabilities(negatives, positive, g)
    # The positives: Gamma_{i, pi(i)} = g (p_pos - 1), in O(n d), in the own chunk.
    gamma_pos = (-g * jax.nn.sigmoid(negatives_minus_positive(negatives, positive)))[:, None]
    g_a = gamma_pos * to_partners(own.hat(), plan)
    g_own = to_partners(gamma_pos * a.hat(), plan)  # the partner map is an involution
    zero = jnp.zeros((), anchors.dtype)
    g_a, g_own, total = chunk_grads(a, own, scale, True, weights, positive_cos, plan,
                                    (g_a, g_own, zero))
    if strategy == "ring":
        def hop(_, carry):
            chunk, g_chunk, g_a, total = carry
            chunk, g_chunk = _ring_step((chunk, g_chunk), axis_name, size)
            g_a, g_chunk, total = chunk_grads(a, Embeddings.of(chunk), scale, False, weights,
                                              positive_cos, plan, (g_a, g_chunk, total))
            return chunk, g_chunk, g_a, total

        # The own chunk's accumulator starts with the own anchors' terms and collects every
        # other device's on its way round; after D - 1 hops it sits on device (me - 1) with the
        # chunk's full gradient: one more hop brings it home.
        init = (candidates, g_own, g_a, total)
        _, g_chunk, g_a, total = lax.fori_loop(1, size, hop, varying_like(init, anchors))
        return g_a, _ring_step(g_chunk, axis_name, size), total
    me = lax.axis_index(axis_name)

    def chunk(j, carry):
        g_a, g_remote, total = carry
        k = (me + 1 + j) % size
        c = Embeddings.of(lax.dynamic_index_in_dim(gathered, k, keepdims=False))
        zeros = varying_like(jnp.zeros_like(candidates), anchors)
        g_a, g_k, total = chunk_grads(a, c, scale, False, weights, positive_cos, plan,
                                      (g_a, zeros, total))
        return g_a, lax.dynamic_update_index_in_dim(g_remote, g_k, k, 0), total

    g_remote = jnp.zeros_like(gathered)
    g_a, g_remote, total = lax.fori_loop(0, size - 1, chunk,
                                         varying_like((g_a, g_remote, total), anchors))
    if strategy == "all_gather":  # the gather's transpose: each chunk's gradient goes home
        return g_a, g_own + lax.psum_scatter(g_remote, axis_name, scatter_dimension=0), total
    return g_a, g_own, total  # all_gather_no_grad: the remote anchors' terms are dropped


streamed_loss.defvjp(_streamed_fwd, _streamed_bwd)


# ------------------------------------------------- CLIP, both directions in one pass


def _merge_over_devices(cols: Normaliser, axis_name: str) -> Normaliser:
    """The normaliser of the union over devices of per-device partial normalisers."""
    shift = lax.pmax(cols.shift, axis_name)
    safe = jnp.where(jnp.isfinite(shift), shift, 0.0)
    part = jnp.where(cols.total > 0, cols.total * jnp.exp(cols.shift - safe), 0.0)
    return Normaliser(shift, lax.psum(part, axis_name))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def clip_one_pass(x, y, scale, setup):
    """Exact CLIP, both directions, from one tile per (local x block, y chunk block).

    Each device's tiles ``s x_l y_k^T`` give its rows' statistics (direction x -> y) and its
    share of chunk ``k``'s column statistics (direction y -> x); the column shares are merged
    across devices (ring: they travel with the chunk and one last hop brings them home;
    gather: a log-sum-exp all-reduce of O(N) numbers). Half the matmuls and half the traffic
    of running the two directions as separate passes.
    """
    return _clip_one_pass_fwd(x, y, scale, setup)[0]


def _clip_one_pass_fwd(x, y, scale, setup):
    axis_name, size = setup.axis_name, setup.size
    (w_row, w_col) = (setup.passes[0][2], setup.passes[1][2])
    plan = make_chunk_plan(x.shape[0], setup.block, "clip")
    a = Embeddings.of(x)
    empty_cols = empty_stats(plan.n, x.dtype)[0]
    stats, own_cols = chunk_normalisers(a, Embeddings.of(y), scale, True, plan,
                                        empty_stats(plan.n, x.dtype), empty_cols)
    gathered = None
    if setup.strategy == "ring":
        def hop(_, carry):
            stats, chunk, cols = carry
            chunk, cols = _ring_step((chunk, cols), axis_name, size)
            stats, cols = chunk_normalisers(a, Embeddings.of(chunk), scale, False, plan, stats,
                                            cols)
            return stats, chunk, cols

        stats, _, cols = lax.fori_loop(1, size, hop,
                                       varying_like((stats, y, own_cols), x))
        columns = _ring_step(cols, axis_name, size)  # the own chunk's, complete, home
        all_columns = None
    else:
        gathered = lax.all_gather(y, axis_name)  # (D, n, d)
        me = lax.axis_index(axis_name)
        parts = Normaliser(*(jnp.zeros((size, plan.n), x.dtype) + e[None] for e in empty_cols))
        parts = Normaliser(*(lax.dynamic_update_index_in_dim(p, o, me, 0)
                             for p, o in zip(parts, own_cols, strict=True)))

        def chunk(j, carry):
            stats, parts = carry
            k = (me + 1 + j) % size
            c = Embeddings.of(lax.dynamic_index_in_dim(gathered, k, keepdims=False))
            cols = Normaliser(*(lax.dynamic_index_in_dim(p, k, keepdims=False) for p in parts))
            stats, cols = chunk_normalisers(a, c, scale, False, plan, stats, cols)
            parts = Normaliser(*(lax.dynamic_update_index_in_dim(p, q, k, 0)
                                 for p, q in zip(parts, cols, strict=True)))
            return stats, parts

        stats, parts = lax.fori_loop(0, size - 1, chunk, varying_like((stats, parts), x))
        all_columns = _merge_over_devices(parts, axis_name)  # (D, n): every column, complete
        columns = Normaliser(*(lax.dynamic_index_in_dim(p, me, keepdims=False)
                               for p in all_columns))
    rows, positive_cos = stats
    positive = scale * positive_cos
    loss = (w_row * jnp.sum(jax.nn.softplus(negatives_minus_positive(rows, positive)))
            + w_col * jnp.sum(jax.nn.softplus(negatives_minus_positive(columns, positive))))
    residuals = (x, y, scale, rows, columns, positive_cos, gathered, all_columns)
    return lax.psum(loss, axis_name), residuals


def _clip_one_pass_bwd(setup, residuals, g):
    x, y, scale, rows, columns, positive_cos, gathered, all_columns = residuals
    axis_name, size = setup.axis_name, setup.size
    (w_row, w_col) = (setup.passes[0][2], setup.passes[1][2])
    plan = make_chunk_plan(x.shape[0], setup.block, "clip")
    a, own = Embeddings.of(x), Embeddings.of(y)
    positive = scale * positive_cos
    row_w = negative_probabilities(rows, positive, g * w_row)
    col_w = negative_probabilities(columns, positive, g * w_col)  # this device's columns
    # The positives: Gamma_ii = -(alpha (1 - p^r_ii) + beta (1 - p^c_ii)), in O(n d).
    gamma_pos = -(g * w_row * jax.nn.sigmoid(negatives_minus_positive(rows, positive))
                  + g * w_col * jax.nn.sigmoid(negatives_minus_positive(columns, positive)))
    g_a = gamma_pos[:, None] * own.hat()
    g_own = gamma_pos[:, None] * a.hat()
    zero = jnp.zeros((), x.dtype)
    g_a, g_own, total = chunk_grads(a, own, scale, True, row_w, positive_cos, plan,
                                    (g_a, g_own, zero), col_w, positive_cos)
    if setup.strategy == "ring":
        def hop(_, carry):
            chunk, g_chunk, cw, cpos, g_a, total = carry
            chunk, g_chunk, cw, cpos = _ring_step((chunk, g_chunk, cw, cpos), axis_name, size)
            g_a, g_chunk, total = chunk_grads(a, Embeddings.of(chunk), scale, False, row_w,
                                              positive_cos, plan, (g_a, g_chunk, total), cw,
                                              cpos)
            return chunk, g_chunk, cw, cpos, g_a, total

        init = (y, g_own, col_w, positive_cos, g_a, total)
        _, g_chunk, _, _, g_a, total = lax.fori_loop(1, size, hop, varying_like(init, x))
        g_c = _ring_step(g_chunk, axis_name, size)
    else:
        me = lax.axis_index(axis_name)
        all_pos = lax.all_gather(positive_cos, axis_name)  # (D, n): every column's positive
        all_w = negative_probabilities(all_columns, scale * all_pos, g * w_col)

        def chunk(j, carry):
            g_a, g_remote, total = carry
            k = (me + 1 + j) % size
            c = Embeddings.of(lax.dynamic_index_in_dim(gathered, k, keepdims=False))
            cw = RowWeights(*(lax.dynamic_index_in_dim(p, k, keepdims=False) for p in all_w))
            zeros = varying_like(jnp.zeros_like(y), x)
            g_a, g_k, total = chunk_grads(a, c, scale, False, row_w, positive_cos, plan,
                                          (g_a, zeros, total), cw,
                                          lax.dynamic_index_in_dim(all_pos, k, keepdims=False))
            return g_a, lax.dynamic_update_index_in_dim(g_remote, g_k, k, 0), total

        g_remote = jnp.zeros_like(gathered)
        g_a, g_remote, total = lax.fori_loop(0, size - 1, chunk,
                                             varying_like((g_a, g_remote, total), x))
        g_c = g_own + lax.psum_scatter(g_remote, axis_name, scatter_dimension=0)
    g_scale = lax.psum(total, axis_name).astype(scale.dtype)
    return (l2_normalize_vjp(x, scale * g_a), l2_normalize_vjp(y, scale * g_c), g_scale)


clip_one_pass.defvjp(_clip_one_pass_fwd, _clip_one_pass_bwd)
