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


def _readme() -> str:
    return (ROOT / "README.md").read_text()


def test_readme_is_a_front_page_of_at_most_150_lines():
    assert len(_readme().splitlines()) <= 150


def test_readme_loss_snippet_runs():
    """The code of "The losses", as written: a finite loss and a gradient for each input."""
    section = _readme().split("## The losses", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope: dict = {}
    exec(code, scope)
    loss, grads = scope["loss"], scope["grads"]
    assert jax.numpy.isfinite(loss) and len(grads) == 3
    assert grads[0].shape == (4096, 512) and grads[2].shape == ()


def _commands(text: str, program: str) -> list[list[str]]:
    """The arguments of every ``python -m PROGRAM ...`` command of ``text`` (continuation
    lines joined)."""
    joined = text.replace("\\\n", " ")
    return [line.split(f"python -m {program}", 1)[1].split()
            for line in joined.splitlines() if f"python -m {program} " in line]


def test_readme_commands_name_real_configs_and_settings():
    """Every trainer and plan command of the README loads its config, applies its overrides,
    and builds its method and model (shapes only); the plan's slice is a real one. (The runs
    themselves are other tests': the main job, the SigLIP quick run, the plan of a slice.)"""
    import ast as python_ast

    from flax import nnx
    from test_train import load_config

    from contrastive_jax.accelerators import tpu_slice
    from contrastive_jax.training.methods import method_for
    from contrastive_jax.training.models import build_model

    commands = _commands(_readme(), "contrastive_jax.main") + \
        _commands(_readme(), "contrastive_jax.plan")
    assert len(commands) >= 3, commands
    for args in commands:
        spec = next(a for a in args if a.startswith("--config=")).split("=", 1)[1]
        config = load_config(spec.removeprefix("configs/"))
        for arg in args:
            if arg.startswith("--config."):
                key, value = arg[len("--config."):].split("=", 1)
                *parents, leaf = key.split(".")
                node = config
                for part in parents:
                    node = node[part]
                node[leaf] = python_ast.literal_eval(value)
            elif arg.startswith("--slice="):
                assert tpu_slice(arg.split("=", 1)[1]).chips > 0
        method_for(config)
        nnx.eval_shape(lambda config=config: build_model(
            {k: v for k, v in config.model.to_dict().items()
             if k not in ("frozen", "init_from")}, nnx.Rngs(0)))
