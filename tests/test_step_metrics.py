"""contrastive_top1 and the embedding norms against hand-built cases and an obvious loop."""

import jax.numpy as jnp
import numpy as np
import pytest

from contrastive_jax.training.methods.step_metrics import contrastive_top1, first_anchors, mean_norm


def slow_top1(a, c, positive, exclude=None, a_ids=None, c_ids=None):
    """Row by row: right when no negative is at least as close as the closest positive."""
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    c = c / np.linalg.norm(c, axis=1, keepdims=True)
    right = 0
    for i in range(len(a)):
        sims = c @ a[i]
        candidates = [k for k in range(len(c)) if exclude is None or k != exclude[i]]
        if a_ids is None:
            pos = [int(positive[i])]
        else:
            pos = [k for k in candidates if c_ids[k] == a_ids[i]]
        best = max(sims[k] for k in pos)
        right += all(sims[k] < best for k in candidates if k not in pos)
    return right / len(a)


def test_hand_built_ties_count_as_misses_unless_the_tie_is_a_positive():
    # anchors 0 and 1 point at candidate 0, an exact duplicate of candidate 1
    a = jnp.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    c = jnp.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    positive = jnp.array([0, 1, 2])
    # by index: anchors 0 and 1 tie with a negative (miss), anchor 2 is right
    assert float(contrastive_top1(a, c, positive)) == pytest.approx(1 / 3)
    # by id: candidates 0 and 1 share an id, so the tie is between positives
    ids = jnp.array([7, 7, 3])
    assert float(contrastive_top1(a, c, positive, anchor_ids=ids,
                                  candidate_ids=ids)) == pytest.approx(1.0)
    # the anchor itself excluded (NT-Xent's self mask): anchor 0 keeps candidate 1 as positive
    assert float(contrastive_top1(a, c, positive=jnp.array([1, 0, 2]),
                                  exclude=jnp.array([0, 1, 2]), anchor_ids=ids,
                                  candidate_ids=ids)) == pytest.approx(2 / 3)


@pytest.mark.parametrize("with_ids", [False, True])
@pytest.mark.parametrize("with_exclude", [False, True])
def test_matches_a_row_by_row_loop(with_ids, with_exclude):
    rng = np.random.default_rng(3)
    a = rng.integers(-2, 3, (40, 3)).astype(np.float32)  # small integers: exact ties occur
    a[np.all(a == 0, axis=1)] = 1.0
    c = np.concatenate([a, rng.integers(-2, 3, (24, 3)).astype(np.float32)])
    c[np.all(c == 0, axis=1)] = 1.0
    positive = np.arange(40)
    exclude = (np.arange(40) + 40) % 64 if with_exclude else None
    a_ids = rng.integers(0, 6, 40) if with_ids else None
    c_ids = np.concatenate([a_ids, rng.integers(0, 6, 24)]) if with_ids else None
    want = slow_top1(a, c, positive, exclude, a_ids, c_ids)
    got = contrastive_top1(jnp.asarray(a), jnp.asarray(c), jnp.asarray(positive),
                           None if exclude is None else jnp.asarray(exclude),
                           anchor_ids=None if a_ids is None else jnp.asarray(a_ids),
                           candidate_ids=None if c_ids is None else jnp.asarray(c_ids))
    assert float(got) == pytest.approx(want, abs=1e-7)
    assert 0.0 < want < 1.0  # the case is not trivial


def test_norms_and_anchor_count():
    z = jnp.array([[3.0, 4.0], [0.0, 2.0]])
    assert float(mean_norm(z)) == pytest.approx(3.5)
    assert first_anchors(1000) == 256 and first_anchors(100) == 100
    # dot products: row 1's positive (4) loses to row 0 (8); cosines: 1 beats 0.8
    assert float(contrastive_top1(z, z, jnp.arange(2), normalize=False)) == pytest.approx(0.5)
    assert float(contrastive_top1(z, z, jnp.arange(2))) == pytest.approx(1.0)
    assert float(mean_norm(jnp.zeros((3, 2)))) == 0.0
