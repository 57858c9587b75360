"""L2 normalisation onto the unit sphere, zero-norm safe, with its exact Jacobian."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from contrastive_jax.losses.parts.validation import loss_dtype

Array = jax.Array

DEFAULT_EPS = 1e-12


def l2_normalize(x: Array, axis: int = -1, eps: float = DEFAULT_EPS) -> Array:
    """Project ``x`` onto the unit sphere along ``axis``: ``x / max(||x||, eps)``.

    Shapes: any ``x``; the output has the shape and dtype of ``x`` (the arithmetic runs in
    float32 for half-precision inputs).

    Jacobian (docs/derivations.md §2.2). Where ``||x|| > eps``,
    ``d x_hat / d x = (I - x_hat x_hat^T) / ||x||``: symmetric, and its image is the tangent
    space of the sphere at ``x_hat``, so the gradient that reaches ``x`` is orthogonal to ``x``
    (docs/derivations.md §2.4, §12.1) and shrinks as ``1 / ||x||``.

    What ``eps`` changes. Where ``||x|| <= eps`` (an all-zero embedding, say) the output is
    ``x / eps``: no longer unit length (zero maps to zero, so its logits are all 0) and the
    Jacobian is ``I / eps``, finite, so gradients stay finite (at most ``1/eps`` times the
    upstream gradient). Above ``eps`` the result and its Jacobian are exactly the textbook ones;
    unlike the smoothed ``x / sqrt(||x||^2 + eps^2)`` form there is no O(eps^2 / ||x||^2) bias,
    which is why the analytic gradients in :mod:`contrastive_jax.analytic` match autodiff to
    float64 round-off.

    References:
      docs/derivations.md §2 (the clamped map and its Jacobian).

    Example (a zero row stays zero):

      >>> import jax.numpy as jnp
      >>> from contrastive_jax.losses import l2_normalize
      >>> l2_normalize(jnp.array([[3.0, 4.0], [0.0, 0.0]])).tolist()
      [[0.6000000238418579, 0.800000011920929], [0.0, 0.0]]
    """
    dtype = jnp.result_type(x)
    xc = jnp.asarray(x, loss_dtype(x))
    return (xc / jnp.expand_dims(clamped_norms(xc, axis, eps), axis)).astype(dtype)


def clamped_norms(x: Array, axis: int = -1, eps: float = DEFAULT_EPS) -> Array:
    """``max(||x_i||, eps)`` per row: (N, d) -> (N,); ``l2_normalize(x) == x / norms[:, None]``.

    Lets a tiled loss normalise one block of rows at a time, bit for bit as
    :func:`l2_normalize` does, instead of materialising the normalised embeddings.
    """
    # Squared norm first: sqrt is only ever applied to a value >= eps**2, so its derivative is
    # finite even for an all-zero row (where max() routes the gradient to the constant).
    return jnp.sqrt(jnp.maximum(jnp.sum(x * x, axis=axis), eps * eps))


def l2_normalize_vjp(x: Array, g: Array, axis: int = -1, eps: float = DEFAULT_EPS) -> Array:
    """Exact vector-Jacobian product of :func:`l2_normalize`: ``g`` at ``x_hat`` to ``x``.

    ``(I - x_hat x_hat^T) g / ||x||`` row by row where ``||x|| > eps`` (docs/derivations.md
    §2.2-2.3), and ``g / eps`` where ``||x|| <= eps``. Used by the hand-written backward passes of
    the losses; computed in the dtype of ``g``.
    """
    x = jnp.asarray(x, jnp.result_type(g))
    sq = jnp.sum(x * x, axis=axis, keepdims=True)
    above = sq > eps * eps
    norm = jnp.sqrt(jnp.where(above, sq, 1.0))
    x_hat = x / norm
    radial = jnp.sum(x_hat * g, axis=axis, keepdims=True)
    return jnp.where(above, (g - radial * x_hat) / norm, g / eps)
