"""Where the train state lives on the mesh: replicated, or fully sharded (FSDP).

The ``sharding`` block of a config::

    params     "replicated" (default): every device holds the whole state;
               "fsdp": parameters, optimiser state, BatchNorm statistics and the method's state
               (MoCo's key encoder and queue) are split over ``fsdp_axis``, each leaf along
               its largest dimension that divides by the axis size
    fsdp_axis  the mesh axis the state is split over (default "data": ZeRO-3 / FSDP over the
               data-parallel devices); a scanned tower's stacked leaves (a leading layer
               axis, models/scanned_layers.py) are split as each block's leaf would be, on
               a dimension after the layer axis, never on it
    min_size   leaves with fewer elements stay replicated (default 2**14: splitting a bias of
               768 numbers over 256 devices only adds collectives)
    rules      ((regex, "replicated" | "fsdp" | partition spec), ...): exceptions, tried in
               order before the default; a regex matches (``re.search``) the leaf's path,
               e.g. ``"params/sample_encoder/blocks/fc1/kernel"`` (scanned; unrolled:
               ``".../blocks/0/fc1/kernel"``) or
               ``"opt_state/0/mu/log_scale"``; a partition spec is a tuple with one mesh axis
               name (or None) per dimension

Under FSDP the step is the same jitted function with the state's shardings as its input and
output shardings: XLA's SPMD partitioner all-gathers each parameter where the encoders use it
and reduce-scatters its gradient, so the optimiser updates each device's slice only. The
arithmetic is that of the replicated step (only the order of the gradient's additions can
differ): tests/test_state_sharding.py requires equal parameters after three steps in float64,
to 1e-12. Per device the state takes ``1 / axis size`` of its replicated bytes, plus the
leaves left replicated. Orbax saves each device's slice and restores onto any mesh and any
sharding (8 -> 4 devices, FSDP <-> replicated), since the restore target's shardings are the
new run's (:func:`contrastive_jax.training.run.checkpoints.restore_latest`).

References:
  Rajbhandari et al., ZeRO (2020) and Zhao et al., PyTorch FSDP (2023); docs/references.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax.errors import ConfigError
from contrastive_jax.mesh import DATA_AXIS
from contrastive_jax.training.models.scanned_layers import is_stacked
from contrastive_jax.training.parameter_paths import path_name

MODES = ("replicated", "fsdp")
DEFAULTS = {"params": "replicated", "fsdp_axis": DATA_AXIS, "min_size": 2**14, "rules": ()}


def default_sharding_config() -> dict[str, Any]:
    """The ``sharding`` block's defaults (replicated state)."""
    return dict(DEFAULTS)


def settings(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``sharding`` block with defaults filled in; unknown keys or modes are a
    :class:`ConfigError` naming what is valid."""
    values = dict(DEFAULTS)
    given = dict(config or {})
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"sharding: unknown settings {unknown}; valid: {sorted(DEFAULTS)}")
    values.update(given)
    if values["params"] not in MODES:
        raise ConfigError(f"sharding.params must be one of {list(MODES)}; "
                          f"got {values['params']!r}")
    if not isinstance(values["min_size"], int) or values["min_size"] < 0:
        raise ConfigError(f"sharding.min_size must be an int >= 0; got {values['min_size']!r}")
    rules = []
    for rule in values["rules"] or ():
        if not (isinstance(rule, Sequence) and len(rule) == 2 and isinstance(rule[0], str)):
            raise ConfigError(f"sharding.rules: each rule is (regex, 'replicated' | 'fsdp' | "
                              f"partition spec tuple); got {rule!r}")
        try:
            pattern = re.compile(rule[0])
        except re.error as err:
            raise ConfigError(f"sharding.rules: bad regex {rule[0]!r}: {err}") from None
        target = rule[1]
        if not (target in MODES or (isinstance(target, Sequence) and not isinstance(target, str))):
            raise ConfigError(f"sharding.rules: the target of {rule[0]!r} must be one of "
                              f"{list(MODES)} or a partition spec tuple; got {target!r}")
        rules.append((pattern, target if isinstance(target, str) else tuple(target)))
    values["rules"] = tuple(rules)
    return values


def fsdp_spec(shape: Sequence[int], axis: str, axis_size: int, min_size: int) -> P:
    """The FSDP partition spec of one leaf: ``axis`` on its largest dimension divisible by
    ``axis_size`` (the first of equal ones), or replicated (``P()``) for leaves with fewer
    than ``min_size`` elements, scalars, and leaves with no such dimension."""
    if len(shape) == 0 or int(np.prod(shape)) < max(min_size, 1) or axis_size == 1:
        return P()
    for dim in sorted(range(len(shape)), key=lambda d: -shape[d]):
        if shape[dim] % axis_size == 0:
            spec = [None] * len(shape)
            spec[dim] = axis
            return P(*spec)
    return P()


def leaf_spec(name: str, shape: Sequence[int], mesh: Mesh, values: Mapping[str, Any]) -> P:
    """The partition spec of the leaf at path ``name``: the first matching rule, else the
    mode's default."""
    axis = values["fsdp_axis"]
    mode = values["params"]
    for pattern, target in values["rules"]:
        if pattern.search(name):
            mode = target
            break
    if mode == "replicated":
        return P()
    if mode == "fsdp":
        if is_stacked(name) and len(shape) > 1:  # one block's leaf, the layer axis kept whole
            return P(None, *fsdp_spec(shape[1:], axis, mesh.shape[axis], values["min_size"]))
        return fsdp_spec(shape, axis, mesh.shape[axis], values["min_size"])
    if len(mode) != len(shape):
        raise ConfigError(f"sharding.rules: the spec {mode} for {name} has {len(mode)} entries "
                          f"but the leaf has shape {tuple(shape)}; give one per dimension")
    for dim, entry in enumerate(mode):
        if entry is not None and shape[dim] % mesh.shape[entry]:
            raise ConfigError(f"sharding.rules: {name} dimension {dim} ({shape[dim]}) does not "
                              f"divide by mesh axis {entry!r} ({mesh.shape[entry]})")
    return P(*mode)


def state_shardings(sharding_config: Mapping[str, Any] | None, mesh: Mesh, tree):
    """A :class:`NamedSharding` on ``mesh`` for every leaf of ``tree`` (a train state, or any
    pytree of arrays or shape-dtype structs), from the ``sharding`` block."""
    values = settings(sharding_config)
    if values["params"] == "fsdp" or values["rules"]:
        if values["fsdp_axis"] not in mesh.shape:
            raise ConfigError(f"sharding.fsdp_axis {values['fsdp_axis']!r} is not an axis of "
                              f"the mesh {dict(mesh.shape)}")
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: NamedSharding(mesh, leaf_spec(path_name(path), _shape(leaf), mesh,
                                                          values)), tree)


def _shape(leaf) -> tuple[int, ...]:
    """The shape of an array, a ``jax.ShapeDtypeStruct`` or a Python scalar."""
    return tuple(leaf.shape) if hasattr(leaf, "shape") else np.shape(leaf)


def bytes_per_device(tree, shardings) -> int:
    """The bytes one device holds of ``tree`` (arrays or shape-dtype structs) under
    ``shardings``: the sum of each leaf's shard size (the largest shard, where uneven)."""
    total = 0
    for leaf, sharding in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings), strict=True):
        shape = sharding.shard_shape(_shape(leaf))
        total += int(np.prod(shape)) * np.dtype(leaf.dtype).itemsize
    return total
