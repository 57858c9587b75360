"""A workdir written by an earlier release resumes: checkpoints outlive a change of layout.

``fixtures/workdir_v0_2_moco`` holds step 2 of a 4-step MoCo run (``config.json`` and
``checkpoints/2``: parameters, AdamW moments, BatchNorm statistics, the key encoder, the queue,
the data iterator) written before the package was rearranged into its current folders
(``expected.json`` says which commit and command). Resumed by today's command line, the run
must end with the same parameters, bit for bit, as the uninterrupted run did then. XLA:CPU
compiles for the host's vector instructions, so the digest depends on the kind of host (AVX-512
as the fixture's AMD EPYC, none, or AVX-512 FP16 as an Intel Sapphire Rapids); ``expected.json``
records each and how it was obtained.

The same run, compiled as a user's run is, also shows that the command line fills its
persistent compilation cache (the suite's XLA flags bring the train step under the cache's
one-second threshold: tests/xla_environment.py).
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

from xla_environment import child_environment

FIXTURE = pathlib.Path(__file__).resolve().parent / "fixtures" / "workdir_v0_2_moco"
REPO = pathlib.Path(__file__).resolve().parents[1]


def test_a_workdir_from_the_previous_layout_resumes_bit_identical(tmp_path):
    expected = json.loads((FIXTURE / "expected.json").read_text())
    workdir = tmp_path / "run"
    shutil.copytree(FIXTURE, workdir, ignore=shutil.ignore_patterns("expected.json"))
    command = [sys.executable, "-m", "contrastive_jax.main",
               "--config=configs/moco_mnist1d.py:quick", f"--workdir={workdir}",
               "--config.total_steps=4", "--config.checkpoint_every=2",
               "--config.evaluation.enabled=False"]
    env = {**child_environment(xla_defaults=True),  # one device and default flags, as written
           "CONTRASTIVE_JAX_COMPILATION_CACHE": str(tmp_path / "cache")}  # its own, empty
    out = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "resumed from step 2" in out.stdout + out.stderr
    results = json.loads((workdir / "results.json").read_text())
    assert results["resumed_from"] == 2 and results["steps"] == expected["steps"]
    assert results["params_sha256"] == expected["params_sha256_by_host"][_host_kind()]
    assert os.listdir(tmp_path / "cache")  # the train step took over a second to compile


def _host_kind() -> str:
    """``avx512_fp16``, ``avx512`` or ``no_avx512``: the vector instructions of this host's CPU
    (Linux's /proc/cpuinfo flags) that change how XLA:CPU rounds the run."""
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    flags = cpuinfo.read_text() if cpuinfo.exists() else ""
    if " avx512_fp16" in flags:
        return "avx512_fp16"
    return "avx512" if " avx512f" in flags else "no_avx512"
