"""Exact gradient accumulation: K micro-batches give the gradient of the global-batch loss.

Every method (CLIP with a learned log-scale, SigLIP with scale and bias, SimCLR, MoCo) on
Transformer towers with dropout > 0 and the ViT's patch dropout at 0.5 (SimCLR and MoCo with
augmentations on), in float64,
against K = 1 on the same global batch (on 8 devices) to 1e-12 relative: the gradient of every
parameter (log-scale and bias included) with K = 8 on 8 devices and the dense loss (SimCLR's
with label positives), and K = 4 on 1 device (CLIP); on 8 devices, the ring with K = 2 (CLIP)
and K = 4 (SigLIP) and the tiled loss with K = 4 (SimCLR, label positives); the whole state
after a train step (MoCo, K = 4, SGD). Each claim dimension (method, K, device count, impl or
strategy) is covered, not their cross product: each (devices, K, loss) is a program to
compile. A naive accumulation
(the mean of the micro-batches' own losses) differs by more than 1%, so these tests can fail.
(docs/training.md, "Gradient accumulation", claims exactly this list.)
"""

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from contrastive_jax.errors import ConfigError
from contrastive_jax.mesh import make_mesh
from contrastive_jax.training import train
from contrastive_jax.training.config import base_config
from contrastive_jax.training.methods import method_for
from contrastive_jax.training.step import train_step
from contrastive_jax.training.step.accumulation import (
    check_accumulation,
    from_micro_batches,
    step_gradients,
    to_micro_batches,
)
from contrastive_jax.training.step.train_state import create_state

B, TOKENS, VOCAB = 64, 6, 24
# the ViT also drops half its 4 patches (FLIP's patch dropout, per example like dropout)
VIT = {"name": "vit", "image_size": 8, "patch": 4, "in_channels": 1, "width": 16, "depth": 1,
       "heads": 2, "mlp_ratio": 2, "dropout": 0.2, "features": 16, "patch_dropout": 0.5}
TEXT = {"name": "text_transformer", "vocab_size": VOCAB, "max_tokens": TOKENS, "width": 16,
        "depth": 1, "heads": 2, "mlp_ratio": 2, "dropout": 0.2, "features": 16}


def make_config(method: str, **loss) -> ml_collections.ConfigDict:
    config = base_config()
    config.data = {"batch_size": B}
    config.input_key, config.text_key = "image", "caption"
    if method in ("simclr", "moco"):  # random crops, flips and noise drawn per example (a
        # fifth of each program to compile: the dual encoders' runs go without; their dropout
        # keys take the same per-example path)
        config.augment = {"kind": "image", "resized_crop": 0.4, "flip": 0.5, "noise": 0.05}
    if method in ("clip", "siglip"):
        config.model = {"name": "dual_encoder", "sample_encoder": VIT, "text_encoder": TEXT,
                        "embed_dim": 8, "siglip": method == "siglip"}
        if method == "siglip":  # a bias near the data's scale, so its gradient is not tiny
            config.model.init_bias = -1.0
    else:  # no BatchNorm in the head: BN statistics are per micro-batch by definition
        config.model = {"name": "projected_encoder", "encoder": VIT, "learn_temperature": True,
                        "head": {"hidden": 16, "out": 8, "layers": 2, "batch_norm": False}}
        if method == "moco":
            config.moco = {"queue_size": 2 * B}
    config.method = method
    config.loss = {"name": {"clip": "clip", "siglip": "siglip", "simclr": "nt_xent",
                            "moco": "moco"}[method], "temperature": 0.2, **loss}
    config.optimizer = {"name": "adamw", "learning_rate": 1e-2, "warmup_steps": 0,
                        "weight_decay": 0.1}
    return config


def float64(tree):
    return jax.tree.map(lambda a: a.astype(jnp.float64)
                        if jnp.issubdtype(a.dtype, jnp.floating) else a, tree)


