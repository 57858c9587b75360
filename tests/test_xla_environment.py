"""The suite's XLA flags (tests/xla_environment.py): added unless set, dropped if unknown."""

import os

import xla_environment
from xla_environment import SUITE_XLA_FLAGS, add_suite_xla_flags, child_environment


def test_the_suite_runs_with_its_flags_and_a_user_setting_wins(monkeypatch):
    names = [flag.split("=")[0] for flag in SUITE_XLA_FLAGS]
    assert all(name in os.environ["XLA_FLAGS"] for name in names)  # this process has them
    # a user's setting is kept; an unknown flag (a newer jaxlib may drop one: XLA aborts on
    # flags it does not know) is left out rather than stopping the suite
    monkeypatch.setattr(xla_environment, "SUITE_XLA_FLAGS",
                        (*SUITE_XLA_FLAGS, "--xla_no_such_flag_in_any_xla=1"))
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=2")
    add_suite_xla_flags()
    assert os.environ["XLA_FLAGS"].split() == ["--xla_backend_optimization_level=2",
                                               *SUITE_XLA_FLAGS[1:]]


def test_child_environment_has_one_device_unless_asked_and_the_suite_flags(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                                    + " ".join(SUITE_XLA_FLAGS) + " --xla_dump_to=/d")
    assert child_environment()["XLA_FLAGS"].split() == [*SUITE_XLA_FLAGS, "--xla_dump_to=/d"]
    assert child_environment(devices=2)["XLA_FLAGS"].split() == [
        *SUITE_XLA_FLAGS, "--xla_dump_to=/d", "--xla_force_host_platform_device_count=2"]
    assert child_environment(xla_defaults=True)["XLA_FLAGS"] == "--xla_dump_to=/d"
