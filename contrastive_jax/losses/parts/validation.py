"""Input checks at the loss boundary.

Every public loss checks ranks, shapes, dtypes and plain-number hyper-parameters here, before
tracing, so a mistake surfaces as a ``ValueError`` that names the offending argument instead of a
shape error deep inside XLA. Values that are traced (inside ``jit``) cannot be inspected; only
their shapes and dtypes are checked then.
"""

from __future__ import annotations

import math
import numbers
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from contrastive_jax.errors import InputError

Array = jax.Array


def loss_dtype(*arrays: Array) -> jnp.dtype:
    """The dtype the losses compute in: float32, or float64 if an input is float64.

    bfloat16 and float16 embeddings are promoted to float32 before the logits and the log-sum-exp
    are formed, so that a logit scale of 100 never overflows a half-precision exponent.
    """
    return jnp.promote_types(jnp.result_type(*arrays), jnp.float32)


# Deprecated ``impl`` names -> their new names (kept for one release). ``"analytic"`` read as the
# ``contrastive_jax.analytic`` package; the impl is the dense loss with a hand-written VJP.
IMPL_ALIASES = {"analytic": "dense_vjp"}


def renamed_impl(impl: str, stacklevel: int = 3) -> str:
    """``impl`` with a deprecated name replaced by its new one (a ``DeprecationWarning`` says
    which, attributed ``stacklevel`` frames up); any other value unchanged."""
    if impl in IMPL_ALIASES:
        new = IMPL_ALIASES[impl]
        warnings.warn(f"impl={impl!r} is deprecated and will be removed in the next release; "
                      f"use impl={new!r} (the same dense loss with a hand-written backward)",
                      DeprecationWarning, stacklevel=stacklevel)
        return new
    return impl


def check_impl(impl: str, choices: tuple[str, ...]) -> str:
    """One of ``choices``, after :func:`renamed_impl`: the name to dispatch on."""
    impl = renamed_impl(impl, stacklevel=4)  # the loss's caller
    check_choice("impl", impl, choices)
    return impl


def check_embeddings(name: str, x: Array) -> None:
    """A rank-2 (batch, dim) floating-point array."""
    shape = jnp.shape(x)
    if len(shape) != 2:
        raise InputError(
            f"{name} must be a rank-2 (batch, dim) array of embeddings; got shape {shape} "
            f"(rank {len(shape)}). Flatten extra axes or add a batch axis."
        )
    dtype = jnp.result_type(x)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise InputError(
            f"{name} must be floating point (float32, bfloat16 or float64); got dtype {dtype}. "
            "Cast the embeddings before calling the loss."
        )


def check_pair(x_name: str, x: Array, y_name: str, y: Array) -> None:
    """Two embedding batches with the same (batch, dim) shape."""
    check_embeddings(x_name, x)
    check_embeddings(y_name, y)
    if jnp.shape(x) != jnp.shape(y):
        what = "batch sizes" if jnp.shape(x)[0] != jnp.shape(y)[0] else "embedding dims"
        raise InputError(
            f"{x_name} and {y_name} must have the same shape; got {x_name} {jnp.shape(x)} and "
            f"{y_name} {jnp.shape(y)} (the {what} differ: row i of one is paired with row i "
            "of the other, and both must live in the same embedding space)."
        )


def check_has_negatives(name: str, n: int, what: str = "batch size") -> None:
    """At least two candidates, so that every anchor has a negative."""
    if n < 2:
        raise InputError(
            f"{name} has {what} {n}; a contrastive loss needs at least 2 candidates per anchor "
            "(one positive and at least one negative). Use a larger batch."
        )


def _concrete_scalar(value) -> float | None:
    """The value as a float if it is known now (not traced), else None."""
    if isinstance(value, jax.core.Tracer):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    arr = np.asarray(value)
    if arr.shape != ():
        return None
    return float(arr)


def check_scalar(name: str, value) -> None:
    """A scalar (a Python number or a shape-() array)."""
    if jnp.shape(value) != ():
        raise InputError(f"{name} must be a scalar; got shape {jnp.shape(value)}.")


def check_positive(name: str, value, *, allow_inf: bool = False) -> None:
    """A positive, finite scalar (or ``inf`` where allowed); checked whenever the value is
    known (not traced)."""
    check_scalar(name, value)
    v = _concrete_scalar(value)
    if v is not None and not (v > 0 and (math.isfinite(v) or (allow_inf and v == math.inf))):
        what = "a positive number or inf" if allow_inf else "a positive finite number"
        raise InputError(f"{name} must be {what}; got {v}.")


def check_block_size(block_size: int | None, impl: str, default: int) -> int | None:
    """A positive integer block size, given only together with ``impl="tiled"``."""
    if impl != "tiled":
        if block_size is not None:
            raise InputError(
                f"block_size={block_size} only applies to impl='tiled'; got impl={impl!r}. "
                "Pass impl='tiled' or drop block_size."
            )
        return None
    if block_size is None:
        return default
    if isinstance(block_size, bool) or not isinstance(block_size, numbers.Integral) or (
        block_size < 1
    ):
        raise InputError(f"block_size must be a positive integer; got {block_size!r}.")
    return int(block_size)


def check_ids(name: str, ids, n: int) -> None:
    """``None`` or an integer array of shape ``(n,)``: equal ids mark positives (§5)."""
    if ids is None:
        return
    shape, dtype = jnp.shape(ids), jnp.result_type(ids)
    if shape != (n,) or not jnp.issubdtype(dtype, jnp.integer):
        raise InputError(f"{name} must be an integer array of shape ({n},), one id per row "
                         f"(equal ids are positives); got shape {shape}, dtype {dtype}.")


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    """One of a fixed set of strings."""
    if value not in choices:
        raise InputError(f"{name} must be one of {choices}; got {value!r}.")
