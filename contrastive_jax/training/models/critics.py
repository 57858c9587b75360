"""Critics ``f(x, y)`` for InfoNCE mutual-information estimation (Poole et al. 2019).

Both critics map ``x`` (N, dx) and ``y`` (M, dy) to the (N, M) score matrix ``S_ij = f(x_i,
y_j)``, the logits of the N-way InfoNCE classification of docs/derivations.md §15.1 (``L_N`` with
the positive critic ``exp S_ij``): ``info_nce(S, arange(N))`` is ``L_N`` and ``log N - L_N`` the
bound (§15.1).

* :class:`SeparableCritic`: ``S = g(x) h(y)^T`` with two MLPs (one matmul for all N x M pairs).
* :class:`ConcatCritic`: one MLP on the concatenation ``[x_i, y_j]``, evaluated on every pair:
  N x M MLP evaluations (any function of the pair, not only an inner product; and N x M
  evaluations of the hidden layers instead of N + M).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from contrastive_jax.errors import InputError
from contrastive_jax.training.models.encoders.mlp import MLPEncoder


class SeparableCritic(nnx.Module):
    """``S_ij = g(x_i) . h(y_j)``: Poole et al. 2019's separable critic (a plain dot product).

    ``g`` and ``h`` are :class:`MLPEncoder` s (``depth`` x ``hidden`` ReLU, ``features``-d
    output). Input ``x`` (N, in_x), ``y`` (M, in_y); output (N, M) float32.
    """

    def __init__(self, *, in_x: int, in_y: int, hidden: int = 256, depth: int = 2,
                 features: int = 32, rngs: nnx.Rngs):
        self.g = MLPEncoder(in_features=in_x, hidden=hidden, depth=depth, features=features,
                            rngs=rngs)
        self.h = MLPEncoder(in_features=in_y, hidden=hidden, depth=depth, features=features,
                            rngs=rngs)

    def __call__(self, x: jax.Array, y: jax.Array) -> jax.Array:
        return self.g(x, train=False) @ self.h(y, train=False).T


class ConcatCritic(nnx.Module):
    """``S_ij = MLP([x_i, y_j])``: ``depth`` x (Linear -> ReLU) of width ``hidden``, then a scalar.

    ``__call__(x, y)``: ``x`` (N, in_x), ``y`` (M, in_y) -> (N, M), all pairs. The first layer
    is linear in the concatenation, ``W [x; y] + b = W_x x + (W_y y + b)``, so it is computed as
    an (N, 1, hidden) + (1, M, hidden) broadcast instead of materialising the (N, M, in_x + in_y)
    inputs; the later layers run on the (N, M, hidden) activations. Cost: N M (hidden^2 (depth -
    1) + hidden) multiply-adds per call. :meth:`pairs` applies the same MLP literally to aligned
    rows, (B, in_x), (B, in_y) -> (B,); ``S_ij == pairs(x_i, y_j)`` up to float rounding.
    """

    def __init__(self, *, in_x: int, in_y: int, hidden: int = 256, depth: int = 2,
                 rngs: nnx.Rngs):
        if depth < 1:
            raise InputError(f"ConcatCritic needs depth >= 1; got {depth}")
        self.first = nnx.Linear(in_x + in_y, hidden, rngs=rngs)
        self.layers = nnx.List([nnx.Linear(hidden, hidden, rngs=rngs) for _ in range(depth - 1)])
        self.out = nnx.Linear(hidden, 1, rngs=rngs)
        self.in_x, self.in_y = in_x, in_y

    def __call__(self, x: jax.Array, y: jax.Array) -> jax.Array:
        self._check(x, y, same_rows=False)
        kernel, bias = self.first.kernel[...], self.first.bias[...]
        hx = x @ kernel[: self.in_x]
        hy = y @ kernel[self.in_x :] + bias
        return self._tail(nnx.relu(hx[:, None, :] + hy[None, :, :]))

    def pairs(self, x: jax.Array, y: jax.Array) -> jax.Array:
        """``f(x_b, y_b)`` for aligned rows: (B, in_x), (B, in_y) -> (B,)."""
        self._check(x, y, same_rows=True)
        return self._tail(nnx.relu(self.first(jnp.concatenate([x, y], axis=-1))))

    def _tail(self, h: jax.Array) -> jax.Array:
        for layer in self.layers:
            h = nnx.relu(layer(h))
        return self.out(h)[..., 0]

    def _check(self, x: jax.Array, y: jax.Array, *, same_rows: bool) -> None:
        if x.ndim != 2 or x.shape[1] != self.in_x or y.ndim != 2 or y.shape[1] != self.in_y:
            raise InputError(f"ConcatCritic expects x (N, {self.in_x}) and y (M, {self.in_y}); "
                             f"got {x.shape} and {y.shape}")
        if same_rows and x.shape[0] != y.shape[0]:
            raise InputError(f"pairs needs as many x as y rows; got {x.shape} and {y.shape}")
