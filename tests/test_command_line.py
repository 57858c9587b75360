"""The package's command lines share one library (contrastive_jax/command_line.py): plain-text
``--help`` with exit status 0, JAX's ``--jax_*`` options as flags, one line ``error: ...`` and
exit status 2 for a bad flag; every command module imports with the others in one process.

In-process, except one ``python -m contrastive_jax.main --help`` (the real entry point); main's
errors and its ``--jax_*`` flags are checked by tests/test_reliability.py's forked command lines
(USER_ERRORS), prepare's ``-m`` import by tests/test_datasets.py."""

import importlib
import re
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from absl import flags

from contrastive_jax import command_line

REPO = Path(__file__).resolve().parents[1]
# module -> how it is called; each has main(argv) -> exit status and its own FLAGS
CONVERTED = ["contrastive_jax.training.data.prepare",
             "contrastive_jax.training.data.build_tokenizer",
             "contrastive_jax.training.data.convert_shards",
             "contrastive_jax.training.models.converters.clip_import",
             "contrastive_jax.training.models.converters.big_vision_import",
             "contrastive_jax.clip_export",
             "contrastive_jax.demo",
             "contrastive_jax.evaluate"]
COMMANDS = ["contrastive_jax.main", "contrastive_jax.plan", *CONVERTED]
RST = ("``", ":func:", ":mod:", ":class:", ":data:", "::", "**")


def test_every_command_module_imports_with_the_others_in_one_process():
    """absl refuses a flag name defined twice in one FlagValues: the converted commands keep
    theirs (--output, --data_dir in several) out of absl's process-wide flags.FLAGS."""
    modules = [importlib.import_module(name) for name in COMMANDS]
    own = [m.FLAGS for m in modules if m.__name__ in CONVERTED]
    assert len({id(f) for f in own}) == len(CONVERTED) and flags.FLAGS not in own
    names = [set(command_line.defined_flags(f)) for f in own]
    assert sum("data_dir" in n for n in names) == 4 and sum("output" in n for n in names) == 5
    assert not {"data_dir", "output", "checkpoint", "batch"} & set(flags.FLAGS)
    assert {"config", "workdir"} <= set(flags.FLAGS)  # main's, shared with plan


