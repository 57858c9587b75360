"""How the package's commands read their flags, print their help and report errors, on absl.

Every ``python -m`` command of the package (``contrastive_jax.main``, ``.plan``, ``.demo``,
``.clip_export``, ``.training.data.prepare``, ``.training.data.build_tokenizer``,
``.training.data.convert_shards``, ``.training.models.converters.clip_import``,
``.training.models.converters.big_vision_import``) is a :class:`Command` run by :func:`run_command`,
which gives each the same command line:

- ``--help``, ``-h``, ``--helpshort``, ``--helpfull``: the command's docstring as plain text
  (:func:`plain_text`), its flags with their help and, for the training commands, the config
  files of ``configs/`` with their variants and defaults (:func:`config_files_help`, read
  without running them); on stdout, exit status 0. ``--helpfull`` adds the process's other absl
  flags and JAX's options.
- ``--jax_NAME=VALUE``: JAX's options (``jax.config``), e.g. ``--jax_num_cpu_devices=8``,
  ``--jax_platforms=cpu``, ``--nojax_enable_x64``, set before the command runs
  (:func:`apply_jax_flags`).
- A :class:`~contrastive_jax.errors.ContrastiveJaxError` (an unknown flag, a bad value, a
  missing required flag, anything else the user must change): one line ``error: ...`` on
  stderr and exit status 2; with ``CONTRASTIVE_JAX_TRACEBACK=1`` it raises, traceback and all.
  Anything else is a bug and raises.
- Ctrl-C (SIGINT) while the command works: one line on stderr, ``interrupted (SIGINT) while
  WHAT: nothing more was written``, and exit status 130 (:data:`INTERRUPTED_STATUS`), never a
  traceback, at once even while the main thread is inside a long C++ call (XLA compiling a
  program). WHAT is the innermost :func:`activity` the command named (the plan: ``compiling
  the train step for 8 devices (...)``), else ``running python -m NAME``. The process ends
  with ``os._exit`` after flushing stdout and stderr: no interpreter teardown (which could
  crash while XLA's threads still run) and no ``finally`` blocks, so a file being written
  when the signal came is left as it was, except inside :func:`finish_before_interrupt`,
  which the exit waits for (a second Ctrl-C does not wait). With
  ``CONTRASTIVE_JAX_TRACEBACK=1`` the Python stack of every thread is printed before the
  line.

How Ctrl-C is handled (:func:`run_command`, when it runs in the main thread and SIGINT has
Python's default handler, ``signal.default_int_handler``): SIGINT gets a Python handler that
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
a ``KeyboardInterrupt`` that reaches :func:`run_command` still ends as the same one line and
status 130.

Where the flags live: the training commands (``main``, and ``plan``, which reuses main's
``--config``) define theirs in absl's process-wide ``flags.FLAGS``, as ml_collections'
``config_flags`` and absl's logging flags do, and run under ``absl.app.run``. Every other
command defines its flags in a ``flags.FlagValues()`` of its own: absl refuses a second
definition of a flag name (``--output``, ``--data_dir``) in one ``FlagValues``, and every
command module imports together in one process (the test suite's).
"""

from __future__ import annotations

import _thread
import ast
import contextlib
import dataclasses
import faulthandler
import inspect
import os
import pathlib
import re
import signal
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator, Sequence

from absl import app, flags

from contrastive_jax.errors import ConfigError, ContrastiveJaxError

# the repository's config files, beside the package's source tree (absent from a wheel)
CONFIGS = pathlib.Path(__file__).parents[1] / "configs"
TRACEBACK_ENV = "CONTRASTIVE_JAX_TRACEBACK"  # set: a user error raises with its traceback
WIDTH = 96  # help text columns
HELP_FLAGS = {"h": "short", "?": "short", "help": "short", "helpshort": "short",
              "helpfull": "full"}
_JAX_FLAG = re.compile(r"^--?(?:no)?(jax_\w+)(=.*)?$", re.S)


