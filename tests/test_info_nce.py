"""info_nce: one or several positives, masked candidates, stability, and input errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import float32_bounds as fb
import reference_losses as ref
from contrastive_jax.losses import info_nce

_jitted_info_nce = jax.jit(info_nce)


# The smallest, a middle and the largest shape (each shape compiles), any logits.
@given(st.sampled_from([(1, 2), (4, 7), (9, 12)]), st.floats(0.1, 60.0), st.integers(0, 2**16))
def test_matches_slow_reference(shape, spread, seed):
    anchors, candidates = shape
    rng = np.random.default_rng(seed)
    logits = (spread * rng.normal(size=(anchors, candidates))).astype(np.float32)
    pos = rng.integers(0, candidates, size=anchors)
    expected = ref.info_nce(logits, pos)
    # The logits are given exactly (no cosine or scale rounding): Delta_z = 0.
    bound = fb.loss_bound(fb.dense_info_nce(logits, pos, 1.0 / anchors), 0.0)
    fb.assert_within(_jitted_info_nce(logits, jnp.asarray(pos)), expected, bound)


def test_integer_and_one_hot_mask_agree():
    logits = jax.random.normal(jax.random.key(0), (6, 5)) * 4
    pos = jnp.array([0, 4, 2, 2, 1, 3])
    mask = jax.nn.one_hot(pos, 5, dtype=bool)
    # Indices become the same mask, then the same operations on the same values: equal bits.
    assert float(info_nce(logits, pos)) == float(info_nce(logits, mask))


@jax.jit
def _several_positives(logits, mask):
    """The loss, the gradient, -mean log of the positives' summed softmax (derivations §5.1)
    and (p - q) / A, q the softmax restricted to the positives: one program."""
    p = jax.nn.softmax(logits, axis=1)
    expected = -jnp.mean(jnp.log(jnp.sum(jnp.where(mask, p, 0.0), axis=1)))
    q = jnp.where(mask, p, 0.0) / jnp.sum(jnp.where(mask, p, 0.0), axis=1, keepdims=True)
    loss, grad = jax.value_and_grad(info_nce)(logits, mask)
    return loss, grad, expected, (p - q) / logits.shape[0]


def test_several_positives_is_minus_log_of_their_summed_probability():
    with jax.enable_x64(True):
        logits = jax.random.normal(jax.random.key(1), (4, 6), jnp.float64) * 3
        mask = jnp.zeros((4, 6), bool).at[:, 1].set(True).at[0, 4].set(True).at[3, 0].set(True)
        loss, grad, expected, expected_grad = _several_positives(logits, mask)
        np.testing.assert_allclose(loss, expected, rtol=1e-13)
        # Gradient: (p - q) / A with q the softmax restricted to the positives.
        np.testing.assert_allclose(grad, expected_grad, atol=1e-15)


def test_all_candidates_positive_gives_zero():
    assert float(info_nce(jnp.ones((2, 3)), jnp.ones((2, 3), bool))) == 0.0


def test_minus_inf_logits_are_excluded_with_zero_gradient():
    logits = jnp.array([[2.0, -jnp.inf, 0.5, 1.0]])
    loss, grad = jax.value_and_grad(info_nce)(logits, jnp.array([2]))
    kept = np.asarray(logits[:, [0, 2, 3]])
    bound = fb.loss_bound(fb.dense_info_nce(kept, [1], 1.0), 0.0)
    fb.assert_within(loss, ref.info_nce(kept, [1]), bound)
    assert grad[0, 1] == 0.0 and jnp.all(jnp.isfinite(grad))


def test_tiny_loss_keeps_relative_precision_in_float32():
    # Logit gap 25: the loss is log1p(3 e^-25) ~ 4.2e-11; lse - z_pos returns 0 in float32.
    logits = jnp.array([[25.0, 0.0, 0.0, 0.0]], jnp.float32)
    expected = np.log1p(3 * np.exp(-25.0))
    bound = fb.loss_bound(fb.dense_info_nce(logits, [0], 1.0), 0.0)
    assert bound < 2e-5 * expected  # relative precision kept, where the textbook form loses all
    fb.assert_within(info_nce(logits, jnp.array([0])), expected, bound)
    textbook = jax.nn.logsumexp(logits[0]) - logits[0, 0]
    assert float(textbook) == 0.0  # what the cancellation would have given


def test_huge_logits_do_not_overflow():
    logits = jnp.array([[1e4, 9e3, -1e4], [0.0, 5e3, 1.0]], jnp.float32)
    expected = ref.info_nce(logits, [1, 0])  # 0.5 (1e3 + 5e3) up to e^-1000
    bound = fb.loss_bound(fb.dense_info_nce(logits, [1, 0], 0.5), 0.0)
    fb.assert_within(info_nce(logits, jnp.array([1, 0])), expected, bound)
    assert jnp.all(jnp.isfinite(jax.grad(info_nce)(logits, jnp.array([1, 0]))))


def test_bfloat16_logits_are_computed_in_float32():
    logits = (jax.random.normal(jax.random.key(2), (3, 5)) * 30).astype(jnp.bfloat16)
    loss = info_nce(logits, jnp.array([0, 1, 2]))
    assert loss.dtype == jnp.float32
    # Cast exactly to float32 first, then the same operations on the same values: equal bits.
    assert float(loss) == float(info_nce(logits.astype(jnp.float32), jnp.array([0, 1, 2])))


def test_works_under_jit_with_traced_positives():
    logits = jax.random.normal(jax.random.key(3), (4, 4))
    pos = jnp.array([3, 2, 1, 0])
    # jit fuses differently from eager dispatch: both within the float32 bound of the exact loss.
    expected = ref.info_nce(np.asarray(logits), np.asarray(pos))
    bound = fb.loss_bound(fb.dense_info_nce(np.asarray(logits), np.asarray(pos), 0.25), 0.0)
    fb.assert_within(jax.jit(info_nce)(logits, pos), expected, bound, "jit")
    fb.assert_within(info_nce(logits, pos), expected, bound, "eager")


@pytest.mark.parametrize(
    "logits, positives, message",
    [
        (jnp.zeros((4,)), jnp.zeros((4,), int), "rank-2"),
        (jnp.zeros((3, 1)), jnp.zeros((3,), int), "at least 2 candidates"),
        (jnp.zeros((3, 4)), jnp.zeros((4,), int), r"shape \(anchors,\)"),
        (jnp.zeros((3, 4)), jnp.array([0, 4, 1]), r"\[0, 4\)"),
        (jnp.zeros((2, 4)), jnp.zeros((2, 4), bool).at[0, 1].set(True), r"row\(s\) \[1\]"),
        (jnp.zeros((2, 4)), jnp.zeros((2, 3), bool), "boolean positives mask"),
        (jnp.zeros((2, 4)), jnp.zeros((2,), jnp.float32), "integer indices"),
    ],
)
def test_bad_input_raises_value_error(logits, positives, message):
    with pytest.raises(ValueError, match=message):
        info_nce(logits, positives)
