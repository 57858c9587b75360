"""Starting from pretrained parameters: ``config.model.init_from``.

``config.model.init_from`` is ``""`` (default: a fresh initialisation), one mapping or a tuple
of mappings, each::

    path    a converted checkpoint directory, or a workdir of this trainer
    source  the subtree of the checkpoint's parameters to read, "a/b" ("": all of them)
    target  the subtree of this model's parameters to fill ("": all of them)

e.g. ``{"path": "runs/simclr", "source": "encoder", "target": "sample_encoder"}`` (SimCLR's
encoder as a dual encoder's sample tower) or ``{"path": "clip_b16"}`` (a whole converted CLIP).
``path`` is any pretrained source
(:mod:`~contrastive_jax.training.models.converters.pretrained_source`: a converted directory,
a trainer workdir, an open_clip model, a big_vision ``.npz``), read by its one reader; the run
reads each source's description once when it starts
(:func:`~contrastive_jax.training.run_spec.resolve`) and its weights here. A **trainer
workdir** gives its latest usable checkpoint's ``state.params`` and, for the same subtree,
``state.rest`` (BatchNorm running statistics); a newer checkpoint that cannot be read or
holds non-finite numbers is skipped with a warning, as a resume falls back (the other run's
files are left as they are); none usable is a :class:`ConfigError` naming each.

The source subtree must hold exactly the target's leaves: the same relative paths and shapes,
after the Transformer blocks of either layout (scanned, unrolled: ``model.<tower>.scan``) are
put into the target's (:func:`~contrastive_jax.training.models.scanned_layers.to_layout`);
values are cast to the parameter's dtype only where that is exact (``np.can_cast(..., "safe")``:
float32 into a float64 test model, never float64 into float32). Where both subtrees are blocks
of the model configs (``"encoder"`` and ``"sample_encoder"``, or the whole model), the blocks
must be equal too (e.g. a SimCLR encoder's ``pool = "mean"``: the same shapes with another
pooling would be another function). Anything else is a :class:`ConfigError` naming the first
missing, extra or mismatching leaf or setting. A target's BatchNorm statistics come from a
workdir's ``state.rest``; a converted directory holds none, so a target with BatchNorm is an
error there.

The trainer applies ``init_from`` once, when a run starts fresh (no checkpoint in its
workdir); a resumed run restores its own checkpoint and reads nothing from ``path``
(:func:`contrastive_jax.training.train.train_and_evaluate`). Files are read with orbax
through :class:`etils.epath.Path`, so ``gs://`` paths work.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models import (
    TRAINING_SETTINGS,
    upgraded_model_block,
    with_defaults,
)
from contrastive_jax.training.models.converters.pretrained_source import (
    PretrainedSource,
    read_source,
    with_weights,
)
from contrastive_jax.training.models.position_resampling import position_movers, resizable
from contrastive_jax.training.models.scanned_layers import to_layout
from contrastive_jax.training.parameter_paths import leaves_by_path, path_name

FIELDS = ("path", "source", "target")
# model settings that do not change the function (compute dtype, rematerialisation), are
# about training, or are initial values that the loaded parameters replace (the logit scale
# and bias); left out when two model blocks are compared
NOT_ARCHITECTURE = ("dtype", "remat", "remat_policy", "attention", *TRAINING_SETTINGS,
                    "init_temperature", "init_bias")
# a tower's settings of how its blocks are laid out and run, not what they compute, and
# patch dropout (training only: the same parameters and the same evaluation function)
NOT_ARCHITECTURE_OF_A_TOWER = ("scan", "patch_dropout")


@dataclasses.dataclass(frozen=True)
class InitFrom:
    """One entry of ``model.init_from`` (see the module docstring)."""

    path: str
    source: str = ""
    target: str = ""


def init_specs(value: Any) -> tuple[InitFrom, ...]:
    """``model.init_from`` as checked :class:`InitFrom` entries (``""`` / absent: none)."""
    if value in ("", None) or (isinstance(value, Sequence) and not isinstance(value, str)
                               and len(value) == 0):
        return ()
    def plain(v):  # a ConfigDict is not a Mapping
        return v.to_dict() if hasattr(v, "to_dict") else v

    value = plain(value)
    entries = (value,) if isinstance(value, Mapping) else value
    if isinstance(entries, str) or not isinstance(entries, Sequence):
        raise ConfigError(f"model.init_from must be a mapping {{'path': ..., 'source': ..., "
                          f"'target': ...}} or a tuple of them; got {value!r}")
    specs = []
    for entry in map(plain, entries):
        if not isinstance(entry, Mapping):
            raise ConfigError(f"model.init_from: each entry is a mapping with keys {list(FIELDS)}"
                              f"; got {entry!r}")
        unknown = sorted(set(entry) - set(FIELDS))
        if unknown:
            raise ConfigError(f"model.init_from: unknown keys {unknown}; valid: {list(FIELDS)}")
        if not isinstance(entry.get("path"), str | os.PathLike) or not str(entry.get("path")):
            raise ConfigError(f"model.init_from needs a 'path' (a converted checkpoint directory "
                              f"or a trainer workdir); got {dict(entry)!r}")
        for key in ("source", "target"):
            if not isinstance(entry.get(key, ""), str):
                raise ConfigError(f"model.init_from {key!r} is a subtree path such as "
                                  f"'encoder' or 'a/b' ('' for all); got {entry[key]!r}")
        specs.append(InitFrom(str(entry["path"]), entry.get("source", "").strip("/"),
                              entry.get("target", "").strip("/")))
    return tuple(specs)


def _leaves(tree) -> dict[str, np.ndarray]:
    """``{"a/0/b": host array}`` of a nested tree (:func:`.parameter_paths.leaves_by_path`)."""
    return {k: np.asarray(v) for k, v in leaves_by_path(tree).items()}


def _origin(source: PretrainedSource) -> str:
    """How the messages name a source whose weights were read."""
    if source.kind == "workdir":
        return f"the workdir checkpoint {source.location} (step {source.step})"
    if source.kind == "converted":
        return f"the converted checkpoint {source.location}"
    return f"the converted checkpoint {source.description}"


def _under(leaves: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The leaves under ``prefix`` by their path relative to it (all of them for ``""``)."""
    if not prefix:
        return dict(leaves)
    return {k[len(prefix) + 1:]: v for k, v in leaves.items() if k.startswith(prefix + "/")}