@dataclasses.dataclass(frozen=True)
class Command:
    """A command line: how it is called, its help and its flags.

    ``program`` is how it is called (``python -m contrastive_jax.training.data.prepare``);
    ``doc`` its help text (the module docstring, RST allowed); ``flag_values`` holds its flags
    (``flags.FLAGS`` for the training commands, else a ``FlagValues`` of its own);
    ``flag_names`` the flags its ``--help`` lists, in order (empty: every flag of
    ``flag_values``); ``required`` the flags that must be given; ``positional`` the usage of
    its positional arguments (``"[NAME ...]"``; empty: it takes none); ``parse`` a flag parser
    ``argv -> remaining argv`` (program name first) to use instead of :func:`parse_flags`
    (main's, which reports config-file errors); ``configs``: its help lists the config files
    of :data:`CONFIGS`.
    """

    program: str
    doc: str
    flag_values: flags.FlagValues = flags.FLAGS
    flag_names: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    positional: str = ""
    parse: Callable[[list[str]], list[str]] | None = None
    configs: bool = False


def run_command(command: Command, main: Callable[[list[str]], int | None],
        argv: Sequence[str] | None = None) -> int:
    """Run ``main(positional arguments)`` with ``command``'s flags parsed from ``argv`` (the
    arguments after the program name; ``sys.argv[1:]`` when None); the exit status.

    In order: a help flag prints :func:`help_text` and returns 0; ``--jax_*`` flags are
    applied (:func:`apply_jax_flags`); the other flags are parsed into
    ``command.flag_values`` (under ``absl.app.run`` for ``flags.FLAGS``); ``main`` runs and
    its return value (None: 0) is the status. A :class:`ContrastiveJaxError` from any step is
    printed as ``error: ...`` on stderr and returns 2 (raises when ``CONTRASTIVE_JAX_TRACEBACK``
    is set). Ctrl-C (SIGINT) during any step prints one line ``interrupted (SIGINT) while
    ...: nothing more was written`` and ends the process with status 130 at once (in the main
    thread; module docstring), or, where no handler could be installed, returns 130 after the
    same line when the ``KeyboardInterrupt`` reaches this function.
    """
    global _interrupted_while
    args = list(sys.argv[1:] if argv is None else argv)
    _interrupted_while = None
    guard = _InterruptGuard.install(command.program)
    try:
        request = help_request(args)
        if request:
            print(help_text(command, full=request == "full"))
            return 0
        args = apply_jax_flags(args)
        if command.flag_values is flags.FLAGS:
            return _run_absl_app(command, main, args)
        return main(parse_command_line(command, args)) or 0
    except ContrastiveJaxError as err:
        if os.environ.get(TRACEBACK_ENV):
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if os.environ.get(TRACEBACK_ENV):
            raise
        sys.stdout.flush()
        print(interrupt_line(_interrupted_while or f"running {command.program}"),
              file=sys.stderr, flush=True)
        return INTERRUPTED_STATUS
    finally:
        if guard is not None:
            guard.close()


def _run_absl_app(command: Command, main: Callable[[list[str]], int | None],
                  args: list[str]) -> int:
    """``absl.app.run`` (absl's logging handler and defaults) with ``command``'s parsing."""
    try:
        app.run(main, argv=[command.program, *args],
                flags_parser=lambda argv: parse_command_line(command, argv[1:]))
    except SystemExit as stop:  # app.run ends with sys.exit(main(...))
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        raise
    return 0


def parse_command_line(command: Command, args: list[str]) -> list[str]:
    """Parse ``args`` (no program name) into ``command.flag_values`` (a command's own
    ``FlagValues`` from its defaults on every call); the positional arguments. A flag that
    absl refuses, a missing ``required`` flag or positional arguments
    that ``command`` does not take are a :class:`ConfigError`."""
    argv = [command.program, *args]
    if command.flag_values is not flags.FLAGS:  # a command's own flags: from their defaults
        command.flag_values.unparse_flags()
    parse = command.parse or (lambda a: parse_flags(command.flag_values, a, command.program))
    positional = parse(argv)[1:]
    missing = [f"--{name}" for name in command.required
               if command.flag_values[name].value is None]
    if missing:
        raise ConfigError(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                          f"required (`{command.program} --help` lists the flags)")
    if positional and not command.positional:
        raise ConfigError(f"unexpected arguments {positional}: {command.program} takes flags "
                          "only (`--help` lists them)")
    return positional