def make_batch(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, VOCAB, (B, TOKENS))
    tokens[:, 4:] *= rng.integers(0, 2, (B, 1))  # some captions padded
    return {"image": rng.uniform(0, 1, (B, 8, 8, 1)), "caption": tokens.astype(np.int32),
            "label": rng.integers(0, 4, B).astype(np.int32)}


# the loss settings of every run of a method (SimCLR's runs with label positives, so that
# accumulation carries a batch feature into pass 2); a tuple of items, hashable for the caches
LOSS = {"clip": (), "siglip": (), "simclr": (("positive_ids", "label"),), "moco": ()}
# per method, ``(loss settings, K)`` of its run with a blocked global loss on 8 devices
BLOCKED = {"clip": ((("strategy", "ring"),), 2),
           "siglip": ((("strategy", "ring"), ("block_size", 4)), 4),
           "simclr": ((("impl", "tiled"), ("block_size", 8), ("positive_ids", "label")), 4)}


def setup(method: str, devices: int, optimizer: dict | None = None, **loss):
    config = make_config(method, **loss)
    config.optimizer.update(optimizer or {})
    mesh = make_mesh({"data": devices}, jax.devices()[:devices])
    m = method_for(config)
    graphdef, state, tx = create_state(config, 10, m)
    ctx = train_step.make_context(config, mesh, graphdef, m)
    return config, mesh, m, graphdef, float64(state), tx, ctx


@functools.cache
def prepared(method: str, devices: int, loss: tuple):
    """``(method, graphdef, float64 state, context)`` of :func:`setup`, built once per process."""
    _, _, m, graphdef, state, _, ctx = setup(method, devices, **dict(loss))
    return m, graphdef, state, ctx


@functools.cache
def gradient(method: str, devices: int, k: int, loss: tuple = ()):
    """``(loss, grads)``, on the host, of one step with ``K = k`` on ``devices`` devices, on the
    same float64 state, batch and per-example keys for every ``(devices, k, loss)``; each is one
    program to compile, computed once per process (the tests below share the ``K = 1``
    references)."""
    m, graphdef, state, ctx = prepared(method, devices, loss)
    mesh = make_mesh({"data": devices}, jax.devices()[:devices])
    batch = jax.device_put(make_batch(), jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec("data")))
    keys = jax.random.split(jax.random.key(7), B)
    fn = jax.jit(functools.partial(loss_and_gradient, graphdef=graphdef, method=m, ctx=ctx,
                                   accumulation_steps=k))
    # on the host: results of 1 and 8 devices are compared
    return jax.device_get(fn(state.params, state.rest, batch, keys, state.extra))


def loss_and_gradient(*args, **kwargs):
    """The loss and gradient of :func:`step_gradients` (its metrics left out of the program)."""
    return step_gradients(*args, **kwargs)[:2]


def assert_same_gradients(got, want, rtol=1e-12):
    (loss, grads), (want_loss, want_grads) = got, want
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=rtol)
    flat, want_flat = (jax.tree_util.tree_leaves_with_path(g) for g in (grads, want_grads))
    scale = max(float(np.abs(g).max()) for _, g in want_flat)
    for (path, g), (_, w) in zip(flat, want_flat, strict=True):
        # each leaf to 1e-12 of its own size, and of the largest gradient for leaves near 0
        err = float(np.abs(np.subtract(g, w)).max())
        assert err <= rtol * max(float(np.abs(w).max()), 1e-3 * scale), (
            jax.tree_util.keystr(path), err, float(np.abs(w).max()))