def _block(model: Mapping[str, Any], subtree: str):
    """The model config block of ``subtree`` (the whole model for ``""``), or ``None`` when
    the subtree is not a block (a projection, the logit scale)."""
    block = model
    for part in filter(None, subtree.split("/")):
        block = block.get(part) if isinstance(block, Mapping) else None
    if not isinstance(block, Mapping):
        return None
    if not subtree:  # the whole model: in today's names
        block = upgraded_model_block(_plain(block))
    block = with_defaults(_plain(block))  # a default left out equals one written out
    return {k: ({t: u for t, u in v.items() if t not in NOT_ARCHITECTURE_OF_A_TOWER}
                if isinstance(v, Mapping) else v)
            for k, v in block.items()
            if k not in NOT_ARCHITECTURE and k not in NOT_ARCHITECTURE_OF_A_TOWER}


def _plain(value):
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _dotted(block: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"text_encoder.width": 64, ...}``: a nested block's settings by dotted name."""
    out = {}
    for key, value in block.items():
        if isinstance(value, Mapping) and value:
            out.update(_dotted(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _check_blocks(spec: InitFrom, source_model: Mapping, target_model: Mapping,
                  where: str) -> None:
    source, target = _block(source_model, spec.source), _block(target_model, spec.target)
    if source is None or target is None:
        return
    source, target = _dotted(source), _dotted(target)
    for key in sorted(source.keys() | target.keys()):
        if resizable(key, target):  # the positions are resampled / truncated (_mapped)
            continue
        if source.get(key, "<absent>") != target.get(key, "<absent>"):
            raise ConfigError(
                f"model.init_from {spec.path}: the checkpoint's model block "
                f"{spec.source or 'model'!r} and this config's {spec.target or 'model'!r} "
                f"differ at {key!r}: {source.get(key, '<absent>')!r} in {where} vs "
                f"{target.get(key, '<absent>')!r} here; make the config's block equal to the "
                "checkpoint's")


def _mapped(spec: InitFrom, source: Mapping[str, np.ndarray], target: Mapping[str, Any],
            what: str, origin: str, movers: Mapping[str, Any] | None = None,
            notes: list[str] | None = None) -> dict[str, np.ndarray]:
    """``{target path: value}`` for every target leaf under ``spec.target``, from the source
    leaves under ``spec.source``: exactly the same relative paths and shapes, except the
    position tables in ``movers`` (``position_resampling.position_movers``), moved to the
    target's shape (a line each in ``notes``)."""
    want, have = _under(target, spec.target), _under(source, spec.source)
    have = to_layout(have, want)  # scanned <-> unrolled Transformer blocks (model.<tower>.scan)
    out = {}
    for name in sorted(want):
        full = f"{spec.target}/{name}" if spec.target else name
        if name not in have:
            raise ConfigError(
                f"model.init_from {spec.path}: the {what} {full!r} of this model has no "
                f"counterpart {spec.source + '/' + name if spec.source else name!r} in "
                f"{origin}; check source/target (the checkpoint's top-level entries: "
                f"{sorted({k.split('/')[0] for k in source})[:12]})")
        value, leaf = have[name], want[name]
        if tuple(value.shape) != tuple(leaf.shape) and full in (movers or {}) and \
                value.ndim == 3 and value.shape[2] == leaf.shape[2]:
            moved = movers[full](np.asarray(value), tuple(leaf.shape))
            if notes is not None:
                notes.append(f"model.init_from {spec.path}: {full} moved from "
                             f"{value.shape[1]} to {leaf.shape[1]} positions")
            value = moved
        if tuple(value.shape) != tuple(leaf.shape):
            raise ConfigError(
                f"model.init_from {spec.path}: the {what} {full!r} has shape "
                f"{tuple(leaf.shape)} here but {tuple(value.shape)} in {origin}; the "
                "architectures differ")
        if not np.can_cast(value.dtype, leaf.dtype, "safe"):
            raise ConfigError(
                f"model.init_from {spec.path}: the {what} {full!r} is {value.dtype} in "
                f"{origin}, which {leaf.dtype} cannot hold exactly")
        out[full] = value.astype(leaf.dtype)
    extra = sorted(set(have) - set(want))
    if extra:
        raise ConfigError(
            f"model.init_from {spec.path}: {origin} holds the {what} "
            f"{spec.source + '/' + extra[0] if spec.source else extra[0]!r} (and "
            f"{len(extra) - 1} more), which this model's {spec.target or 'model'!r} lacks; "
            "the architectures differ")
    return out


def _replace(state: nnx.State, values: Mapping[str, np.ndarray]) -> nnx.State:
    """``state`` with the leaves named in ``values`` replaced."""
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: values.get(path_name(path), leaf), state)


def load_into(params: nnx.State, rest: nnx.State, model_config: Mapping[str, Any],
              init_from: Any, sources: Sequence[PretrainedSource] | None = None
              ) -> tuple[nnx.State, nnx.State, list[str]]:
    """``(params, rest, messages)``: the model's parameters and other state with the subtrees
    ``init_from`` names replaced by the stored values (host arrays), and one line per entry
    saying what was loaded from where. ``sources``: each entry's source as the run's resolve
    step read it (:func:`~contrastive_jax.training.run_spec.resolve`; read here otherwise),
    its weights read now."""
    if hasattr(model_config, "to_dict"):  # a ConfigDict is not a Mapping
        model_config = model_config.to_dict()
    specs = init_specs(init_from)
    sources = list(sources) if sources is not None else [None] * len(specs)
    if len(sources) != len(specs):
        raise ValueError(f"{len(specs)} model.init_from entries but {len(sources)} sources")
    params_by_path = _leaves(params)
    rest_by_path = _leaves(rest)
    loaded, loaded_rest, messages = {}, {}, []
    for spec, source in zip(specs, sources, strict=True):
        try:
            stored = with_weights(source or read_source(spec.path))
        except ConfigError as err:
            raise ConfigError(f"model.init_from path {spec.path}: {err}") from None
        origin = _origin(stored)
        _check_blocks(spec, stored.model, model_config, origin)
        if not _under(params_by_path, spec.target):
            raise ConfigError(
                f"model.init_from target {spec.target!r} is not a subtree of this model's "
                f"parameters; its top-level entries: "
                f"{sorted({k.split('/')[0] for k in params_by_path})}")
        notes: list[str] = []
        loaded.update(_mapped(spec, _leaves(stored.params), params_by_path, "parameter", origin,
                              position_movers(model_config), notes))
        messages += notes
        if stored.kind == "workdir" or _under(rest_by_path, spec.target):
            loaded_rest.update(_mapped(spec, _leaves(stored.rest or {}), rest_by_path,
                                       "non-parameter state (BatchNorm statistics)", origin))
        messages += [f"warning: model.init_from {spec.path}: {why}; using an earlier one"
                     for why in stored.skipped]
        messages.append(f"initialised {spec.target or 'the model'} from {origin}"
                        f"{', ' + repr(spec.source) if spec.source else ''}")
    return _replace(params, loaded), _replace(rest, loaded_rest), messages


def initialized_state(state, graphdef, config, method,
                      sources: Sequence[PretrainedSource] | None = None
                      ) -> tuple[Any, list[str]]:
    """A fresh train state with ``config.model.init_from`` applied (host arrays where loaded)
    and the method's state rebuilt from the loaded model (MoCo's key encoder starts as a copy
    of it); ``(state, messages)``. The optimiser state does not depend on parameter values
    (zeros), so it is kept. ``sources``: as :func:`load_into`."""
    if not init_specs(config.model.get("init_from", "")):
        return state, []
    params, rest, messages = load_into(state.params, state.rest, config.model,
                                       config.model.init_from, sources)
    model = nnx.merge(graphdef, params, rest, copy=True)
    extra = method.init_extra(model, params, rest, config)
    return state.replace(params=params, rest=rest, extra=extra), messages