def parse_flags(flag_values: flags.FlagValues, argv: list[str], program: str) -> list[str]:
    """``flag_values(argv)`` (program name first; the remaining argv), an error of absl's as a
    :class:`ConfigError` (:func:`flag_error`)."""
    try:
        return flag_values(argv)
    except flags.Error as err:
        raise flag_error(err, program) from None


def flag_error(err: flags.Error, program: str) -> ConfigError:
    """absl's parsing error as one line: ``unknown flag --NAME`` (with absl's suggestion), or
    the last line of its message (``flag --n=abc: invalid literal for int() ...``)."""
    if isinstance(err, flags.UnrecognizedFlagError):
        close = [n.strip() for n in str(err).partition("Did you mean:")[2].strip(" ?").split(",")]
        hint = f"; did you mean {' or '.join(f'--{n}' for n in close)}?" if close[0] else ""
        return ConfigError(f"unknown flag --{err.flagname}{hint} (`{program} --help` lists "
                           "the flags)")
    return ConfigError(last_line(err))


def last_line(err: BaseException) -> str:
    """The last line of an error's message, without a ``module.ErrorClass: `` prefix (what
    is left of a traceback that a library folded into the message)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    last = lines[-1] if lines else type(err).__name__
    head, sep, rest = last.partition(": ")
    return rest if sep and head.rpartition(".")[2].endswith("Error") else last


def help_request(args: Sequence[str]) -> str | None:
    """``"short"`` for ``-h`` / ``--help`` / ``--helpshort`` (one or two dashes), ``"full"``
    for ``--helpfull``, before any ``--``; else None."""
    for arg in args:
        if arg == "--":
            return None
        if arg.startswith("-") and arg.lstrip("-") in HELP_FLAGS:
            return HELP_FLAGS[arg.lstrip("-")]
    return None


# ------------------------------------------------------------------------- Ctrl-C (SIGINT)
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


# ------------------------------------------------------------------------------ JAX's flags
def jax_flag_values() -> flags.FlagValues:
    """JAX's options as absl flags in a ``FlagValues`` of their own: the names, types,
    choices and help that ``jax.config.config_with_absl`` declares in absl's ``flags.FLAGS``
    (from ``jax.config.meta``), their defaults the current values."""
    import jax

    define = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float,
              str: flags.DEFINE_string, "enum": flags.DEFINE_enum,
              "enum_class": flags.DEFINE_enum_class}
    values, current = flags.FlagValues(), jax.config.values
    for name, (kind, args, kwargs) in jax.config.meta.items():
        if kind in define:
            define[kind](name, current[name], *args, flag_values=values, **kwargs)
    return values


def apply_jax_flags(args: Sequence[str]) -> list[str]:
    """Set the JAX options that ``args`` name (``--jax_NAME=VALUE``, ``--jax_NAME VALUE``,
    boolean ``--jax_NAME`` / ``--nojax_NAME``, before any ``--``) with ``jax.config.update``;
    the other arguments, in order.

    What ``jax.config.parse_flags_with_absl()`` does for ``sys.argv``, for any ``args`` and on
    every call: that function reads ``sys.argv`` only, acts once per process, ignores
    ``--nojax_*`` and runs the validators of every flag in ``flags.FLAGS`` (a required flag
    not parsed yet fails). An unknown option, a value of the wrong type or one JAX refuses
    (``--jax_num_cpu_devices`` once JAX has started its backend) is a :class:`ConfigError`.
    JAX is imported only when ``args`` hold a JAX flag.
    """
    args = list(args)
    end = args.index("--") if "--" in args else len(args)
    if not any(_JAX_FLAG.match(arg) for arg in args[:end]):
        return args
    import jax

    values = jax_flag_values()
    ours, rest, i = [], [], 0
    while i < len(args):
        match = _JAX_FLAG.match(args[i]) if i < end else None
        if match is None:
            rest.append(args[i])
        else:
            ours.append(args[i])
            name = match.group(1)
            if match.group(2) is None and name in values and not values[name].boolean and \
                    i + 1 < end:  # --jax_platforms cpu
                ours.append(args[i + 1])
                i += 1
        i += 1
    try:
        values(["jax", *ours])
    except flags.UnrecognizedFlagError as err:
        raise ConfigError(f"unknown JAX option --{err.flagname} (`--helpfull` lists JAX's "
                          "options)") from None
    except flags.Error as err:
        raise ConfigError(last_line(err)) from None
    for name in (n for n in values if values[n].present):
        try:
            jax.config.update(name, values[name].value)
        except (RuntimeError, ValueError, TypeError) as err:
            raise ConfigError(f"--{name}={values[name].value}: {err}") from None
    return rest


# ------------------------------------------------------------------------------------ help
def help_text(command: Command, full: bool = False) -> str:
    """The help of ``command``: usage, its docstring as plain text, its flags, JAX's flags and
    (``command.configs``) the config files; ``full`` adds the process's other absl flags and
    every JAX option."""
    usage = f"usage: {command.program} [flags]"
    usage += f" {command.positional}" if command.positional else ""
    names = command.flag_names or defined_flags(command.flag_values)
    parts = [usage, plain_text(command.doc), "flags:\n" + "\n".join(
        flag_help(command.flag_values[n], n in command.required) for n in names)]
    parts.append(textwrap.fill(
        "JAX's options are flags too, set before the command runs: --jax_NAME=VALUE, e.g. "
        "--jax_num_cpu_devices=8, --jax_platforms=cpu, --jax_enable_x64 / --nojax_enable_x64 "
        "(--helpfull lists them).", WIDTH))
    if command.configs:
        parts.append(config_files_help(CONFIGS))
    if full:
        others = [n for n in defined_flags(command.flag_values) if n not in names]
        if others:
            parts.append("other flags of this process (absl):\n" + "\n".join(
                flag_help(command.flag_values[n]) for n in sorted(others)))
        jax_values = jax_flag_values()
        parts.append("JAX's options:\n" + "\n".join(
            flag_help(jax_values[n]) for n in sorted(defined_flags(jax_values))))
    return "\n\n".join(parts)


def defined_flags(flag_values: flags.FlagValues) -> list[str]:
    """The flags of ``flag_values`` by their names (not their short names), in definition
    order."""
    return [name for name in flag_values if flag_values[name].name == name]


def flag_help(flag: flags.Flag, required: bool = False) -> str:
    """``  --name=TYPE  (notes)`` and the flag's help below it, plain text."""
    if flag.boolean:
        head = f"--{flag.name} / --no{flag.name}"
    else:
        choices = getattr(flag.parser, "enum_values", None) or getattr(
            flag.parser, "member_names", None)
        kind = ("{" + "|".join(choices) + "}" if choices else
                {"int": "INT", "float": "FLOAT"}.get(flag.flag_type(), "VALUE"))
        head = f"--{flag.name}={kind}"
    notes = ["repeatable"] if isinstance(flag, flags.MultiFlag) else []
    default = _default_text(flag.default)
    notes += ["required"] if required else [f"default: {default}"] if default else []
    lines = ["  " + head + (f"  ({'; '.join(notes)})" if notes else "")]
    text = " ".join(plain_text(flag.help or "").split())
    text = text.removesuffix("; repeat this option to specify a list of values")  # absl's
    text = re.sub(r"^<[^>]*>: ", "", text)  # absl's choices, shown in the head
    lines += textwrap.wrap(text, WIDTH, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return "\n".join(lines)


def _default_text(default) -> str | None:
    """A flag's default as the user would type it; None for none (None, empty)."""
    if default is None or (isinstance(default, str | list | tuple | dict) and not default):
        return None
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, list | tuple):
        return ",".join(map(str, default))
    return str(default)


