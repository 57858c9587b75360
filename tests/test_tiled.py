"""impl="tiled" equals the dense losses and never materialises an N x N array."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import float32_bounds as fb
from contrastive_jax.losses import clip_loss, nt_xent

CASES = [  # (N, block): not divisible, smaller than one block, exact multiple, tiny
    (37, 8),
    (5, 16),
    (64, 16),
    (2, 1),
]


def _rel(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    nb = np.linalg.norm(b)
    return np.linalg.norm(a - b) / nb if nb > 0 else np.linalg.norm(a)


def _data(n, d, dtype, clustered=False, seed=0):
    kx, ky, kc = jax.random.split(jax.random.key(seed), 3)
    if clustered:  # three tight clusters: logits at scale 100 span [-100, 100]
        centres = jax.random.normal(kc, (3, d), dtype)
        x = centres[jnp.arange(n) % 3] + 1e-3 * jax.random.normal(kx, (n, d), dtype)
    else:
        x = jax.random.normal(kx, (n, d), dtype)
    y = x + 0.5 * jax.random.normal(ky, (n, d), dtype)
    return x.at[n // 2].set(0.0), y  # and one zero row


@functools.cache
def _jitted(loss, block, kw_items):
    """One jitted program per (loss, block, settings) returning the value and gradients of
    impl="autodiff" (``"dense"``) and of impl="tiled" (``"tiled"``): a new scale or temperature
    of the same shape and dtype reuses the compilation."""
    kw = dict(kw_items)

    def value_and_grads(x, y, t, impl, **extra):
        return jax.value_and_grad(lambda *a: loss(*a, impl=impl, **kw, **extra),
                                  argnums=(0, 1, 2))(x, y, t)

    return jax.jit(lambda x, y, t: {"dense": value_and_grads(x, y, t, "autodiff"),
                                    "tiled": value_and_grads(x, y, t, "tiled",
                                                             block_size=block)})


def _dense_and_tiled(loss, block, *args, **kw):
    return _jitted(loss, block, tuple(sorted(kw.items())))(*args)


@functools.cache
def _jitted_dense(loss, kw_items):
    """The value and gradients of impl="autodiff" alone, jitted."""
    kw = dict(kw_items)
    return jax.jit(jax.value_and_grad(lambda *a: loss(*a, impl="autodiff", **kw),
                                      argnums=(0, 1, 2)))


def _assert_same(results, tol):
    (ld, gd), (lt, gt) = results["dense"], results["tiled"]
    assert _rel(lt, ld) <= tol
    for a, b in zip(gd, gt, strict=True):
        assert _rel(b, a) <= tol, (_rel(b, a), tol)


def _assert_float32(loss, x, y, third, results, block, direction="both", rounding=0.0):
    """Each ``(value, grads)`` in ``results`` within the float32 bounds of the float64 loss:
    the dense part of the float64 program of ``block`` (compiled by the float64 check of the
    same shape), or with ``block=None`` the float64 dense loss alone.

    ``rounding``: the gradients were rounded to a narrower dtype with this unit roundoff.
    """
    b = fb.bounds_for("clip" if loss is clip_loss else "nt_xent", x, y, third, direction)
    kw = {"direction": direction} if loss is clip_loss else {}
    with jax.enable_x64(True):
        args = jnp.asarray(x, jnp.float64), jnp.asarray(y, jnp.float64), jnp.float64(b.third)
        want_loss, want = (_jitted_dense(loss, tuple(kw.items()))(*args) if block is None
                           else _dense_and_tiled(loss, block, *args, **kw)["dense"])
    clipped = loss is clip_loss and b.scale == 100.0
    for name, (value, grads) in results.items():
        fb.assert_within(value, want_loss, b.loss, name)
        for g, w, rows, what in ((grads[0], want[0], b.rows_x, "first"),
                                 (grads[1], want[1], b.rows_y, "second")):
            w = np.asarray(w)
            fb.assert_rows_within(g, w, rows + rounding * 1.01 * np.linalg.norm(w, axis=1)
                                  / (1 - rounding), f"{name} grad {what}")
        if clipped:
            assert float(grads[2]) == 0.0
        else:
            fb.assert_within(grads[2], want[2], b.third_grad, f"{name} grad third")


# every size case for both directions; each one-sided loss on the uneven case (37, 8)
@pytest.mark.parametrize("n, block, direction", [(n, b, "both") for n, b in CASES] + [
    (37, 8, "x_to_y"), (37, 8, "y_to_x")])
def test_clip_tiled_equals_dense(n, block, direction):
    # float64 pins the algebra to round-off on every case
    with jax.enable_x64(True):
        x, y = _data(n, 12, jnp.float64)
        for log_scale in (np.log(14.3), np.log(100.0), np.log(300.0)):  # last two: clipped
            ls = jnp.asarray(log_scale, jnp.float64)
            _assert_same(_dense_and_tiled(clip_loss, block, x, y, ls, direction=direction),
                         1e-12)
    if n != 37:
        return
    # float32 on the uneven case: both within the derived bounds of the float64 loss
    x, y = _data(n, 12, jnp.float32)
    for log_scale in (np.log(14.3), np.log(100.0), np.log(300.0)):
        ls = jnp.float32(log_scale)
        _assert_float32(clip_loss, x, y, ls,
                        _dense_and_tiled(clip_loss, block, x, y, ls, direction=direction),
                        block, direction)


@pytest.mark.parametrize("n, block", CASES)
def test_nt_xent_tiled_equals_dense(n, block):
    with jax.enable_x64(True):
        z1, z2 = _data(n, 12, jnp.float64)
        for tau in (1.0, 0.1, 0.01):
            t = jnp.asarray(tau, jnp.float64)
            _assert_same(_dense_and_tiled(nt_xent, block, z1, z2, t), 1e-12)
    if n != 37:
        return
    z1, z2 = _data(n, 12, jnp.float32)
    for tau in (1.0, 0.1, 0.01):
        t = jnp.float32(tau)
        _assert_float32(nt_xent, z1, z2, t, _dense_and_tiled(nt_xent, block, z1, z2, t), block)


def test_clustered_data_at_scale_100_stays_exact():
    # Logits in one tile span ~200: an online log-sum-exp with a single shared shift would
    # underflow whole rows; the per-row and per-column statistics must not.
    x, y = _data(48, 16, jnp.float32, clustered=True)
    ls = jnp.float32(np.log(100.0))
    _assert_float32(clip_loss, x, y, ls, _dense_and_tiled(clip_loss, 16, x, y, ls), None)
    t = jnp.float32(0.01)
    _assert_float32(nt_xent, x, y, t, _dense_and_tiled(nt_xent, 16, x, y, t), None)


@pytest.mark.parametrize("loss", [clip_loss, nt_xent])
def test_bfloat16_inputs(loss):
    x, y = (a.astype(jnp.bfloat16) for a in _data(40, 16, jnp.float32))
    third = jnp.float32(np.log(100.0) if loss is clip_loss else 0.05)
    results = _dense_and_tiled(loss, 16, x, y, third)
    lt, gt = results["tiled"]
    assert lt.dtype == jnp.float32 and gt[0].dtype == jnp.bfloat16
    # The bfloat16 rows upcast exactly: the float32 bounds, plus the rounding of each gradient
    # entry to bfloat16 (unit roundoff 2^-8).
    _assert_float32(loss, np.asarray(x, np.float32), np.asarray(y, np.float32), third,
                    results, None, rounding=2.0**-8)


def _largest_intermediate(jaxpr) -> int:
    """Largest array (elements) produced anywhere in a jaxpr, sub-jaxprs included."""
    biggest = 0
    for eqn in jaxpr.eqns:
        for var in eqn.outvars:
            biggest = max(biggest, int(np.prod(getattr(var.aval, "shape", ()))))
        for param in eqn.params.values():
            subs = param if isinstance(param, (tuple, list)) else [param]
            for sub in subs:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    biggest = max(biggest, _largest_intermediate(inner))
    return biggest


@pytest.mark.parametrize("loss", [clip_loss, nt_xent])
def test_no_n_by_n_intermediate(loss):
    n, d, block = 2048, 8, 128
    x, y = _data(n, d, jnp.float32)
    third = jnp.log(20.0) if loss is clip_loss else 0.1
    rows = n if loss is clip_loss else 2 * n

    def f(x, y, t):
        return loss(x, y, t, impl="tiled", block_size=block)

    grad_fn = jax.grad(f, argnums=(0, 1, 2))
    largest = _largest_intermediate(jax.make_jaxpr(grad_fn)(x, y, third).jaxpr)
    assert largest <= max(rows * d, block * block)  # O(N d + b^2) ...
    dense = _largest_intermediate(jax.make_jaxpr(
        jax.grad(lambda *a: loss(*a, impl="autodiff"), argnums=(0, 1, 2)))(x, y, third).jaxpr)
    assert dense >= rows * rows  # ... where the dense loss holds N x N arrays
    # The compiled program agrees: its scratch memory is far below one N x N float32 array.
    stats = jax.jit(grad_fn).lower(x, y, third).compile().memory_analysis()
    if stats is not None:
        assert stats.temp_size_in_bytes < 4 * rows * rows / 8
        assert stats.temp_size_in_bytes <= 4 * 8 * (rows * d + rows + block * block)


def test_block_size_errors():
    x, y = _data(8, 4, jnp.float32)
    with pytest.raises(ValueError, match="only applies to impl='tiled'"):
        clip_loss(x, y, 1.0, impl="autodiff", block_size=4)
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        clip_loss(x, y, 1.0, impl="tiled", block_size=0)
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        nt_xent(x, y, 0.1, impl="tiled", block_size=2.5)


@pytest.mark.parametrize("loss", [clip_loss, nt_xent])
@pytest.mark.parametrize("n", [1024, 1000])  # 1000: the last block overlaps, nothing is padded
def test_backward_scratch_has_no_embedding_sized_array(loss, n):
    # Beyond its inputs and the gradients it returns, forward + backward holds only tiles,
    # blocks and per-row statistics: O(b^2 + b d + N), far below one (N, d) array.
    d, block = 1024, 64
    rows = n if loss is clip_loss else 2 * n
    spec = jax.ShapeDtypeStruct((n, d), jnp.float32)
    grad_fn = jax.grad(lambda *a: loss(*a, impl="tiled", block_size=block), argnums=(0, 1, 2))
    stats = jax.jit(grad_fn).lower(spec, spec, jax.ShapeDtypeStruct((), jnp.float32)).compile()
    stats = stats.memory_analysis()
    assert stats is not None  # the CPU backend the tests run on reports it
    floats = stats.temp_size_in_bytes / 4
    assert floats <= 16 * block * block + 8 * block * d + 32 * rows
    assert floats < n * d / 2
