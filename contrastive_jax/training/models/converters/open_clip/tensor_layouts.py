"""open_clip state dicts to this project's parameters and back, through the table of
:mod:`.tensor_rules`: :func:`params_from_state_dict` (for the importers) and
:func:`state_dict_from_params` (for :mod:`.clip_export`); :func:`in_model_layout` puts the
rules' one entry per Transformer block into the model's layout (scanned towers stacked).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models import architecture_block
from contrastive_jax.training.models.converters.open_clip.tensor_rules import (
    custom_text,
    describe_sizes,
    resolved,
    rules,
)
from contrastive_jax.training.models.scanned_layers import to_layout, unrolled
from contrastive_jax.training.parameter_paths import leaves_by_path, nested

# entries of some state dicts that are not parameters (OpenAI's TorchScript archives, a causal
# mask saved as a buffer): skipped on import
IGNORED = ("input_resolution", "context_length", "vocab_size", "attn_mask")


def _normalised_names(tensors: Mapping[str, Any], prefix: str) -> dict[str, np.ndarray]:
    """Names as the rules spell them: the text tower under ``prefix`` whether or not the
    reader removed ``text.`` (:func:`.state_dict_files.load_state_dict` does), wrapper
    prefixes (``module.``, ``_orig_mod.``) removed; ``logit_scale`` / ``logit_bias`` of shape
    ``(1,)`` (open_clip's ``nonscalar_logit_scale``) as scalars."""
    out = {}
    for name, value in tensors.items():
        for wrapper in ("module.", "_orig_mod."):
            name = name.removeprefix(wrapper)
        if name in IGNORED:
            continue
        if name.startswith("text."):
            name = name.removeprefix("text.")
        if prefix and not name.startswith("visual.") and name not in ("logit_scale",
                                                                      "logit_bias"):
            name = prefix + name
        value = np.asarray(value)
        if name in ("logit_scale", "logit_bias") and value.shape == (1,):
            value = value.reshape(())
        out[name] = value
    return out


def params_from_state_dict(model_block: Mapping[str, Any],
                           tensors: Mapping[str, Any]) -> dict:
    """The parameters of the model ``model_block`` builds, from an open_clip state dict
    ``tensors`` (``{name: array}``, with or without the ``text.`` prefix of a
    ``CustomTextCLIP``): the nested pure dict of the model's ``nnx.Param`` state
    (``nnx.to_pure_dict``; list indices as ints), float32 NumPy arrays.

    Each tensor is mapped by :func:`rules`. A tensor the rules need that is missing, one with
    another shape, or one no rule takes is a :class:`ConfigError` naming it (a tensor read
    as the identity, ``visual.proj`` under ``sample_projection="none"``, must be one). The
    result is checked against the model's own parameter shapes (built abstractly).
    """
    model = resolved(model_block)
    prefix = "text." if custom_text(model) else ""
    named = _normalised_names(tensors, prefix)
    params: dict = {}
    used = set()
    for rule in rules(model):
        if rule.source not in named:
            raise ConfigError(f"the checkpoint has no tensor {rule.source!r}, which the model "
                              f"block needs ({describe_sizes(model)})")
        value = named[rule.source]
        if value.shape != rule.shape:
            raise ConfigError(f"tensor {rule.source!r} has shape {value.shape}; the model "
                              f"block ({describe_sizes(model)}) needs {rule.shape}")
        value = np.asarray(value, np.float32)
        if not rule.targets and not np.array_equal(value, rule.join([])):
            raise ConfigError(f"tensor {rule.source!r} is not the identity, which "
                              "model.sample_projection = 'none' reads it as; use 'linear'")
        for (path, shape), part in zip(rule.targets, rule.split(value), strict=True):
            node = params
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = np.array(part, np.float32, order="C").reshape(shape)
        used.add(rule.source)
    unused = [name for name in named if name not in used]
    if unused:
        raise ConfigError(f"tensor {unused[0]!r} of the checkpoint has no place in the model "
                          f"block ({describe_sizes(model)}; {len(unused)} unused: {unused[:5]})")
    return in_model_layout(model_block, params)


def state_dict_from_params(model_block: Mapping[str, Any],
                           params: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """What open_clip's ``model.state_dict()`` holds for the model ``model_block`` builds
    with ``params`` (a nested mapping of its parameters, as :func:`params_from_state_dict`
    gives or ``nnx.to_pure_dict``; list indices as ints or strings): ``{name: float32
    array}``, every key, in open_clip's shapes (a timm trunk without projection has no
    ``visual.head`` key; a ``CustomTextCLIP`` has its text tower under ``text.``).

    A parameter the rules need that is missing, one with another shape, or one no rule reads
    (e.g. an output layer) is a :class:`ConfigError` naming it.
    """
    model = resolved(model_block)
    leaves = unrolled(leaves_by_path(params))  # the rules name each block's own tensors
    used = set()
    out = {}
    for rule in rules(model):
        parts = []
        for path, shape in rule.targets:
            name = "/".join(map(str, path))
            if name not in leaves:
                raise ConfigError(f"the parameters have no {name!r}, which the model block "
                                  f"needs for open_clip's {rule.source!r}")
            value = np.asarray(leaves[name], np.float32)
            if value.shape != shape:
                raise ConfigError(f"parameter {name!r} has shape {value.shape}; the model "
                                  f"block ({describe_sizes(model)}) needs {shape}")
            parts.append(value)
            used.add(name)
        tensor = np.array(rule.join(parts), np.float32, order="C")
        assert tensor.shape == rule.shape, (rule.source, tensor.shape, rule.shape)
        out[rule.source] = tensor
    unused = sorted(set(leaves) - used)
    if unused:
        raise ConfigError(f"parameter {unused[0]!r} has no open_clip counterpart in the model "
                          f"block ({describe_sizes(model)}; {len(unused)} unused: {unused[:5]})")
    return out


def model_leaves(model_block: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """``{"a/0/b": shape}`` of the parameters of the model ``model_block`` builds (abstractly,
    nothing is initialised), in its layout of the Transformer blocks (scanned by default)."""
    block = {k: v for k, v in architecture_block(model_block).items() if k != "attention"}
    return dict(_leaves_of(json.dumps(block, sort_keys=True)))


@functools.lru_cache(maxsize=16)
def _leaves_of(block_json: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """:func:`model_leaves` of one block (its JSON), kept: an import or export asks for the
    same model's several times, and even an abstract build traces every initialiser."""
    from flax import nnx

    from contrastive_jax.training.models import build_model

    block = json.loads(block_json)
    model = nnx.eval_shape(lambda: build_model(block, nnx.Rngs(0)))  # (any kernel: the shapes)
    return tuple((k, tuple(v.shape)) for k, v in
                 leaves_by_path(nnx.to_pure_dict(nnx.state(model, nnx.Param))).items())


def in_model_layout(model_block: Mapping[str, Any], params: Mapping[str, Any]) -> dict:
    """``params`` (a nested mapping; the rules write one entry per Transformer block) in the
    layout of the model ``model_block`` builds (its scanned towers' blocks stacked,
    :func:`~contrastive_jax.training.models.scanned_layers.to_layout`), checked to have
    exactly that model's structure and shapes (a difference is a bug of the rules)."""

    want = model_leaves(model_block)
    flat = to_layout(leaves_by_path(params), want)
    got = {k: tuple(np.shape(v)) for k, v in flat.items()}
    if want != got:
        diff = sorted(set(want.items()) ^ set(got.items()))
        raise AssertionError(f"converted parameters do not match the model: {diff[:4]}")
    return nested(flat)
