"""Locked towers: ``config.model.frozen`` names parts of a model kept fixed (a dual encoder's
top-level parts, or a path below the top level in any model).

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

A name with slashes is a path below the top level, ``"encoder/embed"`` (the ViT's patch
projection: MoCo v3's frozen random patch projection, [MoCoV3] §4.2,
:mod:`contrastive_jax.training.methods.moco_v3`), for any model: those parameters keep their
initial (or loaded) values bit for bit and get no gradient, while the tower around them runs in
training mode. (Their optimiser state is the trainable parameters' kind: the step computes an
update for them and discards it.)

The functions here split the model's ``nnx.Param`` state (an ``nnx.State``) by those paths and
put it back together with the same tree structure.
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
    if not (isinstance(names, Sequence) and all(isinstance(n, str) and n for n in names)
            and all(all(_path(n)) for n in names)):
        raise ConfigError(f"model.frozen must be a name or a tuple of names of the model's "
                          f"top-level parameters (e.g. 'sample_encoder') or paths below them "
                          f"(e.g. 'encoder/embed'); got {value!r}")
    towers = [n for n in names if "/" not in n]
    if towers and model_config.get("name") != "dual_encoder":
        raise ConfigError(f"model.frozen = {towers} locks whole towers, which applies to dual "
                          f"encoders (locked-tower tuning); model {model_config.get('name')!r} "
                          "has no towers to lock: remove them from model.frozen (a frozen "
                          "SimCLR encoder is what the linear probe evaluates; a part of a "
                          "tower is named by its path, e.g. 'encoder/embed')")
    return tuple(dict.fromkeys(names))


def _path(name: str) -> tuple[str, ...]:
    """``"encoder/embed"`` -> ``("encoder", "embed")``."""
    return tuple(name.split("/"))


def _split(mapping: Mapping, paths: set[tuple[str, ...]]) -> tuple[dict, dict]:
    """``(rest, under)``: the nested ``mapping`` without and with the entries under ``paths``
    (tuples of keys, compared as strings: ``nnx.List`` keys are ints); empty levels dropped."""
    rest, under = {}, {}
    for key, value in mapping.items():
        below = {p[1:] for p in paths if p[0] == str(key)}
        if () in below:
            under[key] = value
        elif below and isinstance(value, Mapping):
            rest_k, under_k = _split(value, below)
            if rest_k:
                rest[key] = rest_k
            if under_k:
                under[key] = under_k
        else:
            rest[key] = value
    return rest, under


def _merge(a: Mapping, b: Mapping) -> dict:
    """The inverse of :func:`_split`: keys sorted at every level, as ``nnx.split`` makes them."""
    out = {}
    for key in sorted({*a, *b}, key=lambda k: (isinstance(k, str), k)):
        if key in a and key in b:
            out[key] = _merge(a[key], b[key])
        else:
            out[key] = a[key] if key in a else b[key]
    return out


def _has_path(mapping: Mapping, path: tuple[str, ...]) -> bool:
    if not path:
        return True
    for key, value in mapping.items():
        if str(key) == path[0]:
            return len(path) == 1 or (isinstance(value, Mapping) and _has_path(value,
                                                                                path[1:]))
    return False


def check_frozen(names: Sequence[str], params: nnx.State) -> None:
    """Every name is a top-level entry of ``params`` or a path below one, and something is left
    to train; a :class:`ConfigError` naming the valid entries otherwise."""
    valid = sorted(params.raw_mapping)
    unknown = [n for n in names if not _has_path(params.raw_mapping, _path(n))]
    if unknown:
        raise ConfigError(f"model.frozen names {unknown}, which the model does not have; its "
                          f"top-level parameters are {valid} (a path below them: "
                          "'encoder/embed')")
    if names and not split_frozen(params, names)[0].raw_mapping:
        raise ConfigError(f"model.frozen = {tuple(names)} freezes every parameter: nothing "
                          "would train; leave at least one part out of model.frozen")


def split_frozen(params: nnx.State, names: Sequence[str]) -> tuple[nnx.State, nnx.State]:
    """``(trainable, frozen)``: ``params`` without the entries under ``names`` (top-level
    names or paths below them), and those entries (``params`` itself and an empty state when
    ``names`` is empty)."""
    if not names:
        return params, nnx.State({})
    trainable, frozen = _split(params.raw_mapping, {_path(n) for n in names})
    return nnx.State(trainable), nnx.State(frozen)


def merge_frozen(trainable: nnx.State, frozen: nnx.State) -> nnx.State:
    """The inverse of :func:`split_frozen`: one state with the tree structure of the original
    (keys sorted at every level, as ``nnx.split`` makes them)."""
    if not frozen.raw_mapping:
        return trainable
    return nnx.State(_merge(trainable.raw_mapping, frozen.raw_mapping))


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
