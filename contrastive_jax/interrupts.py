"""Ctrl-C (SIGINT) during a command: one line, ``interrupted (SIGINT) while WHAT: nothing more
was written``, and exit status 130 (:data:`INTERRUPTED_STATUS`), never a traceback, at once even
while the main thread is inside a long C++ call (XLA compiling a program).

:func:`~contrastive_jax.command_line.run_command` runs every command inside :func:`guarded`.
WHAT is the innermost :func:`activity` the command named (the plan: ``compiling the train step
for 8 devices (...)``), else ``running python -m NAME``. The process ends with ``os._exit``
after flushing stdout and stderr: no interpreter teardown (which could crash while XLA's
threads still run) and no ``finally`` blocks, so a file being written when the signal came is
left as it was, except inside :func:`finish_before_interrupt`, which the exit waits for (a
second Ctrl-C does not wait). With ``CONTRASTIVE_JAX_TRACEBACK=1`` the Python stack of every
thread is printed before the line.

How (:func:`guarded`, around a command run in the main thread while SIGINT has Python's
default handler, ``signal.default_int_handler``): SIGINT gets a Python handler that
raises nothing, and ``signal.set_wakeup_fd`` a pipe that a watcher thread reads. Python's C
handler writes the signal's number to that pipe the moment the signal arrives, whatever the main
thread is doing (a Python handler itself runs only when the main thread next executes
bytecode); the watcher, seeing a SIGINT while this handler is still the installed one, prints
the line and ends the process. A handler installed later by the command replaces this one
and takes SIGINT over: the trainer's :class:`~contrastive_jax.training.run.preemption.StopSignal`
(finish the step, save, exit 0), its job supervisor's forwarding; the watcher ignores a SIGINT
that arrives under another handler, and serves again once that handler is restored. When
the command returns, the previous handler and wakeup fd are restored and the watcher stopped
(tests call commands in-process many times). The watcher is a low-level ``_thread`` thread,
not a ``threading.Thread``: it holds no lock while it waits, so a fork loses nothing, and
``threading.active_count()`` (the job supervisor forks only when it is 1) does not count it.
In a process forked meanwhile (the supervised trainer, a data worker) the handler acts as
Python's default, raising ``KeyboardInterrupt``, and the wakeup fd is unset. Elsewhere (a
command run in another thread, SIGINT ignored or handled by the caller) nothing is installed;
a ``KeyboardInterrupt`` that reaches
:func:`~contrastive_jax.command_line.run_command` still ends as the same one line and
status 130.

The other way a command ends at once, ``kill -9``, runs no cleanup at all, so its children
(grain's input workers, the converter's workers, a supervised trainer) would go on running,
holding memory and shared memory, beside the rerun that replaces it: each of them calls
:func:`die_with_parent` (Linux's ``prctl(PR_SET_PDEATHSIG)``: the kernel kills it with its
parent).
"""

from __future__ import annotations

import _thread
import contextlib
import faulthandler
import os
import signal
import sys
import threading
from collections.abc import Iterator

from contrastive_jax.errors import TRACEBACK_ENV

INTERRUPTED_STATUS = 130  # 128 + SIGINT: the status a shell shows for a process Ctrl-C ended
# the watcher's own bytes on its pipe, beside the signal numbers (1 to 64) Python writes there
_STOP, _HANDLED, _WAKE = 0, 254, 255
_exit_process = os._exit  # how the watcher ends the process (a test puts a recorder here)
_activities: list[str] = []  # what the command is doing, innermost last (:func:`activity`)
_interrupted_while: str | None = None  # the activity a KeyboardInterrupt left first
_lock = threading.Lock()  # _sections; held by the watcher while it ends the process
_sections = 0  # blocks of finish_before_interrupt running now
_active: _InterruptGuard | None = None  # the guard of the command running now


