"""The environment every test relies on, and the promises of the README."""

import pathlib
import re
import subprocess
import sys

import jax

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_eight_cpu_devices():
    assert jax.device_count() == 8
    assert {d.platform for d in jax.devices()} == {"cpu"}


def _quick_start_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1]
    block = re.search(r"```(?:bash|sh)?\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def test_readme_quick_start_has_two_commands_and_ci_runs_the_second():
    commands = _quick_start_commands()
    assert len(commands) == 2, commands
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.startswith(("#", "set ", "cd "))]
    assert ci == [commands[1]]


def test_ruff_is_clean():
    # ruff is part of the test extra (pip install -e '.[test]').
    result = subprocess.run([sys.executable, "-m", "ruff", "check", str(ROOT)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_readme_first_command_runs_the_main_job_config():
    first = _quick_start_commands()[0]
    assert "-m contrastive_jax.main --config=configs/simclr_mnist1d.py --workdir=" in first
    assert (ROOT / "configs" / "simclr_mnist1d.py").is_file()
