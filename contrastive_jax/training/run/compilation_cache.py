"""JAX's persistent compilation cache for the command lines (``main``, ``demo``).

A rerun, a resume or a sweep then skips the compilations it has seen: the cache key covers the
program, its shapes and shardings, the XLA flags and the jax/jaxlib versions, so a cached
executable is only reused where it is the same program. Beside it, :class:`ModelFlopsMemo`
keeps each run's count of model FLOPs (the progress line's TFLOP/s and MFU), so that a rerun
does not trace and lower its step a second time to count them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

CACHE_ENV = "CONTRASTIVE_JAX_COMPILATION_CACHE"
MIN_COMPILE_TIME_ENV = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"


def compilation_cache_dir(environ: Mapping[str, str] = os.environ) -> str | None:
    """Where JAX's persistent compilation cache lives: ``$CONTRASTIVE_JAX_COMPILATION_CACHE``
    (``off``: no cache), else ``$XDG_CACHE_HOME`` or ``~/.cache``, then
    ``contrastive_jax/jax_compilation_cache``. Shared by every run of the user (a rerun, a
    resume, a sweep reuse the compiled steps; the key covers the program, shapes, flags and
    versions)."""
    path = environ.get(CACHE_ENV)
    if path is not None:
        return None if path.strip().lower() in ("", "off", "0", "none") else path
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "contrastive_jax", "jax_compilation_cache")


def enable_compilation_cache() -> None:
    """Turn on JAX's persistent compilation cache (:func:`compilation_cache_dir`) for programs
    that take over a second to compile (``$JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS``, JAX's
    own variable, sets another threshold: ``0`` caches every program)."""
    import jax

    path = compilation_cache_dir()
    if path is not None:
        jax.config.update("jax_compilation_cache_dir", path)
        if MIN_COMPILE_TIME_ENV not in os.environ:  # JAX reads the variable itself
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


MODEL_FLOPS_FOLDER = "model_flops"


class ModelFlopsMemo:
    """A run's model-FLOPs count (:mod:`contrastive_jax.training.step.model_flops`) kept beside
    JAX's persistent compilation cache, in ``<cache dir>/model_flops/<key>.json``: a rerun, a
    resume or a sweep point with the same step reads it instead of tracing and lowering the
    step once more (seconds of host time for a ViT-B/16, beside the first step's compile).

    The key (SHA-256) covers everything the count reads: the counting config
    (:func:`~contrastive_jax.training.step.model_flops.counting_config`, every field), the
    run's step count (the optimiser's schedule), the batch's shapes and dtypes, the mesh's
    axes, shape and device kinds, the versions of :data:`provenance.SOFTWARE` and the digest of
    this package's source (:func:`provenance.source_digest`): another model, batch, mesh,
    release or edit of the code is counted anew. Without a cache directory
    (``jax_compilation_cache_dir`` unset: ``CONTRASTIVE_JAX_COMPILATION_CACHE=off``) nothing is
    kept. A file that cannot be read or written is as if absent (the count never stops a
    run)."""

    def __init__(self, config, mesh, steps: int, directory: str | None = None):
        if directory is None:
            import jax

            directory = jax.config.jax_compilation_cache_dir
        self.directory = directory or None
        self.config, self.mesh, self.steps = config, mesh, steps

    def key(self, batch_shapes: Mapping) -> str:
        """The SHA-256 (hex) of the count's inputs for batches shaped like ``batch_shapes``
        (``{feature: array or shape struct}``, the global batch)."""
        import hashlib
        import json

        from contrastive_jax.training.run import provenance
        from contrastive_jax.training.run.workdir.config_record import plain
        from contrastive_jax.training.step.model_flops import counting_config

        inputs = {
            "config": plain(counting_config(self.config)), "steps": int(self.steps),
            "batch": sorted((str(k), [int(n) for n in v.shape], str(v.dtype))
                            for k, v in batch_shapes.items()),
            "mesh": {"axes": [str(a) for a in self.mesh.axis_names],
                     "shape": [int(n) for n in self.mesh.devices.shape],
                     "device_kinds": sorted({d.device_kind for d in self.mesh.devices.flat})},
            "software": {name: provenance.version(name) for name in provenance.SOFTWARE},
            "source": provenance.source_digest()}
        return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()

    def _path(self, key: str):
        from etils import epath

        return epath.Path(self.directory) / MODEL_FLOPS_FOLDER / f"{key}.json"

    def get(self, key: str) -> float | None:
        """The count kept under ``key`` (:meth:`key`), or None (no directory, no file, or one
        that cannot be read)."""
        import json

        if self.directory is None:
            return None
        try:
            value = json.loads(self._path(key).read_text())["model_flops"]
        except Exception:  # absent, unreadable or damaged: counted again
            return None
        return float(value) if isinstance(value, int | float) and value >= 0 else None

    def put(self, key: str, flops: float) -> None:
        """Keep ``flops`` under ``key`` (written whole:
        :func:`~contrastive_jax.training.run.workdir.json_output.write_atomic`, over a damaged
        file too); a failure is ignored."""
        from contrastive_jax.training.run.workdir.json_output import write_atomic

        if self.directory is None:
            return
        try:
            path = self._path(key)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, {"model_flops": float(flops)})
        except Exception:  # a read-only or full cache: the next run counts again
            pass
