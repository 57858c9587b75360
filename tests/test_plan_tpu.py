"""The plan on the TPU's own compiler (libtpu, on this CPU): a slice's topology, the tiled
bytes of its arguments, a refusal read as a figure, the choice of settings; no TPU needed."""

import dataclasses
import json
import sys
from types import SimpleNamespace

import forked_command_lines
import pytest
from test_train import REPO, load_config

from contrastive_jax.accelerators import TPUS, GiB, TpuTopology, tpu_slice, tpu_topology
from contrastive_jax.errors import ConfigError
from contrastive_jax.mesh import make_mesh
from contrastive_jax.plan import plan, planned, tpu_compiler
from contrastive_jax.plan.choice import Candidate, choice_lines, choose, settings_grid

POD = f"--config={REPO / 'configs' / 'clip_vit_b16_pod.py'}"


@pytest.mark.parametrize("name, slices, topology, config, bounds", [
    ("v4-8", 1, "v4:2x2x1", "megacore", (2, 2, 1)),
    ("v4-256", 1, "v4:4x4x8", "megacore", (2, 2, 1)),  # 128 chips, one device each
    ("v5p-128", 2, "v5p:4x4x4", "megacore", (2, 2, 1)),
    ("v5e-1", 1, "v5e:1x1", "default", (1, 1, 1)),
    ("v5litepod-8", 1, "v5e:2x4", "default", (2, 4, 1)),  # one host holds all 8
    ("v5e-256", 1, "v5e:16x16", "default", (2, 2, 1)),
    ("v6e-64", 4, "v6e:8x8", "default", (2, 2, 1)),
])
def test_a_slice_is_the_topology_the_tpu_compiler_names(name, slices, topology, config, bounds):
    target = tpu_slice(name, slices)
    assert tpu_topology(target) == TpuTopology(topology, config, bounds, slices)
    assert target.chips == slices * tpu_slice(name).chips
    assert target.hosts == slices * tpu_slice(name).hosts


def test_every_slice_size_has_a_torus_of_its_chips():
    for key, gen in TPUS.items():
        for size in gen.sizes:
            target = tpu_slice(f"{key}-{size}")
            torus = tpu_topology(target).name.split(":")[1]
            chips = 1
            for side in torus.split("x"):
                chips *= int(side)
            assert chips == target.chips, (key, size, torus)


def test_the_compilers_devices_are_one_per_chip_and_a_bad_topology_says_so():
    """v4-16 is 8 chips: 8 devices (the default chip config would give one per TensorCore);
    two slices of v5e-4 are 8 devices in slice-major order, and the step compiles over them.
    An unknown torus is a ConfigError naming it."""
    v4 = tpu_compiler.topology_devices(tpu_slice("v4-16"))
    assert len(v4) == 8 and {d.platform for d in v4} == {"tpu"}
    two = tpu_compiler.topology_devices(tpu_slice("v5e-4", 2))
    assert len(two) == 8 and [d.slice_index for d in two] == [0] * 4 + [1] * 4
    # the tiny template over both slices (the data axis spans them, slice-major)
    multi = plan(planned(load_config("clip_vit_b16_pod.py:tiny"), make_mesh({"data": -1},
                                                                             devices=two)))
    assert multi.compiler == "TPU" and multi.devices == 8 and multi.refused is None
    assert multi.arguments == multi.laid_out and multi.usable == int(15.75 * GiB)
    with pytest.raises(ConfigError, match="does not know the topology v4:3x5x7"):
        tpu_compiler.devices_of(TpuTopology("v4:3x5x7", "megacore", (2, 2, 1), 1))


def layout(major_to_minor, tiling, sub_byte=0):
    return SimpleNamespace(major_to_minor=major_to_minor, tiling=tiling,
                           sub_byte_element_size_in_bits=sub_byte)


