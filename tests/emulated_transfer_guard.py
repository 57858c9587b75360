"""JAX's device-to-host transfer guard, emulated on the CPU (not a test).

On a TPU or GPU, ``jax.transfer_guard_device_to_host("disallow")`` makes a read of a device
array on the host an error; on the CPU backend JAX never applies it (the arrays already live
in host memory), so a test of "the loop never waits for the device between its sync points"
would pass whatever the loop did. :func:`install` makes every read of an array's value
(``float(x)``, ``int(x)``, ``bool(x)``, ``jax.device_get(x)``, ``x.tolist()``: all go through
``ArrayImpl._value``; and ``np.asarray`` / ``np.array`` / ``np.asanyarray`` /
``np.ascontiguousarray`` of a device array, which NumPy reads through the buffer protocol,
wrapped at NumPy's module attributes) raise :class:`GuardedRead` while the guard's level is
``"disallow"`` or ``"disallow_explicit"``; stricter than the accelerators (which let an explicit
``jax.device_get`` through under ``"disallow"``), so a pass here holds there too.

A child process gets it from ``sitecustomize.py`` in :func:`site_folder`.
"""

import pathlib
import textwrap


class GuardedRead(RuntimeError):
    """A device array was read on the host under a disallowing transfer guard."""


def install() -> None:
    """Guard ``ArrayImpl._value`` as the module docstring says (idempotent)."""
    from jax._src import array, config

    current = array.ArrayImpl.__dict__["_value"]
    if getattr(current.fget, "emulated_guard", False):
        return

    def guarded(self):
        level = config.transfer_guard_device_to_host.value
        if level in ("disallow", "disallow_explicit"):
            raise GuardedRead(f"a device array {self.shape} {self.dtype} was read on the host "
                              f"under jax.transfer_guard_device_to_host({level!r})")
        return current.fget(self)

    guarded.emulated_guard = True
    array.ArrayImpl._value = property(guarded)

    import numpy as np

    def wrap(convert):
        def guarded_convert(value, *args, **kwargs):
            if isinstance(value, array.ArrayImpl):
                guarded(value)  # raises under the guard
            return convert(value, *args, **kwargs)
        return guarded_convert

    for name in ("asarray", "array", "asanyarray", "ascontiguousarray"):
        setattr(np, name, wrap(getattr(np, name)))


def site_folder(tmp_path: pathlib.Path) -> pathlib.Path:
    """A folder whose ``sitecustomize.py`` installs the emulation in a child Python (put it
    first on the child's ``PYTHONPATH``)."""
    folder = tmp_path / "emulated_guard_site"
    folder.mkdir(exist_ok=True)
    here = pathlib.Path(__file__).resolve().parent
    (folder / "sitecustomize.py").write_text(textwrap.dedent(f"""\
        import sys
        sys.path.insert(0, {str(here)!r})
        import emulated_transfer_guard
        emulated_transfer_guard.install()
        """))
    return folder
