"""The package's command lines share one library (contrastive_jax/command_line.py, with
command_help.py and interrupts.py): plain-text ``--help`` with exit status 0, JAX's ``--jax_*``
options as flags, one line ``error: ...`` and exit status 2 for a bad flag, one line
``interrupted (SIGINT) ...`` and exit status 130 for Ctrl-C; every command module imports with
the others in one process.

In-process, except one ``python -m contrastive_jax.main --help`` (the real entry point); main's
errors and its ``--jax_*`` flags are checked by tests/test_reliability.py's forked command lines
(USER_ERRORS), prepare's ``-m`` import by tests/test_datasets.py."""

import importlib
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import forked_command_lines
import jax
import pytest
from absl import flags

from contrastive_jax import command_help, command_line, interrupts

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
    names = [set(command_help.defined_flags(f)) for f in own]
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
    for flag in command_help.defined_flags(module.FLAGS):
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
    assert command_help.config_variants(tmp_path / "a.py") == ["size=(1, 2)", "name='x'",
                                                               "quick=False"]
    assert command_help.config_variants(tmp_path / "b.py") == []
    assert command_help.config_variants(tmp_path / "c.py") is None
    text = command_help.config_files_help(tmp_path)
    assert "\n  a.py\n      A config that exits when run.\n      variants (defaults): size=(1, "\
           "2), name='x', quick=False\n" in text
    assert "\n  b.py\n      variants (defaults): none\n" in text
    assert "\n  c.py\n      variants (defaults): no get_config" in text
    assert "\n  d.py: cannot be read (SyntaxError: " in text
    missing = command_help.config_files_help(tmp_path / "configs")
    assert missing.startswith(f"config files: none in {tmp_path / 'configs'} ")


def test_plain_text_drops_rst_markup():
    doc = """Title with ``code`` and :func:`~a.b.convert`, :mod:`a.b`, :class:`T <a.T>`.

    Command line (see :class:`contrastive_jax.errors.
    ConfigError`)::

        python -m x --flag=1

    **Bold** and `interpreted`, a block ::

        code
    """
    assert command_help.plain_text(doc) == (
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
                                               "['coco_captions', 'imagenet2012']"),
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
                                       "'/nonexistent/0.tar' matches no file (and 1 more "
                                       "of its 2 names)\n")
    monkeypatch.setenv(command_line.TRACEBACK_ENV, "1")  # the traceback, for a user error
    with pytest.raises(command_line.ConfigError, match="unknown flag --no_such_flag"):
        command_line.run_command(command, main, ["--no_such_flag"])


# --------------------------------------------------------------------------- Ctrl-C (SIGINT)
def _toy_command() -> command_line.Command:
    return command_line.Command(program="python -m toy", doc="A toy.",
                                flag_values=flags.FlagValues())


def _wakeup_fd() -> int:
    """The current ``signal.set_wakeup_fd``, left as it is."""
    fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(fd)
    return fd


@pytest.fixture
def exits(monkeypatch):
    """The statuses the watcher would end the process with, in a queue (the process goes on)."""
    statuses = queue.Queue()
    monkeypatch.setattr(interrupts, "_exit_process", statuses.put)
    # run_command installs the handler only in the main thread (where pytest runs tests)
    assert threading.current_thread() is threading.main_thread()
    return statuses


def test_ctrl_c_ends_a_command_at_once_with_one_line_and_status_130(exits, capsys):
    """While the command's main thread is blocked outside Python (a lock here; XLA's compile
    in the plan), a SIGINT makes the watcher print one line naming the innermost activity and
    end the process with 130. No KeyboardInterrupt reaches the command. The handler and the
    wakeup fd are restored when the command returns."""
    before = _wakeup_fd()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

    def main(positional):
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
        with interrupts.activity("counting sheep"), interrupts.activity("sheep 7"):
            signal.raise_signal(signal.SIGINT)  # Python's handler does nothing
            assert exits.get(timeout=60) == 130  # blocked in C until the watcher "exits"
        return 0

    assert command_line.run_command(_toy_command(), main, []) == 0
    assert capsys.readouterr().err == ("interrupted (SIGINT) while sheep 7: nothing more was "
                                       "written\n")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert _wakeup_fd() == before and exits.empty()

    def no_activity(positional):
        signal.raise_signal(signal.SIGINT)
        return exits.get(timeout=60)

    assert command_line.run_command(_toy_command(), no_activity, []) == 130
    assert capsys.readouterr().err == ("interrupted (SIGINT) while running python -m toy: "
                                       "nothing more was written\n")


