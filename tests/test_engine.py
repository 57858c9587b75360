"""One tiling engine for every tiled and sharded loss: each path equals the dense reference.

Every loss (CLIP, NT-Xent, SigLIP) x every path (the tiled and dense_vjp impls on one device;
``all_gather``, ``ring`` and ``all_gather_no_grad`` on 1, 2, 4 and 8 devices) x positives by
id, and by index on one device, for SigLIP and for ``all_gather_no_grad`` on every device
count (CLIP's and NT-Xent's ``all_gather`` and ``ring`` with positives by index on 2, 4 and 8
devices: tests/test_sharding.py, to 1e-12 in float64 on 8), against a dense float64
reference written with ``info_nce`` and a boolean positive mask (docs/derivations.md §5), to
1e-12: the loss and every gradient (embeddings, the scale or temperature, SigLIP's bias). 24
rows in blocks of 5: on 1, 2, 4 and 8 devices that is 24, 12, 6 and 3 rows per device, so a
block never divides a device's rows and on 8 devices it is larger than them; row 3 is zero.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contrastive_jax.losses import clip_loss, info_nce, l2_normalize, nt_xent, siglip_loss
from contrastive_jax.losses.parts.temperature import logit_scale
from contrastive_jax.losses.sharded import (
    STRATEGIES,
    sharded_clip_loss,
    sharded_nt_xent,
    sharded_siglip_loss,
)
from contrastive_jax.mesh import make_mesh

N, D_EMB, BLOCK = 24, 6, 5
LOG_SCALE, TAU, BIAS = np.log(7.0), 0.3, -2.0
IDS = np.random.default_rng(0).integers(0, 6, N).astype(np.int32)  # repeats: several positives


@functools.cache
def _data(dtype=jnp.float64):
    """x, y (N, D_EMB) in ``dtype``, row 3 of x zero; float64 draws under x64."""
    with jax.enable_x64(dtype == jnp.float64):
        k = jax.random.split(jax.random.key(1), 2)
        base = jnp.float64 if dtype == jnp.float64 else jnp.float32
        x = jax.random.normal(k[0], (N, D_EMB), base)
        y = x + 0.5 * jax.random.normal(k[1], (N, D_EMB), base)
        return x.at[3].set(0.0).astype(dtype), y.astype(dtype)


def _mask(ids):
    ids = np.arange(N) if ids is None else ids
    return jnp.asarray(ids[:, None] == ids[None, :])


def reference(loss, x, y, third, bias, ids):
    """Dense, with ``info_nce`` (CLIP, NT-Xent) or the per-pair sum (SigLIP)."""
    x_hat, y_hat = l2_normalize(x), l2_normalize(y)
    if loss == "nt_xent":
        z = jnp.concatenate([x_hat, y_hat])
        self_ = jnp.eye(2 * N, dtype=bool)
        logits = jnp.where(self_, -jnp.inf, z @ z.T / third)
        both = np.concatenate([np.arange(N) if ids is None else ids] * 2)
        return info_nce(logits, jnp.asarray(both[:, None] == both[None, :]) & ~self_)
    logits = logit_scale(third) * x_hat @ y_hat.T
    mask = _mask(ids)
    if loss == "clip":
        return 0.5 * (info_nce(logits, mask) + info_nce(logits.T, mask.T))
    signs = jnp.where(mask, 1.0, -1.0)
    return -jnp.sum(jax.nn.log_sigmoid(signs * (logits + bias))) / N


def _single(loss, impl):
    def fn(x, y, third, bias, ids):
        if loss == "clip":
            return clip_loss(x, y, third, impl=impl, positive_ids=ids,
                             **({"block_size": BLOCK} if impl == "tiled" else {}))
        if loss == "nt_xent":
            return nt_xent(x, y, third, impl=impl, positive_ids=ids,
                           **({"block_size": BLOCK} if impl == "tiled" else {}))
        return siglip_loss(x, y, third, bias, impl=impl, positive_ids=ids,
                           **({"block_size": BLOCK} if impl == "tiled" else {}))
    return fn


def _sharded(loss, strategy, devices):
    mesh = make_mesh({"data": devices}, jax.devices()[:devices])

    def fn(x, y, third, bias, ids):
        kw = {"mesh": mesh, "strategy": strategy, "block_size": BLOCK, "positive_ids": ids}
        if loss == "clip":
            return sharded_clip_loss(x, y, third, **kw)
        if loss == "nt_xent":
            return sharded_nt_xent(x, y, third, **kw)
        return sharded_siglip_loss(x, y, third, bias, **kw)
    return fn


def _third(loss):
    return jnp.float64(TAU if loss == "nt_xent" else LOG_SCALE)


@functools.cache
def _want(loss, with_ids):
    """The float64 reference value and gradients (x, y, scale or temperature, bias); all six
    (loss, with_ids) references are one program, compiled once."""
    return _wants()[loss, with_ids]


@functools.cache
def _wants():
    keys = [(loss, w) for loss in ("clip", "nt_xent", "siglip") for w in (False, True)]
    with jax.enable_x64(True):
        x, y = _data()

        def all_references(x, y, bias):
            return [jax.value_and_grad(reference, argnums=(1, 2, 3, 4))(
                loss, x, y, _third(loss), bias, IDS if with_ids else None)
                for loss, with_ids in keys]

        out = jax.jit(all_references)(x, y, jnp.float64(BIAS))
        return {key: (float(value), [np.asarray(g) for g in grads])
                for key, (value, grads) in zip(keys, out, strict=True)}


def _check_all(loss, fns, gradients):
    """Each of ``fns`` (``{key: (fn, with_ids)}``) equals the dense float64 reference to 1e-12:
    the loss and, where ``gradients[key]``, every gradient. All of them are one jitted program
    (one compile for many small losses)."""
    def every(x, y, third, bias):
        out = {}
        for key, (fn, with_ids) in fns.items():
            def at(a, b, t, c, fn=fn, w=with_ids):
                return fn(a, b, t, c, jnp.asarray(IDS) if w else None)
            # A gradient that is not checked is not compiled: the value of the same forward
            # pass (a custom_vjp's forward rule, as under value_and_grad), no backward.
            out[key] = (jax.value_and_grad(at, argnums=(0, 1, 2, 3))(x, y, third, bias)
                        if gradients[key] else (jax.vjp(at, x, y, third, bias)[0], None))
        return out

    with jax.enable_x64(True):
        results = jax.jit(every)(*_data(), _third(loss), jnp.float64(BIAS))
    names = ("x", "y", "scale", "bias") if loss == "siglip" else ("x", "y", "scale")
    for key, (value, grads) in results.items():
        want_value, want = _want(loss, fns[key][1])
        assert abs(float(value) - want_value) <= 1e-12 * abs(want_value), key
        if not gradients[key]:
            continue
        for name, got, w in zip(names, grads, want, strict=False):
            got = np.asarray(got, np.float64)
            err = np.linalg.norm((got - w).ravel()) / np.linalg.norm(w.ravel())
            assert err <= 1e-12, (key, name, err)


PATHS = [("clip", "tiled"), ("clip", "dense_vjp"), ("clip", "autodiff"), ("nt_xent", "tiled"),
         ("nt_xent", "dense_vjp"), ("nt_xent", "autodiff"), ("siglip", "tiled"),
         ("siglip", "autodiff")]


@pytest.mark.parametrize("loss, impl", PATHS)
def test_single_device_paths(loss, impl):
    # Positives by index and by id: two losses of one program.
    fns = {(impl, w): (_single(loss, impl), w) for w in (False, True)}
    _check_all(loss, fns, dict.fromkeys(fns, True))


@pytest.mark.parametrize("devices", [1, 2, 4, 8])
@pytest.mark.parametrize("loss", ["clip", "nt_xent", "siglip"])
def test_sharded_paths(loss, devices):
    # Every strategy in one program. Positives by id everywhere; by index on one device, for
    # SigLIP and all_gather_no_grad (CLIP's and NT-Xent's all_gather and ring with positives by
    # index on 2, 4 and 8 devices: tests/test_sharding.py).
    strategies = [s for s in STRATEGIES if not (loss == "siglip" and s == "all_gather_no_grad")]
    fns = {(s, w): (_sharded(loss, s, devices), w) for s in strategies for w in (False, True)
           if w or devices == 1 or loss == "siglip" or s == "all_gather_no_grad"}
    # all_gather_no_grad: the same value, a different gradient (tests/test_sharding.py)
    _check_all(loss, fns, {key: key[0] != "all_gather_no_grad" for key in fns})


def test_positives_by_id_change_the_loss():
    # The test above would pass with ids ignored if duplicate ids did not matter: they do.
    assert abs(_want("clip", True)[0] - _want("clip", False)[0]) > 0.1


@pytest.mark.parametrize("loss", ["clip", "nt_xent", "siglip"])
def test_bfloat16_inputs_at_scale_100_stay_finite(loss):
    x, y = _data(jnp.bfloat16)
    third = jnp.float32(0.01 if loss == "nt_xent" else np.log(100.0))

    def both(a, b, t, c):  # the tiled impl and the ring on 8 devices: one program
        return [jax.value_and_grad(lambda a, b, t, c, fn=fn: fn(a, b, t, c, None),
                                   argnums=(0, 1, 2, 3))(a, b, t, c)
                for fn in (_single(loss, "tiled"), _sharded(loss, "ring", 8))]

    for value, grads in jax.jit(both)(x, y, third, jnp.float32(BIAS)):
        assert np.isfinite(float(value))
        assert all(np.all(np.isfinite(np.asarray(g, np.float32))) for g in grads)
        assert grads[0].dtype == jnp.bfloat16