@pytest.mark.parametrize("name", CONVERTED)
def test_help_is_plain_text_and_exits_0(name, capsys):
    module = importlib.import_module(name)
    assert module.main(["--help"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"usage: python -m {name} [flags]") and not err
    assert not [mark for mark in RST if mark in out], out
    first = module.__doc__.strip().splitlines()[0].replace("``", "")
    assert f"\n\n{first}" in out  # the docstring, then the flags with their help
    _, _, listed = out.partition("\nflags:\n")
    for flag in command_line.defined_flags(module.FLAGS):
        assert f"\n  --{flag}" in f"\n{listed}", flag
    assert "--jax_NAME=VALUE" in listed


def test_help_flags_and_helpfull(capsys):
    from contrastive_jax import demo
    from contrastive_jax.training.data import build_tokenizer

    assert demo.main(["-h"]) == 0
    short = capsys.readouterr().out
    assert "  --batch=INT  (default: 256)\n      rows of the synthetic batch\n" in short
    assert "  --skip-gradcheck / --noskip-gradcheck  (default: false)\n" in short
    assert "--jax_num_cpu_devices=INT" not in short
    assert build_tokenizer.main(["--helpfull", "--dataset=x"]) == 0
    full = capsys.readouterr().out
    assert "  --dataset=VALUE  (required)\n" in full
    assert "  --model_type={unigram|bpe}  (default: unigram)\n" in full
    assert "JAX's options:\n" in full and "\n  --jax_num_cpu_devices=INT" in full
    assert command_line.help_request(["--output", "x", "--", "--help"]) is None


def test_main_help_from_the_command_line_lists_the_configs_and_their_variants():
    run = subprocess.run([sys.executable, "-m", "contrastive_jax.main", "--help"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and not run.stderr, run.stderr
    out = run.stdout
    assert out.startswith("usage: python -m contrastive_jax.main [flags]\n\nCommand line: ")
    assert not [mark for mark in RST if mark in out], out
    assert "  --config=VALUE  (required)\n" in out and "  --workdir=VALUE  (required)\n" in out
    configs = sorted(p.name for p in (REPO / "configs").glob("*.py"))
    assert len(configs) >= 6 and all(f"\n  {name}\n" in out for name in configs), out
    simclr = re.split(r"\n  (?=\S)", out.partition("\n  simclr_mnist1d.py\n")[2])[0]
    assert simclr.startswith("      SimCLR on MNIST-1D"), simclr
    variants = " ".join(simclr.partition("variants (defaults): ")[2].split())
    assert variants == ("batch=128, epochs=20.0, temperature=0.2, learn_temperature=False, "
                        "strategy='', seed=0, quick=False")


def test_config_variants_are_read_without_running_the_config(tmp_path):
    (tmp_path / "a.py").write_text(
        '"""A config that exits when run.\n\nMore."""\nraise SystemExit(3)\n\n'
        "def get_config(arg=None):\n    v = parse(arg, size=(1, 2), name='x', quick=False)\n")
    (tmp_path / "b.py").write_text("def get_config(arg=None):\n    return {}\n")
    (tmp_path / "c.py").write_text("X = 1\n")
    (tmp_path / "d.py").write_text("def get_config(:\n")
    assert command_line.config_variants(tmp_path / "a.py") == ["size=(1, 2)", "name='x'",
                                                               "quick=False"]
    assert command_line.config_variants(tmp_path / "b.py") == []
    assert command_line.config_variants(tmp_path / "c.py") is None
    text = command_line.config_files_help(tmp_path)
    assert "\n  a.py\n      A config that exits when run.\n      variants (defaults): size=(1, "\
           "2), name='x', quick=False\n" in text
    assert "\n  b.py\n      variants (defaults): none\n" in text
    assert "\n  c.py\n      variants (defaults): no get_config" in text
    assert "\n  d.py: cannot be read (SyntaxError: " in text
    missing = command_line.config_files_help(tmp_path / "configs")
    assert missing.startswith(f"config files: none in {tmp_path / 'configs'} ")


def test_plain_text_drops_rst_markup():
    doc = """Title with ``code`` and :func:`~a.b.convert`, :mod:`a.b`, :class:`T <a.T>`.

    Command line (see :class:`contrastive_jax.errors.
    ConfigError`)::

        python -m x --flag=1

    **Bold** and `interpreted`, a block ::

        code
    """
    assert command_line.plain_text(doc) == (
        "Title with code and convert, a.b, T.\n\n"
        "Command line (see contrastive_jax.errors.ConfigError):\n\n"
        "    python -m x --flag=1\n\n"
        "Bold and interpreted, a block\n\n"
        "    code")


@pytest.mark.parametrize("name", CONVERTED)
def test_an_unknown_flag_exits_2_with_one_line(name, capsys):
    module = importlib.import_module(name)
    assert module.main(["--no_such_flag=1"]) == 2
    assert capsys.readouterr().err == (f"error: unknown flag --no_such_flag (`python -m {name} "
                                       "--help` lists the flags)\n")


def test_bad_values_missing_flags_and_stray_arguments_exit_2_with_one_line(capsys):
    from contrastive_jax import demo
    from contrastive_jax.training.data import build_tokenizer, convert_shards
    from contrastive_jax.training.data.prepare import main as prepare_main
    from contrastive_jax.training.models.converters import clip_import

    cases = [
        (convert_shards.main, ["--inptu=x"],
         "error: unknown flag --inptu; did you mean --input? (`python -m "
         "contrastive_jax.training.data.convert_shards --help` lists the flags)"),
        (demo.main, ["--batch=abc"],
         "error: flag --batch=abc: invalid literal for int() with base 10: 'abc'"),
        (build_tokenizer.main, ["--model_type=wordpiece", "--dataset=d", "--output=o"],
         "error: flag --model_type=wordpiece: value should be one of <unigram|bpe>"),
        (build_tokenizer.main, ["--split=test"],
         "error: --dataset and --output are required (`python -m "
         "contrastive_jax.training.data.build_tokenizer --help` lists the flags)"),
        (clip_import.main, ["--checkpoint=c", "--output=o", "stray"],
         "error: unexpected arguments ['stray']: python -m contrastive_jax.training.models."
         "converters.clip_import takes flags only (`--help` lists them)"),
        (prepare_main, ["--mock", "imagenet"], "error: no mock of 'imagenet'; mocks: "
                                               "['coco_captions']"),
        (demo.main, ["--jax_log_compiles=maybe"],
         "error: flag --jax_log_compiles=maybe: ('Non-boolean argument to boolean flag', "
         "'maybe')"),
        (demo.main, ["--jax_no_such_option=1"],
         "error: unknown JAX option --jax_no_such_option (`--helpfull` lists JAX's options)"),
    ]
    for main, argv, message in cases:
        assert main(argv) == 2, argv
        assert capsys.readouterr().err == message + "\n", argv


def test_jax_flags_are_set_before_the_command_runs_and_own_flags_start_from_defaults(
        capsys, monkeypatch):
    """``--jax_*`` (``=VALUE``, a separate value, ``--nojax_*``) set JAX's options before the
    command's main runs and leave its other arguments; a command's own flags start from their
    defaults on every call."""
    own = flags.FlagValues()
    size = flags.DEFINE_integer("size", 1, "a size", flag_values=own)
    command = command_line.Command(program="python -m toy", doc="A toy.", flag_values=own,
                                   positional="[NAME ...]")
    seen = []

    def main(positional):
        seen.append((positional, size.value, jax.config.jax_log_compiles,
                     jax.config.jax_default_matmul_precision))
        return 7

    before = (jax.config.jax_log_compiles, jax.config.jax_default_matmul_precision)
    try:
        assert command_line.run_command(command, main, [
            "a", "--jax_log_compiles", "--size=5", "--jax_default_matmul_precision", "highest",
            "b", "--", "--jax_enable_x64"]) == 7
        assert seen[-1] == (["a", "b", "--jax_enable_x64"], 5, True, "highest")
        assert not jax.config.jax_enable_x64  # after "--": an argument, not a flag
        assert command_line.run_command(command, main, ["--nojax_log_compiles"]) == 7
        assert seen[-1] == ([], 1, False, "highest")  # --size back to its default
    finally:
        jax.config.update("jax_log_compiles", before[0])
        jax.config.update("jax_default_matmul_precision", before[1])
    # a JAX flag through a real command: accepted, and the command runs on to its own error
    from contrastive_jax.training.data import convert_shards

    assert convert_shards.main(["--jax_log_compiles=false", "--input=/nonexistent/{0..1}.tar",
                                "--name=n"]) == 2
    assert capsys.readouterr().err == ("error: --input '/nonexistent/{0..1}.tar': "
                                       "'/nonexistent/0.tar' matches no file\n")
    monkeypatch.setenv(command_line.TRACEBACK_ENV, "1")  # the traceback, for a user error
    with pytest.raises(command_line.ConfigError, match="unknown flag --no_such_flag"):
        command_line.run_command(command, main, ["--no_such_flag"])
