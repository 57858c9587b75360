"""contrastive_jax.training.parameter_paths: one name per leaf, whatever holds the tree."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from contrastive_jax.training.parameter_paths import leaves_by_path, nested, path_keys, path_name


class Tower(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.blocks = nnx.List([nnx.Linear(2, 3, rngs=rngs), nnx.Linear(3, 2, rngs=rngs)])
        self.norm = nnx.BatchNorm(2, rngs=rngs)


def test_a_model_state_its_pure_dict_and_a_restored_tree_give_the_same_names():
    """The train state (``.value`` attributes), ``nnx.to_pure_dict`` (plain arrays) and a tree
    restored from a checkpoint (``{"value": array}`` dicts, with ``drop_value``) name each leaf
    ``blocks/0/kernel``; ``nested`` rebuilds the pure dict from the names."""
    state = nnx.state(Tower(nnx.Rngs(0)))
    pure = nnx.to_pure_dict(state)
    want = {"blocks/0/bias", "blocks/0/kernel", "blocks/1/bias", "blocks/1/kernel",
            "norm/bias", "norm/mean", "norm/scale", "norm/var"}
    from_state = leaves_by_path(state)
    from_pure = leaves_by_path(pure)
    restored = jax.tree.map(lambda a: {"value": np.asarray(a)}, pure)
    from_restored = leaves_by_path(restored, drop_value=True)
    assert set(from_state) == set(from_pure) == set(from_restored) == want
    for name in want:
        np.testing.assert_array_equal(from_state[name], from_pure[name])
        np.testing.assert_array_equal(from_restored[name], from_pure[name])
    assert set(leaves_by_path(restored)) == {f"{n}/value" for n in want}  # kept unless asked
    rebuilt = nested(from_pure)
    assert jax.tree.structure(rebuilt) == jax.tree.structure(pure)
    assert isinstance(next(iter(rebuilt["blocks"])), int)  # list indices as ints, as nnx's


def test_path_pieces():
    tree = {"a": [jnp.zeros(1), {"b": jnp.ones(2)}], "value": jnp.zeros(())}
    paths = [p for p, _ in jax.tree_util.tree_leaves_with_path(tree)]
    assert [path_name(p) for p in paths] == ["a/0", "a/1/b", "value"]
    assert [path_name(p, drop_value=True) for p in paths] == ["a/0", "a/1/b", "value"]
    assert [path_keys(p) for p in paths] == [("a", 0), ("a", 1, "b"), ("value",)]
    assert nested({"x/0": 1, "x/1": 2, "y": 3}) == {"x": {0: 1, 1: 2}, "y": 3}
