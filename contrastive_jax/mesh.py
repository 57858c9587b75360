"""The device mesh: its axes, batch divisibility, and global arrays from per-process rows.

Shared by the losses (:mod:`contrastive_jax.losses.sharded` splits rows over ``DATA_AXIS``),
the input pipeline and the trainer. Depends on JAX only.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax.errors import ConfigError

DATA_AXIS = "data"



def make_mesh(axes: Mapping[str, int] | None = None, devices=None) -> Mesh:
    """A mesh over ``devices`` (default: all) with named axes, e.g. ``{"data": -1}``.

    One size may be ``-1`` (all remaining devices). The default is a single ``data`` axis over
    every device. Sizes that do not multiply to the device count are a ``ValueError``.
    """
    axes = dict(axes or {DATA_AXIS: -1})
    devices = np.asarray(jax.devices() if devices is None else devices)
    total = devices.size
    unknown = [k for k, v in axes.items() if v == -1]
    if len(unknown) > 1:
        raise ConfigError(f"mesh axes {axes}: at most one size may be -1")
    known = int(np.prod([v for v in axes.values() if v != -1]))
    if any(v == 0 or v < -1 for v in axes.values()) or total % known:
        raise ConfigError(f"mesh axes {axes} do not divide the {total} devices")
    if unknown:
        axes[unknown[0]] = total // known
    if int(np.prod(list(axes.values()))) != total:
        raise ConfigError(f"mesh axes {axes} use {int(np.prod(list(axes.values())))} devices, "
                         f"but there are {total}; make the sizes multiply to {total}")
    return Mesh(devices.reshape(tuple(axes.values())), tuple(axes))


def check_divisible(global_batch: int, num_devices: int, what: str = "devices") -> int:
    """``global_batch / num_devices`` rows per device; a ``ValueError`` naming both otherwise."""
    if global_batch % num_devices:
        raise ConfigError(
            f"global batch {global_batch} does not divide by the {num_devices} {what} of the "
            f"'{DATA_AXIS}' axis; use a batch that is a multiple of {num_devices}")
    return global_batch // num_devices


def global_batch(local, mesh: Mesh, axis: str = DATA_AXIS):
    """This process's rows (a pytree of (n_local, ...) arrays) as global arrays on ``mesh``.

    The global batch is ``n_local * process_count`` rows, split over ``axis`` (rows of process
    ``p`` land on its own devices). It must divide by the devices of ``axis``; otherwise a
    ``ValueError`` names both numbers.
    """
    sharding = NamedSharding(mesh, P(axis))

    def one(x):
        x = np.asarray(x)
        rows = x.shape[0] * jax.process_count()
        check_divisible(rows, mesh.shape[axis])
        return jax.make_array_from_process_local_data(sharding, x, (rows, *x.shape[1:]))

    return jax.tree.map(one, local)
