"""How the other devices' rows reach this one: in place, gathered, or passed round a ring.

A sharded loss meets this device's rows with every device's *payload* (its candidate rows, and
in the backward pass their weights). :func:`meet_payloads` runs one ``body(payload, acc, carry)``
per payload met, whatever the exchange, and brings each payload's *accumulator* (what this device's
rows contributed to that payload's own rows: column statistics forward, gradients backward) home
to the payload's owner, combined over every device that met it:

- ``local`` (one device, no mesh axis): the own payload only;
- ``all_gather``: every payload gathered at once (``(D - 1)`` chunks in); the accumulators come
  home by a reduce-scatter (gradients) or a log-sum-exp all-reduce of O(N) numbers (statistics);
- ``ring``: no gather: the payload and its accumulator travel round the devices with
  ``ppermute``, one hop at a time, and one last hop brings the accumulator home. Per-device
  memory O((N / D) d).

``half=True`` meets each *pair* of devices once (a symmetric loss, NT-Xent, docs/derivations.md
§14.5): device ``a`` meets the payloads of ``a - 1 .. a - D/2`` (the ring's first ``D/2`` hops),
and when ``D`` is even, the pair ``{a, a + D/2}`` only on the lower device of the two.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from contrastive_jax.losses.tiling.tile import Normaliser, varying_like

STRATEGIES = ("all_gather", "all_gather_no_grad", "ring")


class RowExchange(NamedTuple):
    """How rows arrive (static): ``strategy`` (``"local"`` or one of :data:`STRATEGIES`), the
    mesh axis, its size."""

    strategy: str = "local"
    axis_name: str | None = None
    size: int = 1

    @property
    def sharded(self) -> bool:
        return self.strategy != "local"

    def psum(self, x):
        return lax.psum(x, self.axis_name) if self.sharded else x

    def hops(self, half: bool) -> int:
        """How many other payloads this device meets."""
        return self.size // 2 if half else self.size - 1


def _active(exchange: RowExchange, hop, half: bool):
    """Whether this device computes at ``hop``: the pair ``{a, a + D/2}`` once, on ``a < D/2``."""
    if not half or exchange.size % 2:
        return jnp.asarray(True)
    return (hop < exchange.size // 2) | (lax.axis_index(exchange.axis_name) < exchange.size // 2)


def _step(exchange: RowExchange, tree):
    perm = [(i, (i + 1) % exchange.size) for i in range(exchange.size)]
    return lax.ppermute(tree, exchange.axis_name, perm)


def _reduce_stats(stacked, exchange: RowExchange):
    """Per-device partial statistics ``(D, n)`` of every payload -> the own payload's, merged."""

    def one(part: Normaliser) -> Normaliser:
        shift = lax.pmax(part.shift, exchange.axis_name)
        safe = jnp.where(jnp.isfinite(shift), shift, 0.0)
        # an empty part adds 0; a NaN total (a NaN logit) stays NaN
        total = lax.psum(jnp.where(part.total == 0, 0.0, part.total * jnp.exp(part.shift - safe)),
                         exchange.axis_name)
        me = lax.axis_index(exchange.axis_name)
        return Normaliser(*(lax.dynamic_index_in_dim(a, me, keepdims=False)
                            for a in (shift, total)))

    return jax.tree.map(one, stacked, is_leaf=lambda x: isinstance(x, Normaliser))


def _reduce_sum(stacked, exchange: RowExchange):
    return jax.tree.map(lambda a: lax.psum_scatter(a, exchange.axis_name, scatter_dimension=0),
                        stacked)


def meet_payloads(exchange: RowExchange, payload, acc, body: Callable, carry, *,
                  own: bool = True, half: bool = False):
    """``body(payload, acc, carry, own) -> (acc, carry)`` on every payload this device meets.

    ``payload``: this device's (a pytree of arrays); ``acc``: the identity of its accumulator
    (empty :class:`~contrastive_jax.losses.tiling.tile.Stats` or zeros; ``None`` for none);
    ``own``: meet the own payload too (the body is told, statically, which payload is its own).
    Returns ``(carry, acc)``, ``acc`` the own payload's accumulator combined over every device
    that met it.
    """
    if not exchange.sharded:
        return (body(payload, acc, carry, True)[::-1]) if own else (carry, acc)
    if exchange.strategy == "ring":
        return _ring(exchange, payload, acc, body, carry, own, half)
    return _gather(exchange, payload, acc, body, carry, own, half)


def _ring(exchange, payload, acc, body, carry, own, half):
    if own:
        acc, carry = body(payload, acc, carry, True)
    hops = exchange.hops(half)

    def meet(hop, state):
        payload, acc, carry = state
        payload, acc = _step(exchange, (payload, acc))  # the payload and its accumulator, a hop
        return (payload, *lax.cond(_active(exchange, hop, half),
                                   lambda: body(payload, acc, carry, False),
                                   lambda: (acc, carry)))

    payload, acc, carry = lax.fori_loop(1, hops + 1, meet,
                                        varying_like((payload, acc, carry), payload))
    if acc is not None:  # the rest of the way home: the accumulator alone
        acc = lax.fori_loop(hops + 1, exchange.size + 1, lambda _, a: _step(exchange, a), acc)
    return carry, acc


def _gather(exchange, payload, acc, body, carry, own, half):
    gathered = lax.all_gather(payload, exchange.axis_name)  # (D, ...) per leaf
    me = lax.axis_index(exchange.axis_name)
    own_acc = acc
    if own:  # the own payload, from its local copy
        own_acc, carry = body(payload, acc, carry, True)
    stacked = None if acc is None else jax.tree.map(
        lambda a: jnp.zeros((exchange.size, *a.shape), a.dtype) + a[None], acc)

    def meet(j, state):
        stacked, carry = state
        k = (me - j) % exchange.size  # the ring's order: payload of device me - j
        here = jax.tree.map(lambda a: lax.dynamic_index_in_dim(a, k, keepdims=False), gathered)
        piece = None if stacked is None else jax.tree.map(
            lambda a: lax.dynamic_index_in_dim(a, k, keepdims=False), stacked)
        piece, carry = lax.cond(_active(exchange, j, half), lambda: body(here, piece, carry, False),
                                lambda: (piece, carry))
        if stacked is not None:
            stacked = jax.tree.map(lambda a, p: lax.dynamic_update_index_in_dim(a, p, k, 0),
                                   stacked, piece)
        return stacked, carry

    if stacked is not None and own:
        stacked = jax.tree.map(lambda a, p: lax.dynamic_update_index_in_dim(a, p, me, 0),
                               stacked, own_acc)
    stacked, carry = lax.fori_loop(1, exchange.hops(half) + 1, meet,
                                   varying_like((stacked, carry), payload))
    if stacked is None:
        return carry, None
    statistics = any(isinstance(leaf, Normaliser) for leaf in jax.tree.leaves(
        acc, is_leaf=lambda x: isinstance(x, Normaliser)))
    return carry, (_reduce_stats if statistics else _reduce_sum)(stacked, exchange)