@pytest.mark.parametrize("method", ["clip", "siglip", "simclr", "moco"])
def test_accumulated_gradient_equals_one_batch(method):
    """K = 8 on 8 devices (one row per device per micro-batch) against K = 1 on 8 devices, in
    float64, with the dense loss (SimCLR with label positives); the loss's own parameters
    (log-scale, bias) are in the tree and nonzero. For CLIP also K = 4 on one device against
    the same reference, and its naive accumulation differs from it (each (devices, K) is a
    program to compile: the other K and the blocked losses are in the test below)."""
    with jax.enable_x64(True):
        want = gradient(method, 8, 1, LOSS[method])
        assert abs(float(want[1]["log_scale"])) > 1e-6
        if method == "siglip":
            assert abs(float(want[1]["bias"])) > 1e-6
        assert_same_gradients(gradient(method, 8, 8, LOSS[method]), want)
        if method == "clip":
            assert_same_gradients(gradient(method, 1, 4), want)
            assert_naive_accumulation_differs(want[1], *prepared(method, 1, ()))


def assert_naive_accumulation_differs(exact, m, graphdef, state, ctx):
    """The mean of the K = 4 micro-batches' own gradients (each micro-batch's loss seeing only
    its own negatives, on one device) is another objective: its gradient differs from the
    global one, ``exact``, by more than 1%."""
    grad = jax.jit(functools.partial(loss_and_gradient, graphdef=graphdef, method=m, ctx=ctx))
    parts = to_micro_batches((make_batch(), jax.random.split(jax.random.key(7), B)), 4, 1)
    naive = jax.tree.map(jnp.zeros_like, exact)
    for i in range(4):
        batch, keys = jax.tree.map(lambda a, i=i: a[i], parts)
        _, g = grad(state.params, state.rest, batch, keys, state.extra)
        naive = jax.tree.map(lambda a, b: a + b / 4, naive, g)
    diff = optax_norm(jax.tree.map(jnp.subtract, naive, exact)) / optax_norm(exact)
    assert diff > 0.01, diff


@pytest.mark.parametrize("method", list(BLOCKED))
def test_accumulation_with_tiled_and_ring_losses(method):
    """The global loss of pass 2 may be any impl or sharded strategy (8 devices): CLIP's ring
    with K = 2, SigLIP's ring with K = 4 and SimCLR's tiled loss with K = 4 and label
    positives, each against its method's dense K = 1 of the test above (the same numbers: the
    blocked losses equal the dense one)."""
    loss, k = BLOCKED[method]
    with jax.enable_x64(True):
        assert_same_gradients(gradient(method, 8, k, loss), gradient(method, 8, 1, LOSS[method]))


def test_updated_parameters_and_state_equal():
    """Through the whole train step (optimiser, log-scale clamp, MoCo's queue and momentum
    update): the new state with K = 4 equals K = 1, each leaf to 1e-12 of its size plus 1e-12
    of the largest update. (SGD with momentum and weight decay for the encoders: Adam divides
    by sqrt(v), so a leaf whose exact gradient is 0, the attention's key bias, would move by
    rounding noise / eps.)"""
    with jax.enable_x64(True):
        _, mesh, m, graphdef, state, tx, ctx = setup(
            "moco", 8, optimizer={"name": "sgd", "weight_decay": 1e-3})
        batch = jax.device_put(make_batch(1), jax.sharding.NamedSharding(
            mesh, jax.sharding.PartitionSpec("data")))
        new = {}
        for k in (1, 4):
            step = jax.jit(lambda s, b, k=k: train_step.train_step(
                s, b, graphdef=graphdef, tx=tx, method=m, ctx=ctx, accumulation_steps=k))
            new[k], _ = step(state, batch)
        moves = jax.tree.map(lambda a, b: float(np.abs(np.subtract(a, b)).max()), new[1].params,
                             state.params)
        atol = 1e-12 * max(jax.tree.leaves(moves))
        for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(new[4]),
                                jax.tree.leaves(new[1]), strict=True):
            if jnp.issubdtype(a.dtype, jnp.floating):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12,
                                           atol=atol, err_msg=jax.tree_util.keystr(path))
            else:
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        moved = new[1].params["head"]["out"]["kernel"] - state.params["head"]["out"]["kernel"]
        assert float(np.abs(moved).max()) > 1e-4  # the step did something


def optax_norm(tree):
    return float(np.sqrt(sum(np.sum(np.asarray(a) ** 2) for a in jax.tree.leaves(tree))))


