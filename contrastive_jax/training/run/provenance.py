"""Where a result came from: when, from which code, with which versions, on which devices.

:func:`provenance` is the record every result file carries (the trainer's ``results.json``
under ``"provenance"``; the tables and CSV files of ``experiments/`` and ``benchmarks/``, as
:func:`provenance_line` or as JSON); it never raises: what it cannot find it says it could not.

- ``date_utc``: now, ISO 8601 in UTC (``2026-12-02T18:20:31Z``);
- ``commit``: ``git rev-parse HEAD`` of the checkout this package was imported from, or
  ``"not a checkout"`` (no ``git`` command, or the package is not a tracked file of a git
  repository: an installed wheel, a copied tree); ``dirty``: whether a ``.py`` file of that
  checkout differs from the commit or is new and not ignored (the code that made the
  numbers; result files and docs are not counted), None when there is no checkout;
- ``python``, ``jax``, ``jaxlib``, ``flax``, ``optax``: the installed versions
  (``"not installed"`` for one that is not);
- ``device_kind`` (the devices' kinds, ``", "``-joined when mixed: ``"cpu"``,
  ``"NVIDIA H200"``, ``"TPU v5 lite"``), ``device_count`` (all processes' devices),
  ``process_count``.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import pathlib
import platform
import subprocess
from typing import Any

NOT_A_CHECKOUT = "not a checkout"
PACKAGES = ("jax", "jaxlib", "flax", "optax")
_PACKAGE_DIR = pathlib.Path(__file__).resolve().parents[2]  # contrastive_jax/


def _git(*args: str, cwd: pathlib.Path) -> str | None:
    """``git ARGS`` run in ``cwd``: its output, or None if git is missing or fails."""
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                              timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def git_state(package_dir: str | pathlib.Path = _PACKAGE_DIR) -> tuple[str, bool | None]:
    """``(commit, dirty)`` of the checkout holding ``package_dir`` (default: this package),
    ``("not a checkout", None)`` when ``git`` is missing or ``package_dir/__init__.py`` is not
    a tracked file of a checkout."""
    folder = pathlib.Path(package_dir)
    if not folder.is_dir() or _git("ls-files", "--error-unmatch", "__init__.py",
                                   cwd=folder) is None:
        return NOT_A_CHECKOUT, None
    top = _git("rev-parse", "--show-toplevel", cwd=folder)
    commit = _git("rev-parse", "HEAD", cwd=folder)
    if not top or not commit:
        return NOT_A_CHECKOUT, None
    changed = _git("status", "--porcelain", "--", "*.py", cwd=pathlib.Path(top))
    return commit, None if changed is None else bool(changed)


SOFTWARE = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "grain")
"""The packages whose versions every process of a job must share (besides this one's source)."""


def source_digest(package_dir: str | pathlib.Path = _PACKAGE_DIR) -> str:
    """SHA-256 (hex, first 16) of every ``.py`` file under ``package_dir`` (default: this
    package; relative path and bytes, sorted): the code a process runs, committed or not."""
    import hashlib

    digest = hashlib.sha256()
    root = pathlib.Path(package_dir)
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def version(package: str) -> str:
    """The installed version of ``package``, ``"not installed"`` when it is not."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _devices() -> dict[str, Any]:
    try:
        import jax

        kinds = sorted({d.device_kind for d in jax.devices()})
        return {"device_kind": ", ".join(kinds), "device_count": jax.device_count(),
                "process_count": jax.process_count()}
    except Exception as err:
        unknown = f"unknown ({type(err).__name__})"
        return {"device_kind": unknown, "device_count": None, "process_count": None}


def provenance() -> dict[str, Any]:
    """The record of the module docstring: ``date_utc``, ``commit``, ``dirty``, ``python``,
    ``jax``, ``jaxlib``, ``flax``, ``optax``, ``device_kind``, ``device_count``,
    ``process_count`` (plain JSON values). Never raises."""
    commit, dirty = git_state()
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    return {"date_utc": now.isoformat().replace("+00:00", "Z"), "commit": commit,
            "dirty": dirty, "python": platform.python_version(),
            **{name: version(name) for name in PACKAGES}, **_devices()}


def provenance_line(record: dict[str, Any] | None = None) -> str:
    """``record`` (default: :func:`provenance` now) as one line of text for a table's header:
    ``Provenance: 2026-12-02T18:20:31Z, commit ccde2bd1a2b3 + local changes (.py), Python
    3.11.7, jax 0.10.2, jaxlib 0.10.2, flax 0.12.8, optax 0.2.8, 8 x cpu, 1 process.``"""
    p = provenance() if record is None else record
    commit = p["commit"] if p["commit"] == NOT_A_CHECKOUT else f"commit {p['commit'][:12]}"
    commit += " + local changes (.py)" if p.get("dirty") else ""
    versions = ", ".join(f"{name} {p[name]}" for name in PACKAGES)
    processes = p["process_count"]
    return (f"Provenance: {p['date_utc']}, {commit}, Python {p['python']}, {versions}, "
            f"{p['device_count']} x {p['device_kind']}, {processes} "
            f"process{'' if processes == 1 else 'es'}.")
