"""Locked towers: ``config.model.frozen`` names top-level parts of a dual encoder kept fixed.

Locked-image tuning ([LiT], docs/references.md) trains a text tower against a pretrained,
*locked* image tower. ``config.model.frozen`` is ``""`` (default: everything trains), one name
or a tuple of names of the dual encoder's top-level parameters: ``"sample_encoder"``,
``"text_encoder"``, ``"sample_proj"``, ``"text_proj"``, ``"log_scale"``, ``"bias"`` (SigLIP).
A frozen part

- never changes: the train step differentiates only the trainable parameters (the frozen ones
  enter the loss as constants, so no backward pass is built through a frozen tower) and puts
  the frozen leaves back unchanged after the update (bit-identical, a ``-0.0`` included);
- has no optimiser state and no weight decay (:func:`~contrastive_jax.training.step.optimizers.
  build_optimizer` labels it ``"frozen"``: ``optax.set_to_zero`` inside ``multi_transform``,
  which stores no array for it);
- runs in inference mode when it is a tower (``sample_encoder``, ``text_encoder``): BatchNorm
  normalises with its running averages, which stay as loaded, and dropout is off. A locked
  tower is then one fixed function of its input, as in LiT, whatever the batch.

The functions here split the model's ``nnx.Param`` state (an ``nnx.State``) by its top-level
keys and put it back together with the same tree structure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from contrastive_jax.errors import ConfigError

TOWERS = ("sample_encoder", "text_encoder")  # run in inference mode when frozen


def frozen_names(model_config: Mapping[str, Any]) -> tuple[str, ...]:
    """``model.frozen`` as a tuple of names (``""`` or absent: ``()``); a :class:`ConfigError`
    for a value that is not a name or a sequence of names, or for a model that is not a
    dual encoder."""
    value = model_config.get("frozen", "")
    if value in ("", None) or (isinstance(value, Sequence) and not isinstance(value, str)
                               and len(value) == 0):
        return ()
    names = (value,) if isinstance(value, str) else value
    if not (isinstance(names, Sequence) and all(isinstance(n, str) and n for n in names)):
        raise ConfigError(f"model.frozen must be a name or a tuple of names of the model's "
                          f"top-level parameters (e.g. 'sample_encoder'); got {value!r}")
    if model_config.get("name") != "dual_encoder":
        raise ConfigError(f"model.frozen applies to dual encoders (locked-tower tuning); model "
                          f"{model_config.get('name')!r} has no towers to lock: remove "
                          "model.frozen (a frozen SimCLR encoder is what the linear probe "
                          "evaluates)")
    return tuple(dict.fromkeys(names))


def check_frozen(names: Sequence[str], params: nnx.State) -> None:
    """Every name is a top-level entry of ``params`` and something is left to train; a
    :class:`ConfigError` naming the valid entries otherwise."""
    valid = sorted(params.raw_mapping)
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise ConfigError(f"model.frozen names {unknown}, which the model does not have; its "
                          f"top-level parameters are {valid}")
    if names and set(valid) <= set(names):
        raise ConfigError(f"model.frozen = {tuple(names)} freezes every parameter: nothing "
                          "would train; leave at least one part out of model.frozen")


def split_frozen(params: nnx.State, names: Sequence[str]) -> tuple[nnx.State, nnx.State]:
    """``(trainable, frozen)``: the top-level entries of ``params`` not in ``names``, and those
    in it (``params`` itself and an empty state when ``names`` is empty)."""
    if not names:
        return params, nnx.State({})
    raw = params.raw_mapping
    return (nnx.State({k: v for k, v in raw.items() if k not in names}),
            nnx.State({k: v for k, v in raw.items() if k in names}))


def merge_frozen(trainable: nnx.State, frozen: nnx.State) -> nnx.State:
    """The inverse of :func:`split_frozen`: one state with the tree structure of the original
    (top-level keys sorted, as ``nnx.split`` makes them)."""
    if not frozen.raw_mapping:
        return trainable
    raw = {**trainable.raw_mapping, **frozen.raw_mapping}
    return nnx.State({k: raw[k] for k in sorted(raw)})


def with_zero_gradients(grads: nnx.State, frozen: nnx.State) -> nnx.State:
    """Gradients of the trainable parameters completed with zeros for the frozen ones (the
    optimiser takes a tree shaped like all parameters and ignores these)."""
    if not frozen.raw_mapping:
        return grads
    return merge_frozen(grads, jax.tree.map(jnp.zeros_like, frozen))


def keep_frozen(updated: nnx.State, before: nnx.State, names: Sequence[str]) -> nnx.State:
    """``updated`` with the frozen entries taken from ``before`` (the very same arrays)."""
    if not names:
        return updated
    return merge_frozen(split_frozen(updated, names)[0], split_frozen(before, names)[1])


def trains(tower: str, names: Sequence[str]) -> bool:
    """Whether ``tower`` (``"sample_encoder"`` or ``"text_encoder"``) runs in training mode:
    a frozen tower runs in inference mode (BatchNorm running averages, no dropout)."""
    return tower not in names
