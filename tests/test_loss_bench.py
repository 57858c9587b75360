"""benchmarks/loss_bench.py: its textbook baseline is the library's loss, and its tables."""

import argparse
import json

import jax
import jax.numpy as jnp
import loss_bench
import numpy as np
import pytest

from contrastive_jax.losses import clip_loss, nt_xent, siglip_loss

LIBRARY = {
    "clip": lambda a, b, t: clip_loss(a, b, t, impl="autodiff"),
    "nt_xent": lambda a, b, t: nt_xent(a, b, t, impl="autodiff"),
    "siglip": lambda a, b, t: siglip_loss(a, b, t, -10.0, impl="autodiff"),
}
THIRD = {"clip": np.log(1 / 0.07), "nt_xent": 0.1, "siglip": np.log(10.0)}


@pytest.mark.parametrize("loss", sorted(LIBRARY))
def test_the_textbook_baseline_is_the_same_loss_and_gradient(loss):
    """The baseline's loss and gradients equal the library's in float64 (it times the same
    function, written the textbook way)."""
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        x, y = (jnp.asarray(rng.standard_normal((24, 16))) for _ in range(2))
        third = jnp.float64(THIRD[loss])
        # both in one jitted program (eagerly, the tiled loops are an op-by-op walk)
        (want, want_grads), (got, grads) = jax.jit(lambda *args: [
            jax.value_and_grad(fn, argnums=(0, 1, 2))(*args)
            for fn in (LIBRARY[loss], loss_bench.textbook_loss(loss))])(x, y, third)
        np.testing.assert_allclose(float(got), float(want), rtol=1e-13)
        for g, w in zip(grads, want_grads, strict=True):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-10, atol=1e-14)


def test_the_table_is_relative_to_the_textbook_and_append_adds_a_section(tmp_path,
                                                                          monkeypatch, capsys):
    """The command's plumbing with the workers run in this process (N = 64): a time relative to
    the textbook row, the loss values checked against it, ``--append`` adding a section."""
    def in_process(loss, impl, n, d, block, runs, timeout):
        args = argparse.Namespace(loss=loss, impl=impl, n=n, d=d, block=block, runs=runs,
                                  measure="time")
        return {**loss_bench.worker(args), "run_mb": 0.0, "with_inputs_mb": 0.0}

    monkeypatch.setattr(loss_bench, "run_worker", in_process)
    out = tmp_path / "bench.md"
    command = ["--losses", "clip", "--sizes", "64", "--d", "8", "--runs", "1", "--out", str(out)]
    loss_bench.main([*command, "--impls", "textbook", "tiled"])
    loss_bench.main([*command, "--impls", "textbook", "autodiff", "--append"])
    assert "WARNING" not in capsys.readouterr().out  # every impl computed the textbook's loss
    text = out.read_text()
    assert text.count("| loss | impl | N |") == 2
    assert text.count("\n\nProvenance: ") == 2  # each section headed by its own record
    assert text.startswith("# Loss benchmark\n\nProvenance: ")
    assert "| clip | textbook | 64 | - |" in text and "| 1.00x |" in text
    rows = json.loads(out.with_suffix(".json").read_text())
    assert [r["impl"] for r in rows] == ["textbook", "tiled", "textbook", "autodiff"]
    values = [r["value"] for r in rows]
    np.testing.assert_allclose(values, values[0], rtol=1e-5)
