"""Model FLOPs, TFLOP/s per chip and MFU (contrastive_jax.training.step.model_flops,
run/progress.py).

The count is XLA's for the model's computation: the same for a config with scanned towers,
remat and accumulation as for its plain form, and for a ViT/text dual encoder within 10% of
the closed form of its matmuls (forward ``2 x`` multiply-adds, backward twice that), which a
count of the scanned program (its loop body once) or of the remat'd one would miss by far;
the progress line's rates follow their formulas exactly.
"""

import json
import pathlib

import jax
import pytest
from test_train import load_config

from contrastive_jax.mesh import make_mesh
from contrastive_jax.training.models.dropout import kept_patches
from contrastive_jax.training.run.progress import Progress
from contrastive_jax.training.step import model_flops

B = 32


def pod_tiny(depth: int = 4, width: int = 64):
    """The pod template's tiny run with 4 blocks of width 64 a tower (matmuls dominate)."""
    config = load_config("clip_vit_b16_pod.py:tiny,tokenizer=x")
    config.data.batch_size = B
    for tower in (config.model.sample_encoder, config.model.text_encoder):
        tower.update({"depth": depth, "width": width, "features": width})
    return config


def batch_shapes(config) -> dict:
    from contrastive_jax.plan import example_shapes

    return {k: jax.ShapeDtypeStruct((B, *shape), dtype)
            for k, (shape, dtype) in example_shapes(config).items()}


