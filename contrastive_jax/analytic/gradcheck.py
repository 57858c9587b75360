"""Every closed-form gradient of docs/derivations.md against ``jax.grad`` of the library losses.

Each :class:`Check` draws random inputs, evaluates one formula of :mod:`contrastive_jax.analytic`
(or a hand-written backward pass of a loss) and the same quantity by automatic differentiation of
the corresponding loss in :mod:`contrastive_jax.losses`, and reports the normwise relative error
``||formula - autodiff||_2 / ||autodiff||_2`` (the worst over several shapes and seeds). For the
identity of docs/derivations.md §12.1 (``u . grad_u l = 0``) the error is the normalised residual
``|u . g| / (||u|| ||g||)``.
``experiments/gradcheck.py`` prints the table; the tests
assert every float64 row is below 1e-10.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from contrastive_jax.analytic import anchor, batch
from contrastive_jax.errors import InputError
from contrastive_jax.losses import clip_loss, info_nce, l2_normalize, l2_normalize_vjp, nt_xent
from contrastive_jax.losses.parts.similarity import similarities

Array = jax.Array
Pair = tuple[Array, Array]


@dataclasses.dataclass(frozen=True)
class Check:
    """One formula: ``fn(key, dtype, n, d) -> (formula, autodiff)``; n candidates/rows, d dims."""

    name: str
    source: str
    fn: Callable[[Array, jnp.dtype, int, int], Pair]
    identity: bool = False  # the "autodiff" value is a residual that should be 0


# ----------------------------------------------------------------------------- inputs


def _draws(key, dtype, n, d, tau_range=(0.1, 1.0)):
    ku, kv, kt, kp = jax.random.split(key, 4)
    u = jax.random.normal(ku, (d,), dtype)
    v = jax.random.normal(kv, (n, d), dtype)
    tau = jax.random.uniform(kt, (), dtype, *tau_range)
    pos = jax.random.randint(kp, (), 0, n)
    return u, v, tau, pos


def _anchor_loss(u, v, pos, tau):
    """The single-anchor loss of docs/derivations.md §4.1 through the library: cosines via
    l2_normalize, info_nce."""
    c = l2_normalize(v) @ l2_normalize(u)
    return info_nce((c / tau)[None], pos[None])


def _sym_loss_on_logits(z):
    idx = jnp.arange(z.shape[0])
    return 0.5 * (info_nce(z, idx) + info_nce(z.T, idx))


# ----------------------------------------------------------------------------- checks


def _anchor_logit_grad(key, dtype, n, d):
    z = 3.0 * jax.random.normal(key, (n,), dtype)
    pos = jnp.asarray(n // 2)
    return anchor.infonce_logit_grad(z, pos), jax.grad(
        lambda z: info_nce(z[None], pos[None]))(z)


def _anchor_similarity_grad(key, dtype, n, d):
    u, v, tau, pos = _draws(key, dtype, n, d)
    c = anchor.cosine_similarities(u, v)
    return anchor.infonce_similarity_grad(c, pos, tau), jax.grad(
        lambda c: info_nce((c / tau)[None], pos[None]))(c)


def _cosine_grads(key, dtype, n, d):
    u, v, _, _ = _draws(key, dtype, 1, d)
    cos = lambda a, b: jnp.dot(l2_normalize(a), l2_normalize(b))  # noqa: E731
    formula = jnp.concatenate(anchor.cosine_grads(u, v[0]))
    return formula, jnp.concatenate(jax.grad(cos, argnums=(0, 1))(u, v[0]))


def _anchor_embedding_grad(key, dtype, n, d):
    u, v, tau, pos = _draws(key, dtype, n, d)
    return anchor.infonce_anchor_grad(u, v, pos, tau), jax.grad(_anchor_loss)(u, v, pos, tau)


def _candidate_grads(key, dtype, n, d):
    u, v, tau, pos = _draws(key, dtype, n, d)
    return (anchor.infonce_candidate_grads(u, v, pos, tau),
            jax.grad(_anchor_loss, argnums=1)(u, v, pos, tau))


def _softmax_weight_ratio(key, dtype, n, d):
    u, v, tau, _ = _draws(key, dtype, n, d)
    c = anchor.cosine_similarities(u, v)
    p = jax.nn.softmax(c / tau)
    return anchor.softmax_weight_ratio(c[:, None], c[None, :], tau), p[:, None] / p[None, :]


def _separated(key, dtype, n):
    """Similarities in [-1, 1] whose top two differ by at least 0.2 (unique arg-max)."""
    c = jax.random.uniform(key, (n,), dtype, -1.0, 0.6)
    return c.at[n // 3].set(0.8)


def _low_temperature_grad(key, dtype, n, d):
    c, tau, pos = _separated(key, dtype, n), 0.004, jnp.asarray(0)  # exp(-0.2/tau) ~ 2e-22
    return anchor.low_temperature_grad_limit(c, pos, tau), jax.grad(
        lambda c: info_nce((c / tau)[None], pos[None]))(c)


def _low_temperature_loss(key, dtype, n, d):
    c, tau, pos = _separated(key, dtype, n), 0.004, jnp.asarray(0)
    loss = info_nce((c / tau)[None], pos[None])
    return anchor.low_temperature_loss_limit(c, pos, tau)[None], loss[None]


def _high_temperature_grad(key, dtype, n, d):
    c, tau, pos = _separated(key, dtype, n), 1e13, jnp.asarray(1)
    return anchor.high_temperature_grad_limit(n, pos, tau).astype(dtype), jax.grad(
        lambda c: info_nce((c / tau)[None], pos[None]))(c)


def _symmetric_logit_grad(key, dtype, n, d):
    z = 5.0 * jax.random.normal(key, (n, n), dtype)
    return batch.symmetric_logit_grad(z), jax.grad(_sym_loss_on_logits)(z)


def _row_logit_grad(key, dtype, n, d):
    z = 5.0 * jax.random.normal(key, (n, n), dtype)
    return batch.row_logit_grad(z), jax.grad(lambda z: info_nce(z, jnp.arange(n)))(z)


def _unit_pair(key, dtype, n, d):
    ku, kv, kt = jax.random.split(key, 3)
    u = l2_normalize(jax.random.normal(ku, (n, d), dtype))
    v = l2_normalize(jax.random.normal(kv, (n, d), dtype))
    return u, v, jax.random.uniform(kt, (), dtype, 0.05, 1.0)


def _one_directional_anchor_grads(key, dtype, n, d):
    u, v, tau = _unit_pair(key, dtype, n, d)
    loss = lambda u: info_nce(similarities(u, v) / tau, jnp.arange(n))  # noqa: E731
    return batch.one_directional_anchor_grads(u, v, tau), jax.grad(loss)(u)


def _rescaled_anchor_grad(key, dtype, n, d):
    u, v, tau, pos = _draws(key, dtype, n, d)
    alpha = 7.5
    return (anchor.rescaled_anchor_grad(anchor.infonce_anchor_grad(u, v, pos, tau), alpha),
            jax.grad(_anchor_loss)(alpha * u, v, pos, tau))


def _anchor_grad_orthogonal_to_anchor(key, dtype, n, d):
    u, v, tau, pos = _draws(key, dtype, n, d)
    g = jax.grad(_anchor_loss)(u, v, pos, tau)
    residual = jnp.dot(u, g) / (jnp.linalg.norm(u) * jnp.linalg.norm(g))
    return jnp.zeros((1,), dtype), residual[None]


def _linear_weight_grad(key, dtype, n, d):
    kw, kx, k = jax.random.split(key, 3)
    _, v, tau, pos = _draws(k, dtype, n, d)
    w = jax.random.normal(kw, (d, d + 3), dtype)
    x = jax.random.normal(kx, (d + 3,), dtype)
    formula = anchor.linear_weight_grad(anchor.infonce_anchor_grad(w @ x, v, pos, tau), x)
    return formula, jax.grad(lambda w: _anchor_loss(w @ x, v, pos, tau))(w)


def _temperature_grad(key, dtype, n, d):
    u, v, tau, pos = _draws(key, dtype, n, d)
    c = anchor.cosine_similarities(u, v)
    autodiff = jax.grad(lambda t: info_nce((c / t)[None], pos[None]))(tau)
    return anchor.temperature_grad(c, pos, tau)[None], autodiff[None]


def _anchor_log_scale_grad(key, dtype, n, d):
    u, v, tau, pos = _draws(key, dtype, n, d)
    c, t = anchor.cosine_similarities(u, v), -jnp.log(tau)
    autodiff = jax.grad(lambda t: info_nce((c * jnp.exp(t))[None], pos[None]))(t)
    return anchor.anchor_log_scale_grad(c, pos, t)[None], autodiff[None]


def _clip_log_scale_grad(key, dtype, n, d):
    u, v, tau = _unit_pair(key, dtype, n, d)
    log_s = -jnp.log(tau)
    z = similarities(u, v) / tau
    formula = batch.batch_log_scale_grad(z, batch.symmetric_logit_grad(z))
    autodiff = jax.grad(clip_loss, argnums=2)(u, v, log_s, impl="autodiff")
    return formula[None], autodiff[None]


def _normalized_embedding_grads(key, dtype, n, d):
    u, v, tau = _unit_pair(key, dtype, n, d)
    z = similarities(u, v) / tau
    formula = batch.normalized_embedding_grads(u, v, batch.symmetric_logit_grad(z), 1 / tau)
    autodiff = jax.grad(lambda u, v: _sym_loss_on_logits(similarities(u, v) / tau),
                        argnums=(0, 1))(u, v)
    return jnp.concatenate(formula), jnp.concatenate(autodiff)


def _raw_embedding_grads(key, dtype, n, d):
    ku, kv, kt = jax.random.split(key, 3)
    u = 3.0 * jax.random.normal(ku, (n, d), dtype)
    v = 0.5 * jax.random.normal(kv, (n, d), dtype)
    tau = jax.random.uniform(kt, (), dtype, 0.05, 1.0)
    formula = batch.symmetric_embedding_grads(u, v, tau)
    autodiff = jax.grad(clip_loss, argnums=(0, 1))(u, v, -jnp.log(tau), impl="autodiff")
    return jnp.concatenate(formula), jnp.concatenate(autodiff)


def _projection_through_normalization(key, dtype, n, d):
    kx, kg = jax.random.split(key)
    x = 2.0 * jax.random.normal(kx, (n, d), dtype)
    g = jax.random.normal(kg, (n, d), dtype)
    return batch.project_through_normalization(x, g), jax.vjp(l2_normalize, x)[1](g)[0]


def _dot_product_anchor_grad(key, dtype, n, d):
    u, v, tau, pos = _draws(key, dtype, n, d)
    u = 0.3 * u
    loss = lambda u: info_nce((v @ u / tau)[None], pos[None])  # noqa: E731
    return anchor.dot_product_anchor_grad(u, v, pos, tau), jax.grad(loss)(u)


def _dot_product_ray_derivative(key, dtype, n, d):
    u, v, tau, pos = _draws(key, dtype, n, d)
    u = 0.3 * u
    loss = lambda a: info_nce((v @ (a * u) / tau)[None], pos[None])  # noqa: E731
    return (anchor.dot_product_ray_derivative(u, v, pos, tau)[None],
            jax.grad(loss)(jnp.asarray(1.0, dtype))[None])


def _nt_xent_logits(key, dtype, n, d):
    z = l2_normalize(jax.random.normal(key, (2 * n, d), dtype))
    s = similarities(z, z) / 0.3
    m = 2 * n
    eye = jnp.eye(m, dtype=bool)
    partners = (jnp.arange(m) + n) % m
    loss = lambda s: info_nce(jnp.where(eye, -jnp.inf, s), partners)  # noqa: E731
    return batch.nt_xent_logit_grad(s), jax.grad(loss)(s)


def _custom_backward(loss, impl, **kwargs):
    """A loss's custom backward pass (impl) against autodiff of its dense form."""

    def check(key, dtype, n, d):
        kx, ky, kt = jax.random.split(key, 3)
        x = jax.random.normal(kx, (n, d), dtype).at[0].set(0.0)  # a zero row: the eps branch
        y = x + 0.5 * jax.random.normal(ky, (n, d), dtype)
        t = (jax.random.uniform(kt, (), dtype, 0.0, 4.5) if loss is clip_loss
             else jax.random.uniform(kt, (), dtype, 0.05, 1.0))
        grads = [jax.grad(loss, argnums=(0, 1, 2))(x, y, t, impl=i, **kw)
                 for i, kw in ((impl, kwargs), ("autodiff", {}))]
        flat = [jnp.concatenate([g[0].ravel(), g[1].ravel(), g[2][None]]) for g in grads]
        return flat[0], flat[1]

    return check