def interrupt_line(what: str) -> str:
    """The one line a command interrupted by Ctrl-C prints: ``interrupted (SIGINT) while
    WHAT: nothing more was written``."""
    return f"interrupted (SIGINT) while {what}: nothing more was written"


@contextlib.contextmanager
def activity(what: str) -> Iterator[None]:
    """Name what the command does inside the block (``compiling the train step for 8
    devices``) for the line a Ctrl-C prints (:func:`interrupt_line`); blocks nest, the
    innermost is named. Use it in the command's own thread; costs nothing outside a
    command."""
    global _interrupted_while
    depth = len(_activities)
    _activities.append(what)
    try:
        yield
    except KeyboardInterrupt:
        if _interrupted_while is None:  # the innermost block the interrupt left
            _interrupted_while = what
        raise
    finally:
        del _activities[depth:]


@contextlib.contextmanager
def finish_before_interrupt() -> Iterator[None]:
    """A block that a Ctrl-C lets finish before the command exits: writing one file and
    renaming it into place (:func:`contrastive_jax.training.run.workdir.json_output.write_atomic`
    uses it), so that no temporary file is left behind and the rename happens or not. The
    exit waits until no such block runs in any thread (a second Ctrl-C exits at once), and
    a block that starts after the exit has begun waits for it (the process ends first). Keep
    such blocks short: the user is waiting. Outside a command, or where the interrupt is a
    ``KeyboardInterrupt``, it does nothing (the exception goes through the block)."""
    global _sections
    with _lock:
        _sections += 1
    try:
        yield
    finally:
        with _lock:
            _sections -= 1
            guard = _active if _sections == 0 else None
        if guard is not None and guard.requested.is_set():
            guard.poke(_WAKE)  # the watcher was waiting for this block


class _InterruptGuard:
    """Ctrl-C for one :func:`run_command` in the main thread: SIGINT's handler, the wakeup
    pipe and its watcher thread (the module docstring says how they work together)."""

    def __init__(self, program: str):
        self.default = f"running {program}"
        self.pid = os.getpid()
        self.requested = threading.Event()  # a SIGINT is to end the command
        self.stopped = threading.Event()  # the watcher has ended
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)  # set_wakeup_fd's requirement
        self.handler = self.handle  # the one bound method, compared by identity
        self.previous_handler = None
        self.previous_fd = -1

    @classmethod
    def install(cls, program: str) -> _InterruptGuard | None:
        """The guard for ``program``, installed; None where none can be (not the main
        thread, SIGINT not at Python's default handler, a command already guarded, no
        ``set_wakeup_fd``)."""
        global _active
        if (_active is not None and _active.pid == os.getpid()) or \
                threading.current_thread() is not threading.main_thread() or \
                signal.getsignal(signal.SIGINT) is not signal.default_int_handler or \
                not hasattr(signal, "set_wakeup_fd"):
            return None
        guard = cls(program)
        _thread.start_new_thread(guard.watch, ())  # not a threading.Thread: module docstring
        _active = guard
        # the handler first: a SIGINT before the wakeup fd is set reaches the watcher through
        # the handler (_HANDLED), never through Python's default
        guard.previous_handler = signal.signal(signal.SIGINT, guard.handler)
        guard.previous_fd = signal.set_wakeup_fd(guard.write_fd, warn_on_full_buffer=False)
        return guard

    def handle(self, signum, frame) -> None:
        """SIGINT's Python handler: nothing (the watcher ends the process), only telling
        the watcher that it ran; in a forked process, or where the watcher is gone without
        ending the process, ``KeyboardInterrupt`` as Python's default handler."""
        if os.getpid() != self.pid or (self.stopped.is_set() and not self.requested.is_set()):
            raise KeyboardInterrupt
        self.poke(_HANDLED)

    def poke(self, byte: int) -> None:
        """Write ``byte`` to the watcher's pipe (nothing if the pipe is full or closed)."""
        try:
            os.write(self.write_fd, bytes([byte]))
        except OSError:
            pass

    def watch(self) -> None:
        """The watcher: read the pipe until :meth:`close` says stop; end the process on a
        SIGINT that arrived while this guard's handler was installed, once no
        :func:`finish_before_interrupt` block runs (at once on a second SIGINT)."""
        sigints = 0
        try:
            while True:
                data = os.read(self.read_fd, 64)
                if not data or _STOP in data:
                    return
                for byte in data:
                    if byte == signal.SIGINT and \
                            signal.getsignal(signal.SIGINT) is self.handler:
                        sigints += 1
                        self.requested.set()
                    elif byte == _HANDLED:
                        self.requested.set()
                if self.requested.is_set():
                    with _lock:
                        if _sections == 0 or sigints > 1:
                            self.exit()
                            return
        finally:
            self.stopped.set()

    def exit(self) -> None:
        """Flush stdout and stderr, print the one line, end the process with status 130
        (``os._exit``: no teardown)."""
        try:
            what = _activities[-1] if _activities else self.default
        except IndexError:  # the command's thread left its last activity meanwhile
            what = self.default
        if os.environ.get(TRACEBACK_ENV):
            with contextlib.suppress(Exception):
                sys.stderr.flush()
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        with contextlib.suppress(Exception):
            print(interrupt_line(what), file=sys.stderr, flush=True)
        _exit_process(INTERRUPTED_STATUS)

    def close(self) -> None:
        """Restore the previous handler and wakeup fd, stop the watcher, close the pipe (in
        a forked process, where neither the watcher nor the pipe is, only the handler)."""
        global _active
        _active = None
        if os.getpid() != self.pid:
            with contextlib.suppress(ValueError):  # not the main thread of the child
                signal.signal(signal.SIGINT, self.previous_handler)
            return
        try:
            signal.set_wakeup_fd(self.previous_fd)
        except (ValueError, OSError):  # that fd was closed meanwhile: none, never ours
            signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGINT, self.previous_handler)
        os.set_blocking(self.write_fd, True)  # the stop byte must arrive
        os.write(self.write_fd, bytes([_STOP]))
        self.stopped.wait()
        os.close(self.read_fd)
        os.close(self.write_fd)


