"""Multi-process launch: ``jax.distributed.initialize`` when asked, and global batches.

One process per host (a TPU VM worker, a GPU node). Nothing here runs unless asked: a run with
no launch settings is a single process. The settings come from the config (``launch``
fields) or, if absent there, from the environment:

================================  ========================================================
``CONTRASTIVE_JAX_COORDINATOR``   ``host:port`` of process 0 (explicit launch, e.g. GPU nodes)
``CONTRASTIVE_JAX_NUM_PROCESSES`` number of processes
``CONTRASTIVE_JAX_PROCESS_ID``    this process's id, ``0 .. num_processes - 1``
``CONTRASTIVE_JAX_DISTRIBUTED``   ``auto``: the argument-free form (TPU pods, SLURM, ...)
================================  ========================================================

On a TPU pod run the same command on every worker with ``CONTRASTIVE_JAX_DISTRIBUTED=auto``;
on GPU nodes give each process the coordinator, the process count and its id. Each process
checks that every process runs the same config (:func:`check_same_config`), loads its own
``global_batch / process_count`` rows, and
:func:`contrastive_jax.mesh.global_batch` assembles them into one global :class:`jax.Array`
sharded over the mesh's ``data`` axis.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping

import jax
import numpy as np

from contrastive_jax.errors import ConfigError

ENV_PREFIX = "CONTRASTIVE_JAX_"


@dataclasses.dataclass(frozen=True)
class Launch:
    """How this process joins the job. ``mode``: ``"single"``, ``"auto"`` or ``"explicit"``."""

    mode: str = "single"
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    # Bounded waits: a peer that never arrives or dies makes the others fail, not hang. JAX's
    # own defaults (jax.distributed.initialize): hosts of a large slice started one by one over
    # ssh can take minutes to arrive, and a short heartbeat kills a job over a slow host.
    initialization_timeout_s: int = 300
    heartbeat_timeout_s: int = 100


def launch_settings(config: Mapping | None = None,
                    environ: Mapping[str, str] | None = None) -> Launch:
    """The launch from ``config`` (keys as :class:`Launch` fields), else from the environment.

    ``None`` values in ``config`` count as unset (a config file's placeholders).
    """
    environ = os.environ if environ is None else environ
    config = {k: v for k, v in dict(config or {}).items() if v is not None}
    unknown = set(config) - {f.name for f in dataclasses.fields(Launch)}
    if unknown:
        raise ConfigError(f"unknown launch settings {sorted(unknown)}; valid: "
                         f"{[f.name for f in dataclasses.fields(Launch)]}")
    if not config or (config.get("mode") in (None, "single") and not config.get(
            "coordinator_address")):
        env = {k[len(ENV_PREFIX):].lower(): v for k, v in environ.items()
               if k.startswith(ENV_PREFIX)}
        if env.get("distributed") == "auto":
            config = {"mode": "auto", **config}
        elif "coordinator" in env:
            try:
                config = {"mode": "explicit", "coordinator_address": env["coordinator"],
                          "num_processes": int(env["num_processes"]),
                          "process_id": int(env["process_id"]), **config}
            except (KeyError, ValueError) as err:
                raise ConfigError(
                    f"{ENV_PREFIX}COORDINATOR is set, so {ENV_PREFIX}NUM_PROCESSES and "
                    f"{ENV_PREFIX}PROCESS_ID must be integers too ({err})") from None
    if config.get("coordinator_address") and config.get("mode", "single") == "single":
        config["mode"] = "explicit"
    launch = Launch(**config)
    if launch.mode not in ("single", "auto", "explicit"):
        raise ConfigError(f"launch mode {launch.mode!r}: use 'single', 'auto' or 'explicit'")
    if launch.mode == "explicit":
        n, i = launch.num_processes, launch.process_id
        if not launch.coordinator_address or n is None or i is None:
            raise ConfigError("an explicit launch needs coordinator_address, num_processes "
                             "and process_id")
        if n < 1 or not 0 <= i < n:
            raise ConfigError(f"process_id {i} is not in 0..{n - 1} (num_processes {n})")
    return launch


def join_job(launch: Launch) -> bool:
    """Join the job described by ``launch``; ``False`` (and nothing done) for a single process.

    Must run before JAX is used. On CPU the cross-process collectives use gloo.
    """
    if launch.mode == "single":
        return False
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU client only
    kwargs = {"initialization_timeout": launch.initialization_timeout_s,
              "heartbeat_timeout_seconds": launch.heartbeat_timeout_s}
    if launch.mode == "explicit":
        kwargs.update(coordinator_address=launch.coordinator_address,
                      num_processes=launch.num_processes, process_id=launch.process_id)
    jax.distributed.initialize(**kwargs)
    return True


PER_PROCESS = ("launch", "data.data_dir")  # config entries that may differ between processes
def _digest(value) -> int:
    """A 31-bit digest of a JSON value."""
    text = json.dumps(value, sort_keys=True, default=str).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:4], "little") & 0x7FFFFFFF


def _kind(key: str) -> str:
    """What a key of :func:`check_same_config` is: ``"software"``, ``"dataset"`` or
    ``"config"``."""
    if key.startswith("software."):
        return "software"
    return "dataset" if key.startswith("data.") and key.endswith("(prepared)") else "config"


def check_same_config(config, identity: Mapping[str, str] | None = None) -> None:
    """Raise :class:`ConfigError` unless every process of the job runs the same config.

    Processes started with different configs (another batch size on one host) would otherwise
    fail much later inside a collective, with gloo or XLA messages and no hint. Process 0's
    flattened keys are broadcast; each process digests its value of every key (and its own
    extra keys), the digests are all-gathered and compared, and every process raises the same
    error naming the processes and settings that differ (with process 0's value). Entries under
    :data:`PER_PROCESS` may differ. Beside the config, the processes must share the code and
    package versions and the prepared training dataset: ``identity`` (``{"software.<name>":
    ..., "data.<dataset> (prepared)": ...}``, :func:`contrastive_jax.main.run_identity`) is
    compared the same way, so a host with another checkout, uncommitted changes, another jax
    or a differently prepared dataset is named. A no-op for a single process.
    """
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils

    from contrastive_jax.training.run.workdir.config_record import flatten, plain

    flat = {k: v for k, v in flatten(plain(config)).items()
            if not any(k == p or k.startswith(p + ".") for p in PER_PROCESS)}
    flat.update(identity or {})
    mine = json.dumps(sorted(flat)).encode()
    size = int(multihost_utils.broadcast_one_to_all(np.int32(len(mine))))
    buffer = np.zeros(size, np.uint8)
    if jax.process_index() == 0:
        buffer[:] = np.frombuffer(mine, np.uint8)
    keys = json.loads(bytes(np.asarray(multihost_utils.broadcast_one_to_all(buffer))))
    absent = "<absent>"
    extra = sorted(set(flat) - set(keys))
    digests = np.array([_digest(flat.get(k, absent)) for k in keys] + [_digest(extra)],
                       np.int32)
    gathered = np.asarray(multihost_utils.process_allgather(digests))  # (processes, keys + 1)
    differ = {}
    for process in range(1, gathered.shape[0]):
        where = np.nonzero(gathered[process] != gathered[0])[0]
        names = [keys[j] if j < len(keys) else "keys that process 0 does not have"
                 for j in where]
        if names:
            differ[process] = names
    if not differ:
        return
    p0 = {k: flat.get(k, absent) for names in differ.values() for k in names if k in keys} \
        if jax.process_index() == 0 else {}
    parts = [f"process {p}: {', '.join(names[:8])}" + (" ..." if len(names) > 8 else "")
             for p, names in differ.items()]
    values = f" (process 0 has {p0})" if p0 else ""
    kinds = {_kind(k) for names in differ.values() for k in names}
    fixes = [fix for kind, fix in (
        ("config", "the same command, config file and overrides"),
        ("software", "the same checkout of contrastive_jax and the same package versions"),
        ("dataset", "the same prepared dataset in data.data_dir")) if kind in kinds]
    raise ConfigError(
        f"the {gathered.shape[0]} processes do not run the same config; settings that differ "
        f"from process 0's: {'; '.join(parts)}{values}. Start every process with "
        f"{' and '.join(fixes)}.")