_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`([^`]*)`")  # :func:`~a.b.c`, :class:`T <a.b.T>`


def plain_text(doc: str) -> str:
    """``doc`` (a docstring in reStructuredText) as plain text: indentation cleaned, roles as
    their text (``:func:`~a.b.c``` -> ``c``, ``:mod:`a.b``` -> ``a.b``), inline literals,
    interpreted text and bold as their text, a literal block's ``::`` as ``:``."""
    def role(match: re.Match) -> str:
        target = "".join(match.group(1).split())  # a role may wrap over two lines
        title = re.match(r"(.*?)<(.*)>$", match.group(1).strip(), re.S)
        if title and title.group(1).strip():
            return " ".join(title.group(1).split())
        return target.rpartition(".")[2] if target.startswith("~") else target

    text = _ROLE.sub(role, inspect.cleandoc(doc))
    text = re.sub(r"``(.+?)``", r"\1", text, flags=re.S)
    text = re.sub(r"\*\*(.+?)\*\*", r"\1", text, flags=re.S)
    text = re.sub(r"`([^`\n]+)`", r"\1", text)
    text = re.sub(r"^[ \t]*::[ \t]*$\n?", "", text, flags=re.M)  # a lone ``::`` line
    text = re.sub(r"[ \t]+::[ \t]*$", "", text, flags=re.M)  # "text ::": no colon shown
    return re.sub(r"::[ \t]*$", ":", text, flags=re.M)  # "text::" -> "text:"


# --------------------------------------------------------------------------------- configs
def config_variants(path: pathlib.Path) -> list[str] | None:
    """The variants of a config file as ``key=default`` (source text), read from its
    ``get_config``'s call ``parse(arg, key=default, ...)`` (``contrastive_jax.training.config``)
    with ``ast``, without running it; ``[]`` when it calls no ``parse``, None when it has no
    ``get_config``. A file that does not parse raises ``SyntaxError``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    functions = [node for node in tree.body
                 if isinstance(node, ast.FunctionDef) and node.name == "get_config"]
    if not functions:
        return None
    for node in ast.walk(functions[0]):
        if isinstance(node, ast.Call) and (
                getattr(node.func, "id", None) == "parse"
                or getattr(node.func, "attr", None) == "parse"):
            return [f"{kw.arg}={ast.unparse(kw.value)}" for kw in node.keywords if kw.arg]
    return []


def config_files_help(folder: pathlib.Path) -> str:
    """The config files of ``folder`` for ``--help``: each file, the first line of its
    docstring and its variants with their defaults (:func:`config_variants`); or that the
    folder is absent."""
    shown = _shown_path(folder)
    files = sorted(folder.glob("*.py")) if folder.is_dir() else []
    if not files:
        return (f"config files: none in {shown} (it is the repository's configs/ folder, not "
                "installed with the package); give --config=PATH of a config file")
    lines = [textwrap.fill(
        f"config files ({shown}): --config={shown}/NAME.py[:VARIANTS], VARIANTS being "
        "comma-separated key=value (or key alone: True), e.g. "
        f"--config={shown}/simclr_mnist1d.py:quick,batch=64; any field with "
        "--config.FIELD=VALUE, e.g. --config.loss.temperature=0.1", WIDTH)]
    for path in files:
        try:
            tree_doc = ast.get_docstring(ast.parse(path.read_text(), filename=str(path))) or ""
            variants = config_variants(path)
        except (SyntaxError, OSError, UnicodeDecodeError) as err:
            lines.append(f"  {path.name}: cannot be read ({type(err).__name__}: {err})")
            continue
        title = plain_text(tree_doc).split("\n\n")[0] if tree_doc else ""
        listed = ("no get_config" if variants is None else
                  ", ".join(variants) if variants else "none")
        lines.append(f"  {path.name}")
        for text in (title, f"variants (defaults): {listed}"):
            lines += textwrap.wrap(" ".join(text.split()), WIDTH, initial_indent=" " * 6,
                                   subsequent_indent=" " * 6)
    return "\n".join(lines)


def _shown_path(folder: pathlib.Path) -> str:
    """``folder`` relative to the working directory when inside it, else absolute."""
    try:
        return os.path.relpath(folder) if folder.resolve().is_relative_to(
            pathlib.Path.cwd().resolve()) else str(folder.resolve())
    except ValueError:
        return str(folder)