@pytest.mark.parametrize("shape, bits, lay, expected", [
    ((16, 16), 32, layout((0, 1), ((8, 128),)), 16 * 128 * 4),  # minor dim padded to 128
    ((16, 16), 32, layout((1, 0), ((8, 128),)), 16 * 128 * 4),  # transposed: same padding
    ((3, 200), 32, layout((0, 1), ((8, 128),)), 8 * 256 * 4),  # both minor dims padded
    ((5, 3, 200), 16, layout((0, 1, 2), ((8, 128), (2, 1))), 5 * 8 * 256 * 2),
    ((7,), 32, layout((0,), ((128,),)), 128 * 4),  # a vector: one tile of 128
    ((), 32, layout((), ((128,),)), 128 * 4),  # a scalar too
    ((256, 128), 8, layout((0, 1), ((8, 128), (4, 1))), 256 * 128),  # already whole tiles
    ((10,), 32, layout((0,), ()), 40),  # no tiling: the bytes as they are
])
def test_laid_out_bytes_pad_the_minor_dims_to_the_first_tile(shape, bits, lay, expected):
    assert tpu_compiler.laid_out_bytes(shape, bits, lay) == expected


@pytest.mark.parametrize("text, needed, available, whole", [
    ("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space "
     "hbm. Used 52.82G of 30.75G hbm. Exceeded hbm capacity by 22.07G.",
     int(52.82 * GiB), int(30.75 * GiB), True),
    ("jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: HLO temporaries (52.82G) exceeds "
     "available HBM (30.75G)", int(52.82 * GiB), int(30.75 * GiB), False),
    ("RESOURCE_EXHAUSTED: HLO temporaries (512.00M) exceeds available HBM (15.75G)",
     512 * 2**20, int(15.75 * GiB), False),
    ("RESOURCE_EXHAUSTED: something else entirely", None, None, False),
])
def test_a_refusal_for_memory_is_read_as_figures(text, needed, available, whole):
    refused = tpu_compiler.memory_refusal(RuntimeError(text))
    assert (refused.needed, refused.available, refused.whole) == (needed, available, whole)
    assert refused.message.startswith(("RESOURCE_EXHAUSTED", "jax.errors"))


def test_another_error_is_not_a_refusal():
    assert tpu_compiler.memory_refusal(RuntimeError("UNIMPLEMENTED: HLO opt-barrier")) is None


def test_the_roofline_is_sound_only_without_loops():
    cost = tpu_compiler.Cost(flops=2e12, bytes_accessed=3e9, optimal_seconds=-1.0, loops=False)
    assert cost.roofline_s(1e15, 1e12) == pytest.approx(3e-3)  # bandwidth-bound
    assert cost.roofline_s(1e14, 1e12) == pytest.approx(2e-2)  # compute-bound
    looped = tpu_compiler.Cost(2e12, 3e9, None, loops=True)
    assert looped.roofline_s(1e15, 1e12) is None
    assert tpu_compiler.has_loops("  %w = (s32[]) while(%t), condition=%c, body=%b")
    assert not tpu_compiler.has_loops("  %f = f32[8] fusion(%p), kind=kLoop")


def test_the_tpu_compilers_arguments_are_the_state_and_batch_as_laid_out():
    """The tiny template on a v5e-8 (8 chips, one host): the TPU compiler's argument bytes
    equal the state and batch per chip that the plan computes from the shardings, each leaf
    in the tiled layout the compiler chose (the v4's: the command line's test below); the
    state and batch bytes equal XLA:CPU's plan of the same step; the usable memory is the
    compiler's 15.75 GiB of the chip's 16."""
    config = load_config("clip_vit_b16_pod.py:tiny")
    p = plan(planned(config, make_mesh(
        {"data": -1}, devices=tpu_compiler.topology_devices(tpu_slice("v5e-8")))))
    cpu = plan(planned(config, make_mesh({"data": 8})))
    assert p.compiler == "TPU" and cpu.compiler == "XLA:CPU"
    assert p.arguments == p.laid_out
    assert (p.params, p.opt_state, p.other_state, p.batch) == (
        cpu.params, cpu.opt_state, cpu.other_state, cpu.batch)
    state_and_batch = p.params + p.opt_state + p.other_state + p.batch
    assert state_and_batch < p.arguments  # tiles pad the tiny leaves
    assert p.usable == int(15.75 * GiB)
    assert p.generated_code > 0 and p.peak > 0 and p.refused is None
    assert p.total == p.arguments + p.outputs_not_aliased + p.temporaries + p.generated_code
    assert p.cost is not None and p.cost.flops > 0 and p.cost.loops  # scanned towers
    assert p.cost.bytes_accessed > p.arguments  # every argument read at least once


