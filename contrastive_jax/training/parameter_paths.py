"""Parameter trees by path: the ``a/0/b`` name of every leaf, and back to a nested tree.

One spelling of a leaf's place serves every room that flattens or rebuilds a tree (the
sharding rules, checkpoints and their checksums, ``model.init_from``, the converters and
exporters): dictionary keys, sequence indices and dataclass fields joined by ``/``, with the
``value`` that holds an NNX variable's array dropped (whether it is an attribute of the train
state or a key of a restored tree, with ``drop_value``).

    >>> leaves_by_path({"a": {0: {"b": 1}, 1: {"b": 2}}, "c": 3})
    {'a/0/b': 1, 'a/1/b': 2, 'c': 3}
    >>> nested({"a/0/b": 1, "a/1/b": 2, "c": 3})
    {'a': {0: {'b': 1}, 1: {'b': 2}}, 'c': 3}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax


def path_name(path, *, drop_value: bool = False) -> str:
    """A pytree path as ``a/b/0/c`` (dict keys, sequence indices, dataclass fields; the
    ``.value`` attribute of an NNX variable dropped, and with ``drop_value`` also a trailing
    ``value`` key, as a restored NNX state has it)."""
    if path and isinstance(path[-1], jax.tree_util.GetAttrKey) and path[-1].name == "value":
        path = path[:-1]
    parts = []
    for entry in path:
        for attr in ("key", "name", "idx"):
            if hasattr(entry, attr):
                parts.append(str(getattr(entry, attr)))
                break
        else:
            parts.append(str(entry))
    name = "/".join(parts)
    if drop_value and name.endswith("/value"):
        name = name[: -len("/value")]
    return name


def path_keys(path) -> tuple:
    """The dict keys and sequence indices of a pytree path, as they are (``("blocks", 0,
    "kernel")``; attributes, such as the ``.value`` of an NNX variable, left out): what the
    optimiser's masks match on."""
    names = []
    for entry in path:
        if isinstance(entry, jax.tree_util.DictKey):
            names.append(entry.key)
        elif isinstance(entry, jax.tree_util.SequenceKey):
            names.append(entry.idx)
    return tuple(names)


def leaves_by_path(tree: Any, *, drop_value: bool = False) -> dict[str, Any]:
    """``{path_name: leaf}`` of every leaf of ``tree`` (any pytree: a nested dict of
    ``nnx.to_pure_dict``, an ``nnx.State``, a restored checkpoint), in JAX's leaf order."""
    return {path_name(path, drop_value=drop_value): leaf
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def nested(flat: Mapping[str, Any]) -> dict:
    """``{"a/0/b": leaf}`` -> ``{"a": {0: {"b": leaf}}}``: the nested pure dict of
    ``nnx.to_pure_dict`` (digit parts as int indices)."""
    out: dict = {}
    for path, leaf in flat.items():
        node = out
        *parents, last = (int(k) if k.isdigit() else k for k in path.split("/"))
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = leaf
    return out