def _normalize_vjp(key, dtype, n, d):
    kx, kg = jax.random.split(key)
    x = jax.random.normal(kx, (n, d), dtype).at[-1].set(0.0)
    g = jax.random.normal(kg, (n, d), dtype)
    return l2_normalize_vjp(x, g), jax.vjp(l2_normalize, x)[1](g)[0]


CHECKS: tuple[Check, ...] = (
    Check("grad_z l = p - y", "derivations §4.2", _anchor_logit_grad),
    Check("grad_c l = (p - y)/tau", "derivations §4.3", _anchor_similarity_grad),
    Check("grad_u c, grad_v c (cosine)", "derivations §3.1", _cosine_grads),
    Check("grad_u l (anchor)", "derivations §4.4", _anchor_embedding_grad),
    Check("grad_{v_j} l (candidates)", "derivations §4.5", _candidate_grads),
    Check("p_j/p_k = exp((c_j - c_k)/tau)", "derivations §7.1", _softmax_weight_ratio),
    Check("tau->0 grad (e_j* - e_pos)/tau, tau=0.004", "derivations §7.2", _low_temperature_grad),
    Check("tau->0 loss hinge/tau, tau=0.004", "derivations §7.2", _low_temperature_loss),
    Check("tau->inf grad (1/K - y)/tau, tau=1e13", "derivations §7.3", _high_temperature_grad),
    Check("Gamma = (P_r + P_c - 2I)/(2N)", "derivations §8.3", _symmetric_logit_grad),
    Check("dL_x->y/dS = (P - I)/B", "derivations §8.2", _row_logit_grad),
    Check("grad_{u_i} L_x->y = (sum_j p_ij v_j - v_i)/(B tau)",
          "derivations §8.2", _one_directional_anchor_grads),
    Check("grad l(alpha u) = grad l(u)/alpha", "derivations §12.1", _rescaled_anchor_grad),
    Check("u . grad_u l = 0 (residual u.g/|u||g|)",
          "derivations §12.1", _anchor_grad_orthogonal_to_anchor, identity=True),
    Check("grad_W l = (grad_u l) x^T", "derivations §12.2", _linear_weight_grad),
    Check("dl/dtau = (c_pos - sum p c)/tau^2", "derivations §7.4", _temperature_grad),
    Check("dl/dt = (sum p c - c_pos)/tau, tau = e^-t", "derivations §7.5", _anchor_log_scale_grad),
    Check("clip dL/dlog_scale = sum Gamma * Z", "derivations §8.5", _clip_log_scale_grad),
    Check("grad_U_hat = Gamma V_hat/tau, grad_V_hat = Gamma^T U_hat/tau",
          "derivations §8.4", _normalized_embedding_grads),
    Check("grad_u_i through normalisation (full clip backward)", "derivations §8.4",
          _raw_embedding_grads),
    Check("(I - u_hat u_hat^T) g/|u|", "derivations §2.2", _projection_through_normalization),
    Check("dot-product grad_u l = sum (p - y) v/tau", "derivations §12.4",
          _dot_product_anchor_grad),
    Check("dot-product d l(alpha u)/d alpha = sum p z - z_pos", "derivations §12.4",
          _dot_product_ray_derivative),
    Check("NT-Xent dL/dS = (P - Y)/(2N), self masked", "derivations §9.2", _nt_xent_logits),
    Check("clip_loss impl='dense_vjp' backward (x, y, log_scale)",
          "derivations §8.6",
          _custom_backward(clip_loss, "dense_vjp")),
    Check("nt_xent impl='dense_vjp' backward (z1, z2, tau)",
          "derivations §9.3-9.4",
          _custom_backward(nt_xent, "dense_vjp")),
    Check("clip_loss impl='tiled' backward, block 2 (x, y, log_scale)",
          "derivations §13.3",
          _custom_backward(clip_loss, "tiled", block_size=2)),
    Check("nt_xent impl='tiled' backward, block 4 (z1, z2, tau)",
          "derivations §13.3",
          _custom_backward(nt_xent, "tiled", block_size=4)),
    Check("l2_normalize_vjp (incl. a zero row)", "derivations §2.2-2.3", _normalize_vjp),
)


