"""JAX's persistent compilation cache for the command lines (``main``, ``demo``).

A rerun, a resume or a sweep then skips the compilations it has seen: the cache key covers the
program, its shapes and shardings, the XLA flags and the jax/jaxlib versions, so a cached
executable is only reused where it is the same program.
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
