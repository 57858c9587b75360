"""SigLIP's sigmoid loss against a slow reference, its scale clip and its bias gradient."""

import math

import jax
import jax.numpy as jnp
import numpy as np

from contrastive_jax.losses.siglip import siglip_loss


def reference(x, y, log_scale, bias, max_scale=100.0):
    """Pair by pair in float64 with math.log1p / math.exp (Zhai et al. 2023, eq. 1)."""
    n = len(x)
    xn = [v / max(np.linalg.norm(v), 1e-12) for v in x]
    yn = [v / max(np.linalg.norm(v), 1e-12) for v in y]
    scale = min(math.exp(log_scale), max_scale)
    total = 0.0
    for i in range(n):
        for j in range(n):
            z = 1.0 if i == j else -1.0
            t = z * (scale * float(np.dot(xn[i], yn[j])) + bias)
            total += math.log1p(math.exp(-t)) if t > -30 else -t  # -log sigmoid(t)
    return total / n


def test_siglip_matches_reference_and_bias_gradient():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((7, 5)), rng.standard_normal((7, 5))
    x[3] = 0.0  # a zero row stays finite
    with jax.enable_x64(True):
        for log_scale, bias in ((math.log(10.0), -10.0), (2.0, 0.5), (6.0, -3.0)):
            got = float(siglip_loss(jnp.asarray(x), jnp.asarray(y), log_scale, bias))
            assert abs(got - reference(x, y, log_scale, bias)) <= 1e-12 * max(1.0, abs(got))
        # dL/db = (1/N) sum_ij -z_ij sigmoid(-z_ij l_ij)
        grad = jax.grad(siglip_loss, argnums=3)(jnp.asarray(x), jnp.asarray(y), 1.0, -2.0)
        xn = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        yn = y / np.linalg.norm(y, axis=1, keepdims=True)
        logits = math.e * xn @ yn.T - 2.0
        z = 2 * np.eye(7) - 1
        expected = np.sum(-z / (1 + np.exp(z * logits))) / 7
        assert abs(float(grad) - expected) <= 1e-12
        # above the cap the scale is constant: zero gradient w.r.t. log_scale
        g = jax.grad(siglip_loss, argnums=2)(jnp.asarray(x), jnp.asarray(y), 5.0, 0.0)
        assert float(g) == 0.0


def test_siglip_float32_large_logits_finite():
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((16, 8)), jnp.float32)
    loss, grads = jax.value_and_grad(siglip_loss, argnums=(0, 2, 3))(x, x, 4.6, -10.0)
    assert np.isfinite(float(loss)) and all(np.all(np.isfinite(g)) for g in grads)
