"""What a command's ``--help`` prints: its usage, its docstring as plain text
(:func:`plain_text`), its flags (:func:`flag_help`), JAX's options and, for the training
commands, the config files of ``configs/`` with their variants and defaults, read with
:mod:`ast` without running them (:func:`config_files_help`, :func:`config_variants`).
:func:`contrastive_jax.command_line.run_command` prints :func:`help_text` for ``-h``,
``--help``, ``--helpshort`` and ``--helpfull``.
"""

from __future__ import annotations

import ast
import inspect
import os
import pathlib
import re
import textwrap

from absl import flags

from contrastive_jax.command_line import Command, jax_flag_values

# the repository's config files, beside the package's source tree (absent from a wheel)
CONFIGS = pathlib.Path(__file__).parents[1] / "configs"
WIDTH = 96  # help text columns


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


# ------------------------------------------------------------------------ the config files
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