def relative_error(formula: Array, autodiff: Array, identity: bool = False) -> float:
    """``||formula - autodiff||_2 / ||autodiff||_2``; for identities, ``||residual||_2``."""
    formula, autodiff = np.asarray(formula, np.float64), np.asarray(autodiff, np.float64)
    if formula.shape != autodiff.shape:
        raise InputError(f"shape mismatch {formula.shape} vs {autodiff.shape}")
    diff = float(np.linalg.norm((formula - autodiff).ravel()))
    if identity:
        return diff
    return diff / max(float(np.linalg.norm(autodiff.ravel())), np.finfo(np.float64).tiny)


def check_error(
    check: Check, dtype: str, shapes: Sequence[tuple[int, int]], seeds: Sequence[int]
) -> float:
    """Max relative error of one check over shapes x seeds, in ``dtype`` (float32/float64)."""
    worst = 0.0
    fn = jax.jit(check.fn, static_argnums=(1, 2, 3))
    for n, d in shapes:
        for seed in seeds:
            formula, autodiff = fn(jax.random.key(seed), jnp.dtype(dtype), n, d)
            worst = max(worst, relative_error(formula, autodiff, check.identity))
    return worst


DEFAULT_SHAPES = ((3, 2), (33, 64))


def run_gradcheck(
    shapes: Sequence[tuple[int, int]] = DEFAULT_SHAPES,
    seeds: Sequence[int] = (0, 1),
    progress: Callable[[int, int, dict], None] | None = None,
) -> list[dict]:
    """One row per check: name, source, max relative error in float32 and in float64.

    ``progress(i, total, row)`` is called after each row (each check compiles once per
    shape and dtype).
    """
    rows = []
    for i, check in enumerate(CHECKS):
        row = {"formula": check.name, "source": check.source}
        row["float32"] = check_error(check, "float32", shapes, seeds)
        with jax.enable_x64(True):
            row["float64"] = check_error(check, "float64", shapes, seeds)
        rows.append(row)
        if progress is not None:
            progress(i + 1, len(CHECKS), row)
    return rows


def markdown_table(rows: Sequence[dict]) -> str:
    """The rows as a markdown table (errors in scientific notation)."""
    lines = ["| formula | source | max rel. error f32 | max rel. error f64 |",
             "| --- | --- | --- | --- |"]
    cell = lambda text: text.replace("|", "\\|")  # noqa: E731
    lines += [f"| {cell(r['formula'])} | {r['source']} | {r['float32']:.2e} | {r['float64']:.2e} |"
              for r in rows]
    return "\n".join(lines)
