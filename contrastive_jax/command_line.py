"""How the package's commands read their flags, print their help and report errors, on absl.

Every ``python -m`` command of the package (``contrastive_jax.main``, ``.plan``, ``.demo``,
``.clip_export``, ``.training.data.prepare``, ``.training.data.build_tokenizer``,
``.training.data.convert_shards``, ``.training.models.converters.clip_import``,
``.training.models.converters.big_vision_import``) is a :class:`Command` run by :func:`run_command`,
which gives each the same command line:

- ``--help``, ``-h``, ``--helpshort``, ``--helpfull``: the command's docstring as plain text,
  its flags with their help and, for the training commands, the config files of ``configs/``
  with their variants and defaults, read without running them
  (:mod:`contrastive_jax.command_help`); on stdout, exit status 0. ``--helpfull`` adds the
  process's other absl flags and JAX's options.
- ``--jax_NAME=VALUE``: JAX's options (``jax.config``), e.g. ``--jax_num_cpu_devices=8``,
  ``--jax_platforms=cpu``, ``--nojax_enable_x64``, set before the command runs
  (:func:`apply_jax_flags`).
- A :class:`~contrastive_jax.errors.ContrastiveJaxError` (an unknown flag, a bad value, a
  missing required flag, anything else the user must change): one line ``error: ...`` on
  stderr and exit status 2; with ``CONTRASTIVE_JAX_TRACEBACK=1`` it raises, traceback and all.
  Anything else is a bug and raises.
- Ctrl-C (SIGINT) while the command works: one line on stderr, ``interrupted (SIGINT) while
  WHAT: nothing more was written``, and exit status 130, at once even inside a long C++ call
  (XLA compiling a program), never a traceback (:mod:`contrastive_jax.interrupts`, which
  :func:`run_command` installs around every command).

Where the flags live: the training commands (``main``, and ``plan``, which reuses main's
``--config``) define theirs in absl's process-wide ``flags.FLAGS``, as ml_collections'
``config_flags`` and absl's logging flags do, and run under ``absl.app.run``. Every other
command defines its flags in a ``flags.FlagValues()`` of its own: absl refuses a second
definition of a flag name (``--output``, ``--data_dir``) in one ``FlagValues``, and every
command module imports together in one process (the test suite's).
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from collections.abc import Callable, Sequence

from absl import app, flags

from contrastive_jax import interrupts
from contrastive_jax.errors import TRACEBACK_ENV, ConfigError, ContrastiveJaxError

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
    of ``configs/`` (:data:`contrastive_jax.command_help.CONFIGS`).
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
    args = list(sys.argv[1:] if argv is None else argv)
    with interrupts.guarded(command.program):
        return _run(command, main, args)


def _run(command: Command, main: Callable[[list[str]], int | None], args: list[str]) -> int:
    """:func:`run_command`'s steps, inside its Ctrl-C guard."""
    try:
        request = help_request(args)
        if request:
            from contrastive_jax.command_help import help_text

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
        print(interrupts.keyboard_interrupt_line(command.program), file=sys.stderr, flush=True)
        return interrupts.INTERRUPTED_STATUS


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
