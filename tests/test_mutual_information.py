"""mi_lower_bound = log N - L (docs/derivations.md §15)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contrastive_jax.losses import clip_loss, mi_lower_bound


def test_value():
    np.testing.assert_allclose(mi_lower_bound(1.5, 64), np.log(64) - 1.5, rtol=1e-7)


def test_never_above_log_n_for_a_real_loss():
    x = jax.random.normal(jax.random.key(0), (32, 8))
    # Perfectly aligned pairs at the largest scale: the loss is ~0 and the bound ~log 32.
    bound = mi_lower_bound(clip_loss(x, x, jnp.log(100.0), direction="x_to_y"), 32)
    assert float(bound) <= np.log(32) + 1e-6
    assert float(bound) > np.log(32) - 0.5


@pytest.mark.parametrize("n", [1, 0, 2.5, True])
def test_bad_num_candidates(n):
    with pytest.raises(ValueError, match="num_candidates"):
        mi_lower_bound(1.0, n)