def _after_fork_in_child() -> None:
    """In a process forked while a command is guarded: no wakeup fd (its pipe is the
    parent's, read by the parent's watcher) and the pipe closed; the handler then acts as
    Python's default (:meth:`_InterruptGuard.handle`)."""
    guard = _active
    if guard is None or guard.pid == os.getpid():
        return
    with contextlib.suppress(ValueError, OSError):
        signal.set_wakeup_fd(-1)
    for fd in (guard.read_fd, guard.write_fd):
        with contextlib.suppress(OSError):
            os.close(fd)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def guarded(program: str) -> Iterator[None]:
    """The Ctrl-C guard of one command called ``program`` (``python -m NAME``) for the
    ``with`` block: installed where it can be (module docstring), removed after; the
    activity a ``KeyboardInterrupt`` leaves is forgotten from the last command."""
    global _interrupted_while
    _interrupted_while = None
    guard = _InterruptGuard.install(program)
    try:
        yield
    finally:
        if guard is not None:
            guard.close()


def keyboard_interrupt_line(program: str) -> str:
    """The one line for a ``KeyboardInterrupt`` that reached the command's caller (where no
    guard could be installed): the activity it left, else ``running PROGRAM``."""
    return interrupt_line(_interrupted_while or f"running {program}")


PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int | None = None, *_: object) -> None:
    """In a child: be killed (SIGKILL) when the parent dies (Linux; nothing elsewhere). With
    ``parent`` (the pid that started it), a child whose parent is already gone exits at once
    (the parent died before the request took effect). Extra arguments are ignored, so that it
    serves as a pool initializer and as grain's ``worker_init_fn(index, count)`` alike."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):  # no prctl: the children end with their queues
            pass
    if parent is not None and os.getppid() != parent:
        os._exit(1)
