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

Where the flags live: the training commands (``main``, and ``plan``, which reuses main's
``--config``) define theirs in absl's process-wide ``flags.FLAGS``, as ml_collections'
``config_flags`` and absl's logging flags do, and run under ``absl.app.run``. Every other
command defines its flags in a ``flags.FlagValues()`` of its own: absl refuses a second
definition of a flag name (``--output``, ``--data_dir``) in one ``FlagValues``, and every
command module imports together in one process (the test suite's).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import pathlib
import re
import sys
import textwrap
from collections.abc import Callable, Sequence

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
    is set).
    """
    args = list(sys.argv[1:] if argv is None else argv)
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
