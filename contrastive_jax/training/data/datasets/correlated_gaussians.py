"""Correlated Gaussians with known mutual information, for the InfoNCE bound experiment.

x ~ N(0, I_d), y = rho x + sqrt(1 - rho^2) eps with eps ~ N(0, I_d) independent, so each
coordinate pair is bivariate normal with correlation rho and

    I(X; Y) = -(d / 2) log(1 - rho^2)   nats

(the sum of d independent pairs, each -1/2 log(1 - rho^2)). This is the setup of Poole et al.
2019 used to test the bound I(X; Y) >= log N - L_N of docs/derivations.md §15.1.

Two forms, same distribution: :func:`sample` (jit-able, one key, for experiment loops) and
:class:`CorrelatedGaussians` (a random-access source, example ``i`` from its own seed, so the
grain pipeline shuffles, shards, batches and checkpoints it like any TFDS split).
:func:`log_density_ratio` is the optimal critic log p(y | x) / p(y), the reference line of
``experiments/mi_bound.py``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from contrastive_jax.errors import ConfigError


def mutual_information(dim: int, rho: float) -> float:
    """I(X; Y) = -(dim / 2) log(1 - rho^2) in nats."""
    _check(dim, rho)
    return -0.5 * dim * math.log1p(-rho * rho)


def correlation_for(mi: float, dim: int) -> float:
    """The rho with ``mutual_information(dim, rho) == mi``: sqrt(1 - exp(-2 mi / dim))."""
    if mi < 0 or dim < 1:
        raise ConfigError(f"need mi >= 0 and dim >= 1; got mi={mi}, dim={dim}")
    return math.sqrt(-math.expm1(-2.0 * mi / dim))


def sample(key: jax.Array, n: int, dim: int, rho: float,
           dtype=jnp.float32) -> tuple[jax.Array, jax.Array]:
    """``(x, y)``, each ``(n, dim)``: n independent pairs."""
    _check(dim, rho)
    kx, ke = jax.random.split(key)
    x = jax.random.normal(kx, (n, dim), dtype)
    eps = jax.random.normal(ke, (n, dim), dtype)
    return x, rho * x + math.sqrt(1.0 - rho * rho) * eps


def log_density_ratio(x: jax.Array, y: jax.Array, rho: float) -> jax.Array:
    """The optimal critic: ``S_ij = log p(y_j | x_i) / p(y_j)`` for all pairs, (N, M).

    ``x`` (N, dim), ``y`` (M, dim). Per coordinate ``p(y | x) = N(rho x, 1 - rho^2)`` and
    ``p(y) = N(0, 1)``, so with ``s = 1 - rho^2``

        S_ij = -(dim / 2) log s - |y_j - rho x_i|^2 / (2 s) + |y_j|^2 / 2.

    InfoNCE with these scores is the best the bound of docs/derivations.md §15 can do at this N (the
    Bayes classifier of the positive's index, §15.2, §15.4); its expectation ``E[log N - L]`` lies
    below
    ``min(I(X; Y), log N)``. Terms that depend on ``x_i`` alone cancel in the row softmax.
    ``rho`` may be traced (one compilation for every rho); a Python number is checked.
    """
    if not isinstance(rho, jax.Array):
        _check(x.shape[-1], rho)
    s = 1.0 - rho * rho
    sq = (jnp.sum(y * y, axis=-1)[None, :] - 2.0 * rho * (x @ y.T)
          + rho * rho * jnp.sum(x * x, axis=-1)[:, None])
    return -0.5 * x.shape[-1] * jnp.log(s) - sq / (2.0 * s) + 0.5 * jnp.sum(y * y, axis=-1)


class CorrelatedGaussians:
    """``num_examples`` pairs ``{"x": (dim,), "y": (dim,)}`` float32; pair ``i`` from ``(seed, i)``.

    Random access (``len`` and ``[i]``), deterministic in ``(seed, i)``: usable as a grain
    source anywhere a TFDS ``data_source`` split is. :attr:`true_mutual_information` is the
    known ``I(X; Y)`` of its pairs (a source whose MI is known has this attribute; the MI
    critic reports it next to its estimate).
    """

    def __init__(self, num_examples: int, dim: int, rho: float, seed: int = 0):
        _check(dim, rho)
        if num_examples < 1:
            raise ConfigError(f"num_examples must be >= 1; got {num_examples}")
        self.num_examples, self.dim, self.rho, self.seed = num_examples, dim, rho, seed

    def __len__(self) -> int:
        return self.num_examples

    @property
    def true_mutual_information(self) -> float:
        """:func:`mutual_information` of the pairs, in nats."""
        return mutual_information(self.dim, self.rho)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        if not 0 <= i < self.num_examples:
            raise IndexError(f"index {i} out of range for {self.num_examples} examples")
        rng = np.random.default_rng([self.seed, int(i)])
        x, eps = rng.standard_normal((2, self.dim))
        y = self.rho * x + math.sqrt(1.0 - self.rho * self.rho) * eps
        return {"x": x.astype(np.float32), "y": y.astype(np.float32)}

    def __repr__(self) -> str:
        return (f"CorrelatedGaussians(num_examples={self.num_examples}, dim={self.dim}, "
                f"rho={self.rho}, seed={self.seed})")


def _check(dim: int, rho: float) -> None:
    if dim < 1:
        raise ConfigError(f"dim must be >= 1; got {dim}")
    if not -1.0 < rho < 1.0:
        raise ConfigError(f"rho must lie in (-1, 1) (|rho| = 1 has infinite MI); got {rho}")
