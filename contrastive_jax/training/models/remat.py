"""Rematerialisation of repeated blocks (``config.model.remat``, ``config.model.remat_policy``).

A rematerialised block keeps only what its policy saves (with ``"nothing_saveable"``: its
inputs) from the forward pass and recomputes the rest in the backward pass ([Remat] in
docs/references.md; ``jax.checkpoint`` lifted to NNX modules by ``nnx.remat``). The forward
values and the gradients are the same functions of the parameters, so results agree with the
plain model up to the rounding of a recomputation (bit-identical on CPU in the tests); the
compiled temporaries shrink and the backward pass runs each block's forward again (about a
third more FLOPs with ``"nothing_saveable"``).

Policies (``jax.checkpoint_policies``), what is saved from the forward pass:

* ``"nothing_saveable"`` (default): nothing but the block's inputs; the smallest memory;
* ``"dots_saveable"``: every matmul's output; the elementwise work is recomputed;
* ``"dots_with_no_batch_dims_saveable"``: matmuls without batch dimensions (the dense layers,
  not attention's ``q k^T``).

On CPU the compiler undoes rematerialisation (:data:`CPU_COMPILER_OPTIONS` says why and how to
keep it for a memory estimate); TPU and GPU keep it.

Randomness is an argument of the block (dropout draws from per-example keys), so the
recomputation draws the same masks; BatchNorm's running statistics are updated once, by the
forward pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

from contrastive_jax.errors import ConfigError

POLICIES = ("nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable")
# XLA's CPU compiler drops the optimisation barriers that keep a rematerialised forward pass
# apart (its pass "cse_barrier_expander") and CSE then merges the recomputation back into the
# forward pass: on CPU, remat changes nothing. Compiling with these options keeps the barriers,
# as the TPU and GPU compilers do, so a CPU compile shows the accelerator's saving.
CPU_COMPILER_OPTIONS = {"xla_disable_hlo_passes": "cse_barrier_expander"}


def check_policy(name: Any) -> str:
    """``name`` if it is one of :data:`POLICIES`, else a :class:`ConfigError` listing them."""
    if not isinstance(name, str) or name not in POLICIES:
        raise ConfigError(f"unknown model.remat_policy {name!r}; valid: {list(POLICIES)} "
                          "(names in jax.checkpoint_policies)")
    return name


def checkpointed(fn: Callable[..., Any], policy: str | None) -> Callable[..., Any]:
    """``fn(*modules_and_arrays)`` rematerialised under ``jax.checkpoint_policies.<policy>``
    (``nnx.remat``), or ``fn`` itself when ``policy`` is ``None`` (remat off).

    ``fn`` takes the block's modules (``nnx.Module`` s, whose state updates such as BatchNorm
    statistics propagate out) and array pytrees (``None`` allowed); Python values it needs
    (``train``) must be closed over, not passed.
    """
    if policy is None:
        return fn
    return nnx.remat(fn, policy=getattr(jax.checkpoint_policies, check_policy(policy)))