def matmul_flops(config) -> float:
    """The towers' and the loss's matmuls of one step, by hand: per token and block the q, k,
    v, out and MLP projections and the two attention products, the patch embedding, the
    output layers and projections, the B x B logits; forward 2 FLOPs per multiply-add,
    backward twice the forward (the patch embedding's once: no gradient for the pixels)."""
    vit, text = config.model.sample_encoder, config.model.text_encoder

    def tower(width, depth, tokens, heads_dim_total, hidden):
        per_token = depth * (4 * width * width + 2 * width * hidden + 2 * tokens * width)
        return 2 * tokens * per_token

    patches = (vit.image_size // vit.patch) ** 2
    kept = kept_patches(patches, float(vit.get("patch_dropout", 0.0)))  # what the blocks see
    image = tower(vit.width, vit.depth, kept, vit.width, vit.mlp_ratio * vit.width)
    patch_embedding = 2 * patches * vit.patch ** 2 * 3 * vit.width  # the patch convolution
    image += 2 * vit.width * vit.features + 2 * vit.features * config.model.embed_dim
    words = tower(text.width, text.depth, text.max_tokens, text.width,
                  text.mlp_ratio * text.width)
    words += 2 * text.width * text.features + 2 * text.features * config.model.embed_dim
    logits = 2 * B * config.model.embed_dim  # per example: its row of the B x B logits
    return 3 * B * (image + words + logits) + 2 * B * patch_embedding


def test_scan_remat_and_accumulation_do_not_change_the_count():
    mesh = make_mesh({"data": 8})
    plain = pod_tiny()
    plain.model.sample_encoder.scan = plain.model.text_encoder.scan = False
    plain.model.remat = False
    lean = pod_tiny()  # the template: scanned, remat, and here 2 micro-batches, ring loss
    lean.accumulation_steps = 2
    assert lean.model.remat and lean.model.sample_encoder.scan and lean.loss.strategy == "ring"
    counted = [model_flops.step_flops(c, mesh, batch_shapes(c), 10) for c in (plain, lean)]
    assert counted[0] == counted[1]
    by_hand = matmul_flops(plain)
    assert 1.0 <= counted[0] / by_hand <= 1.1, (counted[0], by_hand)
    # the template's program as it runs, counted by XLA: its scanned blocks once each
    as_run = model_flops.step_flops(lean, mesh, batch_shapes(lean), 10, as_model=False)
    assert as_run < 0.5 * counted[0]


@pytest.mark.parametrize("remat", ["dots_saveable", {"sample_encoder": "dots_saveable"}])
def test_the_counted_config_drops_remat_given_as_a_policy_or_per_tower(remat):
    """``model.remat`` as a policy name or one entry per tower (as ``--config.model.remat=``
    sets it) is replaced by False in the counted copy (a bool over a string raised a
    TypeError, and the run silently showed no TFLOP/s); the config itself is unchanged."""
    config = pod_tiny()
    config.model.remat = remat
    assert model_flops.counting_config(config).model.remat is False
    kept = model_flops.counting_config(config, keep_remat=True).model.remat
    assert (kept.to_dict() if hasattr(kept, "to_dict") else kept) == remat
    assert config.model.remat == model_flops.counting_config(config, keep_remat=True).model.remat


def test_patch_dropout_and_a_lower_resolution_cut_the_template_s_count():
    """The ViT-B/16 template's widths, image and context sizes (one block a tower: every
    block costs the same, so the ratios are the 12-block ones; benchmarks/cheaper_clip_bench.py
    counts all 12): at ``patch_dropout=0.5`` the whole step's count is at most 0.65x of the
    unmasked one (issue's floor; 0.53x measured) and ``res=112`` at most 0.35x; each within 10%
    of the closed form of its matmuls with the kept tokens."""
    mesh = make_mesh({"data": 1}, devices=jax.devices()[:1])
    counted = {}
    for variant in ("", ",patch_dropout=0.5", ",res=112"):
        config = load_config(f"clip_vit_b16_pod.py:tokenizer=x,steps=10{variant}")
        config.data.batch_size = B
        config.optimizer.warmup_steps = 0
        for tower in (config.model.sample_encoder, config.model.text_encoder):
            tower.depth = 1
        counted[variant] = model_flops.step_flops(config, mesh, batch_shapes(config), 10)
        assert 1.0 <= counted[variant] / matmul_flops(config) <= 1.1, variant
    assert counted[",patch_dropout=0.5"] <= 0.65 * counted[""]
    assert counted[",res=112"] <= 0.35 * counted[""]


def test_the_rates_are_their_formulas():
    progress = Progress.__new__(Progress)  # the arithmetic alone: no writers
    progress.batch, progress.chips = 4096, 8
    progress.model_flops, progress.peak_flops = 3.2e15, 275e12
    got = progress.timing(steps=20, seconds=10.0)
    assert got["step_s"] == pytest.approx(0.5)
    assert got["examples_per_s"] == pytest.approx(20 * 4096 / 10)
    assert got["examples_per_s_per_chip"] == pytest.approx(20 * 4096 / 10 / 8)
    assert got["model_tflops_per_chip"] == pytest.approx(3.2e15 / 8 / 0.5 / 1e12)
    assert got["mfu"] == pytest.approx(3.2e15 / 8 / 0.5 / 275e12)
    progress.peak_flops = None  # the CPU: no peak, no MFU
    assert "mfu" not in progress.timing(20, 10.0)
    progress.model_flops = None  # not counted: no TFLOP/s either
    assert set(progress.timing(20, 10.0)) == {"step_s", "examples_per_s",
                                              "examples_per_s_per_chip"}
    assert progress.timing(0, 0.4) == {}  # no step timed: no rates (not a throughput of 0)


def test_a_logging_step_that_compiled_shows_no_rates(tmp_path, capsys):
    """A line at the first step of a run or of a resume (the step that compiled: no step
    timed) has no s/step, ex/s or TFLOP/s, in the console, TensorBoard and metrics.jsonl;
    the next line has them."""
    progress = Progress(tmp_path, total_steps=8, global_batch=16, every=1, start_step=3)
    progress.set_model_flops(1e9)
    progress.restart_clock(4)  # step 4 compiled
    progress.log_train(4, {"loss": 1.0})
    progress.log_train(5, {"loss": 0.9})
    progress.close()
    first, second = capsys.readouterr().out.splitlines()[-2:]
    assert "ex/s" not in first and "s/step" not in first and first.endswith("ETA ?"), first
    assert "ex/s" in second and "TFLOP/s/chip" in second, second
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert "examples_per_s" not in lines[0] and lines[1]["examples_per_s"] > 0


def test_peaks_by_device_kind():
    from contrastive_jax.accelerators import device_peak_flops

    assert device_peak_flops("TPU v4") == 275e12
    assert device_peak_flops("TPU v5 lite") == 197e12
    assert device_peak_flops("TPU v5p") == 459e12
    assert device_peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert device_peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert device_peak_flops(jax.devices()[0].device_kind) is None  # this CPU


# ---------------------------------------------------------------------------------------------
# The count kept beside the compilation cache (run/compilation_cache.ModelFlopsMemo)
# ---------------------------------------------------------------------------------------------

def small_clip(width: int = 32):
    """The tiny template at depth 1 (a count of a second or less)."""
    config = pod_tiny(depth=1, width=width)
    config.model.embed_dim = width
    return config


def counted(config, mesh, memo, steps: int = 10) -> float | None:
    """What a :class:`model_flops.Counter` with ``memo`` gives for the first step."""
    counter = model_flops.Counter(config, mesh, None, steps, memo=memo)
    counter.start(None, batch_shapes(config))
    value, _ = counter.result()
    assert counter.error is None, counter.error
    return value


def test_a_kept_count_is_read_instead_of_counted(tmp_path, monkeypatch):
    """The first count is XLA's (equal to :func:`model_flops.step_flops`) and is kept in
    ``<dir>/model_flops/<key>.json``; a second run of the same step reads it (counting would
    fail here); a damaged file is counted again and rewritten."""
    from contrastive_jax.training.run.compilation_cache import ModelFlopsMemo

    mesh = make_mesh({"data": 8})
    config = small_clip()
    fresh = model_flops.step_flops(config, mesh, batch_shapes(config), 10)
    memo = ModelFlopsMemo(config, mesh, 10, directory=str(tmp_path))
    assert counted(config, mesh, memo) == fresh
    kept = tmp_path / "model_flops" / f"{memo.key(batch_shapes(config))}.json"
    assert [p.name for p in (tmp_path / "model_flops").iterdir()] == [kept.name]

    real = model_flops.step_flops

    def refuse(*args, **kwargs):
        raise AssertionError("counted again")

    monkeypatch.setattr(model_flops, "step_flops", refuse)
    again = ModelFlopsMemo(small_clip(), mesh, 10, directory=str(tmp_path))
    assert counted(small_clip(), mesh, again) == fresh  # read, not counted

    kept.write_text('{"model_flops": ')  # damaged (a crash mid-write leaves none: renamed)
    monkeypatch.setattr(model_flops, "step_flops", real)
    assert counted(config, mesh, again) == fresh
    assert float(json.loads(kept.read_text())["model_flops"]) == fresh
    # "" (CONTRASTIVE_JAX_COMPILATION_CACHE=off): nothing kept, not even in JAX's cache dir
    none = ModelFlopsMemo(config, mesh, 10, directory="")
    key = none.key(batch_shapes(config))
    assert none.get(key) is None
    none.put(key, 1.0)
    assert none.get(key) is None
    default = pathlib.Path(jax.config.jax_compilation_cache_dir)  # tests/conftest.py's
    assert not (default / "model_flops" / f"{key}.json").exists()
    assert counted(config, mesh, none) == fresh  # counted


def test_the_key_covers_what_the_count_reads(monkeypatch):
    """Equal for equal inputs and for settings the counting config replaces (the loss's
    strategy, remat, scan, accumulation: the count is the same); another width, step count,
    batch, mesh, package version or source digest is another key."""
    from contrastive_jax.training.run import provenance
    from contrastive_jax.training.run.compilation_cache import ModelFlopsMemo

    mesh = make_mesh({"data": 8})
    shapes = batch_shapes(small_clip())

    def key(config=None, steps=10, on=mesh, batch=shapes):
        return ModelFlopsMemo(config or small_clip(), on, steps, directory="x").key(batch)

    base = key()
    assert key() == base
    same = small_clip()
    same.accumulation_steps, same.model.remat, same.loss.strategy = 2, False, ""
    same.model.text_encoder.scan = False
    assert key(same) == base
    bigger = {k: jax.ShapeDtypeStruct((2 * B, *v.shape[1:]), v.dtype) for k, v in shapes.items()}
    half = make_mesh({"data": 4}, devices=jax.devices()[:4])
    others = [key(small_clip(width=48)), key(steps=11), key(on=half), key(batch=bigger)]
    monkeypatch.setattr(provenance, "source_digest", lambda: "edited")
    others.append(key())
    monkeypatch.undo()
    monkeypatch.setattr(provenance, "version", lambda name: "9.9" if name == "optax" else "1")
    others.append(key())
    assert len({base, *others}) == 1 + len(others)


def test_a_resumed_run_reads_the_count_its_first_run_kept(tmp_path, monkeypatch):
    """The trainer keeps its count beside the run's compilation cache (tests/conftest.py's):
    the shared SimCLR quick run (tests/trained_workdirs.py) without its step-6 checkpoint,
    resumed from step 3 with counting made to fail, still logs TFLOP/s per chip."""
    import shutil

    from trained_workdirs import simclr_quick_config, simclr_quick_workdir

    from contrastive_jax.training import train

    workdir = simclr_quick_workdir(tmp_path / "run")
    shutil.rmtree(workdir / "checkpoints" / "6")

    def refuse(*args, **kwargs):
        raise AssertionError("counted again")

    monkeypatch.setattr(model_flops, "step_flops", refuse)
    resumed = train.train_and_evaluate(simclr_quick_config(), str(workdir))
    assert resumed["resumed_from"] == 3
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    last = [line for line in lines if line["prefix"] == "train"][-1]  # the resumed run's
    assert last["step"] == 6 and last["model_tflops_per_chip"] > 0, last