def fake_flops(config):
    remat = config.model.get("remat")
    return 100.0 + {False: 0.0, True: 33.0}.get(remat, 10.0)


def test_the_choice_ranks_by_executed_flops_and_compiles_no_group_above_the_best():
    """Fake compilers: without remat nothing fits at any accumulation; with the policy that
    saves the matmuls, accumulation 4 fits (and FSDP at 2); full remat is never compiled,
    since it executes more FLOPs than the best that fits."""
    config = load_config("clip_vit_b16_pod.py:tiny")
    config.data.batch_size = 16 * 8
    compiled = []

    def total_of(c):
        k, fsdp = c.accumulation_steps, c.sharding.params == "fsdp"
        remat = c.model.remat
        compiled.append((str(remat), k, fsdp))
        if remat is False:
            return SimpleNamespace(total=10**9, temporaries=10**9)
        return SimpleNamespace(total=100 // k + (0 if fsdp else 20), temporaries=100 // k)

    ranked = choose(config, 16, 50, fake_flops, total_of)
    best = ranked.best
    assert best.settings["model.remat"] == "dots_with_no_batch_dims_saveable"
    assert best.settings["sharding.params"] == "fsdp" and best.accumulation == 2
    assert best.overrides["accumulation_steps"] == 2
    assert not any(r == "True" for r, _, _ in compiled)
    # each candidate: the first plan predicts the accumulation, then one compile below it
    # (none for FSDP: 2 is the first divisor above 1); without remat, 1 and then 16 (one
    # example per micro-batch) show that nothing fits
    assert sorted(k for r, k, f in compiled if r == "False") == [1] * 4 + [16] * 4
    assert sorted(k for r, k, f in compiled if r != "False" and not f) == [1, 1, 2, 2, 4, 4]
    assert sorted(k for r, k, f in compiled if r != "False" and f) == [1, 1, 2, 2]
    assert [c.compiled for c in ranked.candidates].count(False) == 4  # remat=True x scan x fsdp
    lines = "\n".join(choice_lines(ranked))
    assert "--config.model.remat=dots_with_no_batch_dims_saveable" in lines
    assert "--config.accumulation_steps=2" in lines and "4 candidates not compiled" in lines
    replicated = next(c for c in ranked.candidates if c.compiled and c.accumulation == 4)
    assert replicated.key() > best.key()


def test_the_grid_has_the_settings_the_config_has():
    config = load_config("clip_vit_b16_pod.py:tiny")
    grid = settings_grid(config, allow_patch_dropout=0.5)
    assert len(grid) == 3 * 2 * 2 * 2  # remat x scan x sharding x patch dropout
    assert {g["model.sample_encoder.patch_dropout"] for g in grid} == {0.0, 0.5}
    assert all(g["model.sample_encoder.scan"] == g["model.text_encoder.scan"] for g in grid)
    simclr = load_config("simclr_mnist1d.py")
    assert len(settings_grid(simclr, allow_patch_dropout=0.5)) == 3 * 2  # no scan, no patches
    assert len(settings_grid(simclr, None, devices=1)) == 3  # one device: no FSDP either
    assert Candidate({}, None).key()[0] == float("inf")


def test_the_choice_does_not_compile_the_config_it_was_given_again():
    """``known``: the plan of the config as given (the command's first compile) stands for the
    candidate with the same settings."""
    config = load_config("simclr_mnist1d.py")  # no remat, replicated, accumulation 1
    compiled = []

    def plan_of(c):
        compiled.append((str(c.model.get("remat", False)), c.accumulation_steps,
                         c.sharding.params))
        return SimpleNamespace(total=10, temporaries=5)

    known = SimpleNamespace(total=10**9, temporaries=10**9)
    ranked = choose(config, 4, 50, fake_flops, plan_of, known=known)
    assert ("False", 1, "replicated") not in compiled and ("False", 4, "replicated") in compiled
    assert ("False", 1, "fsdp") in compiled
    assert ranked.best.overrides == {"model.remat": False, "sharding.params": "fsdp",
                                     "accumulation_steps": 1}


def plan_command(*flags: str, config: str = f"{POD}:tiny", timeout: float = 600):
    return forked_command_lines.run(
        [sys.executable, "-m", "contrastive_jax.plan", config, *flags], timeout=timeout,
        cwd=REPO)


def test_the_plan_on_both_compilers_side_by_side(tmp_path):
    """``--slice=v4-16 --compiler=both``: XLA:CPU's column beside the TPU compiler's, whose
    numbers are the verdict: against the 30.75 GiB the compiler says a v4 chip has, with its
    generated code and peak; the remat check compiled by the TPU compiler too; the JSON holds
    both plans."""
    out = tmp_path / "plan.json"
    result = plan_command("--slice=v4-16", "--compiler=both", f"--json={out}")
    assert result.returncode == 0, result.stderr[-2000:]
    text = result.stdout
    assert "by the TPU compiler (libtpu) on this CPU" in text
    header = next(line for line in text.splitlines() if line.startswith("per device"))
    assert header.split() == ["per", "device", "XLA:CPU", "TPU", "compiler"]
    assert "arguments as laid out (tiles)" in text and "generated code (in HBM)" in text
    assert "  fits: " in text
    assert "30.75 GiB usable of 32.00 GiB (the TPU compiler's figure)" in text
    assert "with the TPU compiler" in result.stderr
    record = json.loads(out.read_text())
    assert record["compiler"] == "TPU" and set(record["compilers"]) == {"XLA:CPU", "TPU"}
    tpu, cpu = record["compilers"]["TPU"], record["compilers"]["XLA:CPU"]
    assert tpu["total"] == record["total"] and tpu["arguments"] == tpu["laid_out"]
    assert cpu["generated_code"] == 0 and cpu["usable"] is None
    assert f"XLA:CPU says {cpu['total'] / 2**20:.2f} MiB (fits; " in text
    assert record["usable_bytes"] == int(30.75 * GiB) == tpu["usable"]
    assert record["fits_target"] is True and record["remat"]["fits_without"] is True
    assert record["roofline_s"] is None and "the step has loops" in text  # scanned towers


LONG_SIGNALS = ("--config.model.encoder.length=40960", "--config.data.batch_size=256")


def test_a_config_too_large_for_a_v5e_chip_does_not_fit_and_the_search_finds_accumulation(
        tmp_path):
    """SimCLR's MNIST-1D config on signals 1024x longer, batch 256, on one v5e chip: the TPU
    compiler's total is over 90% of its 15.75 GiB, so the plan says it does not fit; the
    search compiles accumulation 2 (predicted from the first plan) and it fits. ``--choose``
    then ranks the settings (one chip: remat only) without compiling more: remat executes
    more FLOPs than the fit already found."""
    out = tmp_path / "plan.json"
    result = plan_command("--slice=v5e-1", "--choose", *LONG_SIGNALS, f"--json={out}",
                          config=f"--config={REPO / 'configs' / 'simclr_mnist1d.py'}")
    assert result.returncode == 0, result.stderr[-2000:]
    record = json.loads(out.read_text())
    budget = 0.9 * 15.75 * GiB
    assert record["fits_target"] is False and record["total"] > budget
    assert "  does NOT fit: " in result.stdout
    assert record["search"]["answer"] == {"accumulation_steps": 2}
    assert [t["overrides"] for t in record["search"]["tried"]] == [{"accumulation_steps": 2}]
    assert record["search"]["tried"][0]["total"] <= budget < record["total"]
    assert record["choice"]["best"] == {"model.remat": False, "accumulation_steps": 2}
    compiles = result.stderr.count("plan: compiled the train step for 1 TPU chips")
    assert compiles == 2, result.stderr[-3000:]  # the plan, the search; the choice reuses them
    assert "--config.model.remat=False --config.accumulation_steps=2" in result.stdout


NO_LIBTPU = """
import importlib.util
import sys

find_spec = importlib.util.find_spec
importlib.util.find_spec = lambda name, *rest: None if name == "libtpu" else find_spec(name, *rest)
from contrastive_jax.plan.command import main

main(sys.argv[1:])
"""


def test_without_libtpu_compiler_tpu_exits_2_with_the_install_line():
    import jax

    result = forked_command_lines.run(
        [sys.executable, "-c", NO_LIBTPU, f"{POD}:tiny", "--slice=v5e-4", "--compiler=tpu"],
        timeout=300, cwd=REPO)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.splitlines() == [
        "error: --compiler=tpu needs libtpu, the TPU compiler (about 700 MB, not needed to "
        f'train): pip install "jax[tpu]=={jax.__version__}"; or plan with --compiler=cpu']


@pytest.mark.parametrize("flags, message", [
    (("--gpus=2x8:h100", "--slices=2"), "--slices=2 joins TPU slices: give --slice=... too"),
    (("--gpus=2x8:h100", "--compiler=tpu"),
     "--compiler=tpu compiles for a TPU slice, not a GPU cluster: give --slice=... or use "
     "--compiler=cpu"),
    (("--compiler=both",), "--compiler=both compiles for a TPU slice, not fake CPU devices"),
    (("--choose",), "--choose ranks settings for a target: give --slice=... or --gpus=..."),
    (("--slice=v5e-4", "--allow_patch_dropout=0.5"),
     "--allow_patch_dropout is a choice for --choose; add --choose"),
    (("--slice=v5e-4", "--slices=0"), "--slices must be >= 1; got 0"),
    (("--slice=v5e-4", "--choose", "--allow_patch_dropout=1.0"),
     "--allow_patch_dropout is the fraction of image patches dropped, in [0, 1); got 1.0"),
])
def test_bad_compiler_and_slice_flags_exit_2_with_one_line(flags, message):
    result = plan_command(*flags, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], result.stderr[-2000:]
    assert "compiling" not in result.stderr


def test_the_compilers_benchmark_table_reads_each_record():
    """benchmarks/plan_compilers.py's table from a record (as its subprocesses write them):
    one row per slice, the ratio of the totals, the verdict against the TPU compiler's usable
    memory; ``--set`` values read as ``--config`` reads them."""
    import plan_compilers

    def fields(total, temporaries, usable=None, code=0):
        return {"total": total * GiB, "arguments": GiB // 20, "temporaries": temporaries * GiB,
                "outputs_not_aliased": 0, "generated_code": code * GiB, "peak": None,
                "usable": usable, "refused": None, "compile_s": 25.0,
                "state_and_batch": GiB // 20, "laid_out": None, "tpu_flops": None}

    record = {"variant": "", "chips": 128, "global_batch": 32768, "flops_per_example": 112.4e9,
              "cpu": fields(8.0, 7.95), "tpu": {"v4-256": fields(4.0, 3.9, 30.75 * GiB, 0.05),
                                                "v5p-256": fields(30.0, 29.9, 31 * GiB)}}
    rows = plan_compilers.rows_of([record], ["v4-256", "v5p-256"])
    assert [(r["slice"], r["ratio"], r["fits"]) for r in rows] == [
        ("v4-256", 2.0, True), ("v5p-256", 8 / 30, False)]
    lines = plan_compilers.table(rows).splitlines()
    assert lines[2].startswith("| template | v4-256 (128) | 8.00 | 4.00 | 2.00 | ")
    assert "| yes (30.75) | 112.4 | 25 / 25 |" in lines[2] and "| no (31.00) |" in lines[3]
    assert plan_compilers.literal("float32") == "float32" and plan_compilers.literal("2") == 2
    chosen = {"variant": "", "slice": "v5e-256", "total": 2 * GiB, "command_s": 600.0,
              "remat": {"flops_with_remat_per_chip": 17.6e12}, "speed": None,
              "choice": {"candidates": [
                  {"settings": {"model.remat": False}, "flops": 14.4e12, "accumulation": None,
                   "total": 30 * GiB, "compiled": True},
                  {"settings": {"model.remat": False, "sharding.params": "fsdp"},
                   "flops": 14.4e12, "accumulation": 2, "total": 12 * GiB, "compiled": True},
                  {"settings": {"model.remat": True}, "flops": 17.6e12, "accumulation": None,
                   "total": None, "compiled": False}]}}
    row = plan_compilers.choice_table([chosen]).splitlines()[2]
    assert row == ("| template | v5e-256 | 2.00, 17.60 | `model.remat=False sharding.params=fsdp "
                   "accumulation_steps=2` | 12.00, 14.40 | 2 of 3 | 600 |")


def test_the_headline_names_the_compiler_and_the_slices():
    from contrastive_jax.plan import Plan
    from contrastive_jax.plan.report import headline

    p = Plan(devices=8, global_batch=64, accumulation_steps=1, params=0, opt_state=0,
             other_state=0, batch=0, temporaries=0, arguments=0, outputs_not_aliased=0,
             compile_s=12.0, compiler="TPU")
    assert headline(p, "tiny", tpu_slice("v5e-4", 2)) == (
        "memory plan: tiny on TPU v5e v5e-4 (4 chips on 1 host, 16.00 GiB each) x 2 slices "
        "over the data-centre network (8 chips in all), global batch 64 (8 per device); "
        "compiled in 12 s by the TPU compiler (libtpu) on this CPU")
    one = dataclasses.replace(p, devices=1, global_batch=8, compiler="XLA:CPU")
    assert headline(one, "tiny", tpu_slice("v5e-1")).startswith(
        "memory plan: tiny on TPU v5e v5e-1 (1 chip on 1 host, 16.00 GiB each), global batch 8")
    assert headline(one, "tiny", tpu_slice("v5e-1")).endswith("compiled in 12 s by XLA:CPU")


def test_a_step_without_loops_gets_the_roofline_time():
    """SimCLR's MNIST-1D step with the autodiff loss (no tiled loop, no scan, no
    accumulation) on one v5e chip: the compiled program has no loops, so the TPU compiler's
    totals are the step's and the plan prints max(FLOPs / peak, bytes / HBM bandwidth)."""
    from contrastive_jax.plan.report import roofline_lines
    from contrastive_jax.plan.search import with_overrides

    config = with_overrides(load_config("simclr_mnist1d.py"), {"loss.impl": "autodiff"})
    target = tpu_slice("v5e-1")
    p = plan(planned(config, make_mesh({"data": -1},
                                       devices=tpu_compiler.topology_devices(target))))
    assert p.cost is not None and not p.cost.loops and p.cost.flops > 0
    seconds = max(p.cost.flops / 197e12, p.cost.bytes_accessed / 819e9)
    lines = roofline_lines(p, target)
    assert lines[1] == (f"  roofline (no step is faster) {seconds * 1e3:.3f} ms = max(FLOPs / "
                        "197 TFLOP/s, bytes / 819 GB/s)"), lines


def test_a_step_the_tpu_compiler_refuses_is_a_plan_that_does_not_fit():
    """Twice the batch of the test above (30 GiB of temporaries for a 15.75 GiB chip): the TPU
    compiler refuses the program; the plan holds its figure as the temporaries and its first
    line, and the report says it does not fit, with the refusal, not a traceback."""
    from contrastive_jax.plan.report import target_report
    from contrastive_jax.plan.search import with_overrides

    config = with_overrides(load_config("simclr_mnist1d.py"), {
        "model.encoder.length": 40960, "data.batch_size": 512})
    target = tpu_slice("v5e-1")
    p = plan(planned(config, make_mesh({"data": -1},
                                       devices=tpu_compiler.topology_devices(target))))
    assert p.refused is not None and p.refused.startswith("RESOURCE_EXHAUSTED"), p.refused
    assert p.usable == int(15.75 * GiB) and p.temporaries > p.usable
    assert p.arguments == p.params + p.opt_state + p.other_state + p.batch
    assert p.total == p.arguments + p.temporaries and p.cost is None
    text = target_report(p, "long signals", target, None, None)
    assert "  does NOT fit: " in text and "the TPU compiler refused the step: RESOURCE_" in text