def test_micro_batches_are_spread_over_the_devices():
    """Micro-batch k holds rows k m .. (k+1) m - 1 of each device's shard, and the inverse
    restores the global order."""
    rows = np.arange(32)
    parts = np.asarray(to_micro_batches(jnp.asarray(rows), 4, 2))
    assert parts.shape == (4, 8)
    np.testing.assert_array_equal(parts[0], [0, 1, 2, 3, 16, 17, 18, 19])
    np.testing.assert_array_equal(parts[3], [12, 13, 14, 15, 28, 29, 30, 31])
    np.testing.assert_array_equal(np.asarray(from_micro_batches(jnp.asarray(parts), 2)), rows)


def test_bad_accumulation_settings_fail_before_compiling():
    with pytest.raises(ConfigError, match="accumulation_steps = 3 does not divide the global "
                                          "batch 32"):
        check_accumulation(32, 3, 8)
    with pytest.raises(ConfigError, match=r"micro-batches of 4 rows, not divisible by the 8 "
                                          r"data devices"):
        check_accumulation(32, 8, 8)
    with pytest.raises(ConfigError, match="integer >= 1; got 0"):
        check_accumulation(32, 0, 1)
    with pytest.raises(ConfigError, match=r"integer >= 1; got 2\.0"):
        check_accumulation(32, 2.0, 1)
    assert check_accumulation(32, 4, 8) == 4


@pytest.mark.parametrize("k", [True, 1.0])
def test_the_library_step_refuses_a_k_that_is_not_an_int(k):
    """``train_step`` and ``step_gradients`` check K as the trainer does (True == 1 and 1.0 == 1
    in Python, so a late check would run them silently as K = 1)."""
    from types import SimpleNamespace

    ctx = SimpleNamespace(mesh=make_mesh({"data": 1}, jax.devices()[:1]), frozen=())
    match = f"accumulation_steps must be an integer >= 1; got {k!r}"
    with pytest.raises(ConfigError, match=match):
        step_gradients(None, None, None, np.zeros(8), None, graphdef=None, method=None,
                       ctx=ctx, accumulation_steps=k)
    state = SimpleNamespace(rng=jax.random.key_data(jax.random.key(0)), step=np.int32(0),
                            params=None, rest=None, extra=None)
    with pytest.raises(ConfigError, match=match):
        train_step.train_step(state, {"x": np.zeros((8, 2))}, graphdef=None, tx=None,
                              method=None, ctx=ctx, accumulation_steps=k)


def test_a_run_with_accumulation_trains_the_same_model(tmp_path):
    """train_and_evaluate end to end on 8 devices (mi_gaussian's MLP critic: no BatchNorm):
    with accumulation_steps = 4 the run reports the same training loss and MI estimate as with
    1 (float32 rounding apart), and its results say so; a K that does not split the batch
    fails before anything compiles, naming the numbers."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "mi_gaussian", Path(__file__).resolve().parents[1] / "configs" / "mi_gaussian.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = {}
    for k in (1, 4):
        config = module.get_config("quick")
        config.evaluation.enabled = False
        config.accumulation_steps = k
        results[k] = train.train_and_evaluate(config, str(tmp_path / f"k{k}"))
    one, four = (results[k]["final_train_metrics"] for k in (1, 4))
    for name in ("loss", "mi_bound", "logit_scale"):
        np.testing.assert_allclose(four[name], one[name], rtol=2e-5, err_msg=name)
    assert one["loss"] > 0 and results[4]["global_batch"] == 64
    assert results[4]["accumulation_steps"] == 4 and results[1]["accumulation_steps"] == 1
    config = module.get_config("quick")
    config.accumulation_steps = 3
    with pytest.raises(ConfigError, match="accumulation_steps = 3 does not divide the global "
                                          "batch 64"):
        train.train_and_evaluate(config, str(tmp_path / "bad"))
    assert not (tmp_path / "bad" / "checkpoints").exists()