def test_ctrl_c_lets_a_file_write_finish_and_a_second_one_does_not_wait(exits, capsys):
    """The exit waits for a finish_before_interrupt block (a file being written and renamed);
    a second SIGINT exits inside the block."""
    events = []

    def main(positional):
        guard = interrupts._active
        with interrupts.finish_before_interrupt():
            signal.raise_signal(signal.SIGINT)
            assert guard.requested.wait(60)  # the watcher has seen it and waits for the block
            events.append("block done")
        events.append(("exit", exits.get(timeout=60)))
        return 0

    assert command_line.run_command(_toy_command(), main, []) == 0
    assert events == ["block done", ("exit", 130)]

    def twice(positional):
        with interrupts.finish_before_interrupt():
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
            events.append(("exit in the block", exits.get(timeout=60)))
        return 0

    assert command_line.run_command(_toy_command(), twice, []) == 0
    assert events[-1] == ("exit in the block", 130)
    assert capsys.readouterr().err.count("interrupted (SIGINT)") == 2


def test_a_keyboard_interrupt_that_reaches_run_command_is_one_line_and_130(capsys, monkeypatch):
    """Where no handler can be installed (a command run in another thread), the
    KeyboardInterrupt itself becomes the line, naming the activity it left;
    CONTRASTIVE_JAX_TRACEBACK=1 lets it raise."""
    def main(positional):
        with interrupts.activity("waiting"):
            raise KeyboardInterrupt

    handler = signal.getsignal(signal.SIGINT)
    statuses = []
    thread = threading.Thread(target=lambda: statuses.append(
        command_line.run_command(_toy_command(), main, [])))
    thread.start()
    thread.join()
    assert statuses == [130] and signal.getsignal(signal.SIGINT) is handler
    assert capsys.readouterr().err == ("interrupted (SIGINT) while waiting: nothing more was "
                                       "written\n")
    monkeypatch.setenv(command_line.TRACEBACK_ENV, "1")
    with pytest.raises(KeyboardInterrupt):
        command_line.run_command(_toy_command(), main, [])


FORKED_CHILD = """
import os, signal, sys
from absl import flags
from contrastive_jax import command_line

parent = os.getpid()

def main(positional):
    pid = os.fork()
    if pid == 0:  # the child: Python's default, a KeyboardInterrupt, so run_command's line
        signal.raise_signal(signal.SIGINT)
        raise AssertionError("no KeyboardInterrupt in the child")
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    print("child status", status, flush=True)  # the parent's watcher did not fire
    return 0

status = command_line.run_command(command_line.Command(
    program="python -m toy", doc="A toy.", flag_values=flags.FlagValues()), main, [])
if os.getpid() != parent:
    os._exit(status)
print("parent status", status, signal.getsignal(signal.SIGINT) is signal.default_int_handler)
"""


def test_a_process_forked_by_a_command_gets_the_keyboard_interrupt_not_the_watcher():
    """A fork during a command (the supervised trainer, a data worker) has no watcher: its
    SIGINT is a KeyboardInterrupt (one line and 130 where it reaches run_command), and its
    signal never reaches the parent's watcher, which shares the pipe."""
    run = forked_command_lines.run([sys.executable, "-c", FORKED_CHILD], timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.splitlines() == ["child status 130", "parent status 0 True"], run.stdout
    assert run.stderr == ("interrupted (SIGINT) while running python -m toy: nothing more was "
                          "written\n")
