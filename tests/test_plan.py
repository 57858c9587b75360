"""The memory plan (python -m contrastive_jax.plan): exact state bytes, a clear error."""

import dataclasses
import io
import os
import pathlib
import signal
import subprocess
import sys

import forked_command_lines
import pytest
from test_train import REPO, load_config

from contrastive_jax.accelerators import GiB, tpu_slice
from contrastive_jax.errors import ConfigError
from contrastive_jax.mesh import make_mesh
from contrastive_jax.plan import (
    CHIPS,
    HEADROOM,
    Plan,
    Speed,
    compiling,
    example_shapes,
    plan,
    planned,
    report,
    target_report,
)
from contrastive_jax.plan.search import divisors, find_fit, paste, with_overrides


def block_params(w: int, r: int) -> int:
    """A pre-LN Transformer block: two LayerNorms, q/k/v/out projections, the MLP."""
    return 2 * 2 * w + 4 * (w * w + w) + (w * r * w + r * w) + (r * w * w + w)


def dual_encoder_params(model) -> int:
    """The parameter count of the pod template's dual encoder, from its config alone."""
    v, t = model.sample_encoder, model.text_encoder
    w, p = v.width, v.patch
    vit = (p * p * v.in_channels * w + w + (v.image_size // p) ** 2 * w
           + v.depth * block_params(w, v.mlp_ratio) + 2 * w + w * v.features + v.features)
    u = t.width
    text = (t.vocab_size * u + t.max_tokens * u + t.depth * block_params(u, t.mlp_ratio)
            + 2 * u + u * t.features + t.features)
    return vit + text + (v.features + t.features) * model.embed_dim + 1  # + log-scale


def test_plan_counts_the_parameters_exactly_replicated_and_fsdp():
    """Parameter bytes per device: 4 x the analytic count replicated; under FSDP with every
    leaf split (widths divisible by 8) an eighth of it, plus the scalar log-scale whole.
    Optimiser state is AdamW's two moments (+ its counters), the batch the rows of one
    device."""
    config = load_config("clip_vit_b16_pod.py:tiny")
    assert config.sharding.params == "fsdp"  # the template's setting
    config.sharding.params = "replicated"
    mesh = make_mesh({"data": 8})
    count = dual_encoder_params(config.model)
    replicated = plan(planned(config, mesh))
    assert replicated.params == 4 * count
    assert 2 * 4 * count <= replicated.opt_state <= 2 * 4 * count + 64
    size = config.model.sample_encoder.image_size
    rows = config.data.batch_size // 8
    # uint8 images (the host sends uint8), int32 tokens
    assert replicated.batch == rows * (size * size * 3 + config.model.text_encoder.max_tokens * 4)
    assert replicated.temporaries > 0 and replicated.total > replicated.params
    config.sharding.params = "fsdp"  # tiny: min_size 0, every leaf split
    fsdp = plan(planned(config, mesh))
    assert fsdp.params == 4 * ((count - 1) // 8 + 1)
    assert fsdp.opt_state <= replicated.opt_state / 8 + 64
    assert fsdp.arguments < replicated.arguments
    text = report(fsdp, "tiny")
    assert "fits" in text and all(chip in text for chip in CHIPS)


def test_plan_refuses_a_batch_that_does_not_divide():
    config = load_config("clip_vit_b16_pod.py:tiny")
    config.data.batch_size = 12
    with pytest.raises(ConfigError, match="does not divide by the 8"):
        plan(planned(config, make_mesh({"data": 8})))


def test_plan_command_line_says_what_to_change():
    """The command on a config that cannot be compiled: exit 2, one ``error:`` line."""
    result = forked_command_lines.run(
        [sys.executable, "-m", "contrastive_jax.plan", "--devices=8",
         f"--config={REPO / 'configs' / 'clip_vit_b16_pod.py'}:tiny",
         "--config.data.batch_size=12"], timeout=300,
        cwd=REPO)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "multiple of 8" in errors[0], result.stderr[-2000:]


def test_example_shapes_follow_the_model():
    config = load_config("clip_vit_b16_pod.py")
    # image_text preprocessing: the host sends uint8 images, the device normalises them
    assert example_shapes(config) == {"image": ((224, 224, 3), "uint8"),
                                      "caption": ((32,), "int32")}
    simclr = load_config("simclr_mnist1d.py")
    shapes = example_shapes(simclr)
    assert shapes[simclr.input_key][0] == (simclr.model.encoder.length, 1)


def modelled_plan(fixed: float, per_example: float, remat_factor: float = 1.0,
                  fsdp_saves: float = 0.0):
    """A stand-in for :func:`plan`: ``fixed + per_example * micro-batch`` bytes per device,
    ``fsdp_saves`` fewer with FSDP parameters, the per-example part times ``remat_factor``
    with remat. Records what it was asked to compile."""
    asked = []

    def compile_plan(config, mesh):
        k = config.accumulation_steps
        asked.append((k, config.sharding.params, bool(config.model.get("remat"))))
        per_device = config.data.batch_size // 8
        part = per_example * per_device / k * (remat_factor if config.model.get("remat") else 1)
        state = fixed - (fsdp_saves if config.sharding.params == "fsdp" else 0)
        return Plan(8, config.data.batch_size, k, 0, 0, 0, 0, temporaries=int(part),
                    arguments=int(state), outputs_not_aliased=0, compile_s=1.0)
    return compile_plan, asked


def test_the_search_finds_the_smallest_accumulation_that_fits_in_few_compiles():
    config = load_config("clip_vit_b16_pod.py:tiny")
    config.data.batch_size = 8 * 64  # 64 per device: divisors 1, 2, 4, ..., 64
    config.sharding.params, config.model.remat = "fsdp", True  # nothing else to add
    compile_plan, asked = modelled_plan(fixed=10 * GiB, per_example=1 * GiB)
    first = compile_plan(config, None)
    # 10 + 64 / K GiB <= 0.9 * 32 = 28.8 first at K = 4 (26 GiB; K = 2 needs 42)
    budget = int(HEADROOM * 32 * GiB)
    found = find_fit(config, None, budget, first, compile_plan)
    assert found.answer == {"accumulation_steps": 4}
    # predicted from the first plan (temporaries / K), checked, and the divisor below checked
    assert [o["accumulation_steps"] for o, _ in found.tried] == [4, 2]
    assert {o["accumulation_steps"]: r.total <= budget for o, r in found.tried} == {
        4: True, 2: False}
    assert paste(found.answer) == "--config.accumulation_steps=4"
    assert divisors(12) == [1, 2, 3, 4, 6, 12]
    assert len(asked) == 3  # the first plan and two candidates, of six
    # a prediction too small walks up: `first` (1 GiB per example) predicts K = 4, where this
    # model (1.4 GiB per example) needs 10 + 89.6 / 4 = 32.4 GiB, and 21.2 GiB at K = 8
    compile_plan, _ = modelled_plan(fixed=10 * GiB, per_example=1.4 * GiB)
    found = find_fit(config, None, budget, first, compile_plan)  # predicts K = 4 from `first`
    assert [o["accumulation_steps"] for o, _ in found.tried] == [4, 8]
    assert found.answer == {"accumulation_steps": 8}


def test_the_search_adds_fsdp_then_remat_only_when_accumulation_cannot_fit():
    config = load_config("clip_vit_b16_pod.py:tiny")
    config.data.batch_size = 8 * 4
    config.sharding.params, config.model.remat = "replicated", False
    # the state alone (40 GiB replicated) never fits 28.8 GiB; FSDP saves 35 GiB; each example
    # needs 30 GiB without remat, 6 with it: FSDP + remat at K = 1 needs 5 + 24 = 29 > 28.8,
    # at K = 2: 5 + 12 = 17
    compile_plan, _ = modelled_plan(fixed=40 * GiB, per_example=30 * GiB, remat_factor=0.2,
                                    fsdp_saves=35 * GiB)
    first = compile_plan(config, None)
    found = find_fit(config, None, int(HEADROOM * 32 * GiB), first, compile_plan)
    assert found.answer == {"sharding.params": "fsdp", "model.remat": True,
                            "accumulation_steps": 2}
    kinds = {tuple(sorted(k for k in o if k != "accumulation_steps")) for o, _ in found.tried}
    assert kinds == {(), ("sharding.params",), ("model.remat", "sharding.params")}
    tiny = next(r for o, r in found.tried if o == found.answer)
    text = target_report(first, "tiny", tpu_slice("v4-16"), found, None)
    assert "does NOT fit" in text and "needs FSDP and remat" in text
    assert ("--config.sharding.params=fsdp --config.model.remat=True "
            "--config.accumulation_steps=2") in text
    assert tiny.total <= HEADROOM * 32 * GiB
    # nothing fits: no answer
    compile_plan, _ = modelled_plan(fixed=40 * GiB, per_example=30 * GiB)
    assert find_fit(config, None, 10 * GiB, compile_plan(config, None), compile_plan).answer \
        is None


def test_with_overrides_copies_and_may_add_remat():
    config = load_config("simclr_mnist1d.py:quick")
    copy = with_overrides(config, {"accumulation_steps": 2, "model.remat": True,
                                   "sharding.params": "fsdp"})
    assert (copy.accumulation_steps, copy.model.remat, copy.sharding.params) == (2, True, "fsdp")
    assert config.accumulation_steps == 1 and not config.model.get("remat")  # unchanged
    # remat given as a policy or one entry per tower (--config.model.remat=...): the search's
    # True replaces it (a bool over a string raised a TypeError)
    for remat in ("dots_saveable", {"sample_encoder": "dots_saveable"}):
        template = load_config("clip_vit_b16_pod.py:tiny")
        template.model.remat = remat
        kept = template.model.remat
        assert with_overrides(template, {"model.remat": True}).model.remat is True
        assert template.model.remat is kept  # unchanged


def test_the_status_line_says_what_compiles_and_when_it_is_done():
    stream = io.StringIO()
    with compiling("the train step for 8 devices", stream, every=3600):
        pass
    lines = stream.getvalue().splitlines()
    assert lines[0] == "plan: compiling the train step for 8 devices ..."
    assert lines[-1].startswith("plan: compiled the train step for 8 devices in ")


def test_speed_divides_the_flops_by_the_stated_share_of_the_peak():
    p = Plan(128, 32768, 1, 0, 0, 0, 0, 0, 0, 0, 1.0, flops=2.0e13)
    target = tpu_slice("v4-256")  # 128 chips, 32 hosts, 275 TFLOP/s
    speed = Speed.of(p, p.flops, target, 0.4, images=True)
    assert speed.step_s == pytest.approx(2.0e13 / (0.4 * 275e12))
    assert speed.examples_per_s_per_host == pytest.approx(32768 / speed.step_s / 32)
    assert speed.host_cores == pytest.approx(speed.examples_per_s_per_host / 211.6)
    text = target_report(p, "pod", target, None, speed)
    assert "TPU v4 v4-256 (128 chips on 32 hosts, 32.00 GiB each)" in text
    assert "20.00 TFLOP" in text and "per host" in text
    assert Speed.of(p, p.flops, dataclasses.replace(target, peak_flops=None), 0.4,
                    images=True).step_s is None


def test_a_real_search_on_the_tiny_template_compiles_to_a_fit():
    """Real compiles: against a memory just below the tiny template's need at its own
    accumulation, the search answers a larger accumulation whose compiled plan fits, and
    the divisor below it (also compiled) does not."""
    config = load_config("clip_vit_b16_pod.py:tiny")
    config.data.batch_size = 8 * 16  # 16 per device: divisors 1, 2, 4, 8, 16
    mesh = make_mesh({"data": 8})
    first = plan(planned(config, mesh))
    assert first.flops and first.flops > 0
    budget = first.total - 1
    found = find_fit(config, mesh, budget, first, lambda c, m: plan(planned(c, m)))
    assert found.answer is not None and found.answer["accumulation_steps"] > 1
    totals = {o["accumulation_steps"]: r.total for o, r in found.tried if len(o) == 1}
    k = found.answer["accumulation_steps"]
    assert totals[k] <= budget
    below = [d for d in divisors(config.data.batch_size // 8) if d < k]
    assert below[-1] == 1 or totals.get(below[-1], budget + 1) > budget


def test_plan_for_a_slice_prints_chips_hosts_verdict_and_speed(tmp_path):
    """``--slice=v4-16`` is 8 chips on 2 hosts: the tiny template fits, with its model FLOPs
    per chip (also in the JSON), a step time at the stated utilisation, the examples each
    host must deliver and the host cores an image input takes, and, since it has remat, the
    plan without it (fits) and what the recomputation costs; a status line on stderr."""
    out = tmp_path / "plan.json"
    result = forked_command_lines.run(
        [sys.executable, "-m", "contrastive_jax.plan", "--slice=v4-16", "--mfu=0.5",
         "--compiler=cpu",  # XLA:CPU's plan (the TPU compiler's: tests/test_plan_tpu.py)
         f"--config={REPO / 'configs' / 'clip_vit_b16_pod.py'}:tiny", f"--json={out}"],
        timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    text = result.stdout
    assert "on TPU v4 v4-16 (8 chips on 2 hosts, 32.00 GiB each)" in text
    assert "  fits: " in text and "speed at 50% model-FLOPs utilisation" in text
    assert "plan: compiling the train step for 8 devices" in result.stderr
    record = __import__("json").loads(out.read_text())
    assert record["target"]["chips"] == 8 and record["fits_target"] is True
    assert record["provenance"]["device_count"] == 8  # the plan's fake devices
    speed, remat = record["speed"], record["remat"]
    # model FLOPs (no remat, no scan) per chip; the compiled program's own count has the
    # scanned blocks once and remat's recomputation
    assert speed["flops_per_chip"] == remat["model_flops_per_chip"] > 0
    assert speed["step_s"] == pytest.approx(speed["flops_per_chip"] / (0.5 * 275e12))
    assert remat["flops_with_remat_per_chip"] > 1.05 * remat["model_flops_per_chip"]
    assert remat["fits_without"] is True  # the tiny template fits a v4 chip without remat
    assert 0 < remat["total_without"] and "it fits without remat too" in text
    assert "remat's recomputation:" in text
    assert speed["examples_per_s_per_host"] == pytest.approx(16 / speed["step_s"] / 2)
    assert speed["host_cores"] == pytest.approx(speed["examples_per_s_per_host"] / 211.6)


@pytest.mark.parametrize("flag, message", [
    ("--slice=v4-12", "TPU v4 slices are named by their TensorCores"),
    ("--gpus=8x8", "gives no memory per GPU"),
])
def test_a_bad_target_exits_2_with_one_line(flag, message):
    result = forked_command_lines.run(
        [sys.executable, "-m", "contrastive_jax.plan", flag,
         f"--config={REPO / 'configs' / 'clip_vit_b16_pod.py'}:tiny"], timeout=300, cwd=REPO)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], result.stderr[-2000:]


def test_the_host_core_rate_is_the_measured_one():
    """IMAGES_PER_CORE_SECOND is the best images per CPU-second of the committed image input
    benchmark (the column ``images/s per core``), so the plan's host cores follow the table."""
    from contrastive_jax.plan import IMAGES_PER_CORE_SECOND

    table = (REPO / "experiments" / "results" / "image_input_bench.md").read_text().splitlines()
    header = next(line for line in table if line.startswith("| pipeline |"))
    column = [c.strip() for c in header.strip("|").split("|")].index("images/s per core")
    rates = [float(line.strip("|").split("|")[column]) for line in table
             if line.startswith("| uint8")]
    assert rates and IMAGES_PER_CORE_SECOND == max(rates)


def test_plan_help_exits_0_with_its_flags_and_the_configs(capsys):
    from contrastive_jax.plan import command as plan_command

    with pytest.raises(SystemExit) as stop:
        plan_command.main(["--help"])
    out = capsys.readouterr().out
    assert stop.value.code == 0
    assert out.startswith("usage: python -m contrastive_jax.plan [flags]")
    assert "  --config=VALUE  (required)\n" in out and "\n  --slice=" in out
    assert "\n  simclr_mnist1d.py\n" in out and "``" not in out


TINY = f"--config={REPO / 'configs' / 'clip_vit_b16_pod.py'}:tiny"


def test_ctrl_c_during_the_compile_exits_130_with_one_line():
    """SIGINT once the plan says it is compiling (a fresh interpreter, as a user's): exit
    status 130 at once, one line naming the compile last on stderr, no traceback, nothing on
    stdout (it used to wait for the compile, print a KeyboardInterrupt traceback and, at
    times, crash in the interpreter's teardown: status 139)."""
    from xla_environment import child_environment

    process = subprocess.Popen([sys.executable, "-m", "contrastive_jax.plan", "--devices=8",
                                TINY], cwd=REPO, env=child_environment(), text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        seen = []
        for line in process.stderr:  # waits on the plan's own output
            seen.append(line)
            if line.startswith("plan: compiling the train step for 8 devices"):
                break
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    err = "".join(seen) + err
    assert process.returncode == 130, err[-2000:]
    assert "Traceback" not in err and out == "", err[-2000:]
    assert err.splitlines()[-1] == (
        "interrupted (SIGINT) while compiling the train step for 8 devices "
        "(accumulation_steps=1, remat, fsdp parameters): nothing more was written"), err


def _takes_files(folder: pathlib.Path) -> bool:
    """Whether a new file can be created in ``folder`` (a probe, removed)."""
    probe = folder / f".probe-{os.getpid()}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    except OSError:
        return False
    probe.unlink()
    return True


def _json_case(case: str, tmp_path) -> tuple[str, str]:
    """(--json value, the words its error must hold) for each kind of unusable path."""
    (tmp_path / "file").write_text("")
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked").chmod(0o555)
    if case == "a folder":
        return str(tmp_path), "is a folder"
    if case == "under a file":
        return str(tmp_path / "file" / "plan.json"), "file is a file, not a folder"
    if case == "a missing folder":
        return str(tmp_path / "missing" / "plan.json"), "/missing does not exist"
    if case == "a folder that takes no file":  # root writes anywhere a mode forbids, not
        # in sysfs or procfs, which no user can add files to
        candidates = [tmp_path / "locked", pathlib.Path("/sys"), pathlib.Path("/proc")]
        folder = next((f for f in candidates if f.is_dir() and not _takes_files(f)), None)
        assert folder is not None, f"every one of {candidates} took a new file"
        return str(folder / "plan.json"), f"cannot create a file in {folder}"
    return "", "--json is empty"


@pytest.mark.parametrize("case", ["a folder", "under a file", "a missing folder",
                                  "a folder that takes no file", "empty"])
def test_an_unusable_json_path_exits_2_before_anything_compiles(case, tmp_path):
    """The --json path is checked first: one ``error:`` line, status 2, no compile started
    (it used to be a traceback after the whole compile)."""
    path, words = _json_case(case, tmp_path)
    result = forked_command_lines.run(
        [sys.executable, "-m", "contrastive_jax.plan", "--devices=8", TINY, f"--json={path}"],
        timeout=300, cwd=REPO)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --json") and words in lines[0], \
        result.stderr[-2000:]
    assert "plan: compiling" not in result.stderr and result.stdout == ""


REFUSED_WRITE = """
import sys
from absl import flags
from contrastive_jax import command_line
from contrastive_jax.plan.command import write_json

sys.exit(command_line.run_command(command_line.Command(
    program="python -m toy", doc="A toy.", flag_values=flags.FlagValues()),
    lambda positional: write_json(sys.argv[1], {"rows": ["x" * 100] * 100}), []))
"""


def test_a_json_write_the_system_refuses_exits_2_with_one_line(tmp_path):
    """The plan's --json write under a file-size limit (``ulimit -f``, errno EFBIG): one
    ``error:`` line naming the limit, status 2, the old file left as it was and no temporary
    file left behind."""
    path = tmp_path / "plan.json"
    path.write_text("{}\n")
    result = forked_command_lines.run([sys.executable, "-c", REFUSED_WRITE, str(path)],
                                      timeout=120, file_size_limit=4096)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.splitlines() == [
        f"error: --json={path}: the plan could not be written (File too large: a file reached "
        "the file-size limit (`ulimit -f`): raise the limit); the tables above are complete, "
        "and the file was left as it was"], result.stderr
    assert path.read_text() == "{}\n" and sorted(p.name for p in tmp_path.iterdir()) == [
        "plan.json"]
