"""The train state: a plain pytree that ``jit``, ``shard_map`` and orbax see as arrays.

:class:`TrainState` holds the step counter, the model split by Flax NNX into its parameters
(``params``) and the rest of its state (``rest``: BatchNorm statistics, ...), the optimiser
state, the base random key, the non-finite step counters, and ``extra``: whatever the method
keeps besides the model (:meth:`~contrastive_jax.training.methods.Method.init_extra`; MoCo's
key encoder and queue). The graph definition is static and kept apart.
"""

from __future__ import annotations

import hashlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax.training.methods import Method
from contrastive_jax.training.models import architecture_block, build_model
from contrastive_jax.training.models.locked_towers import check_frozen, frozen_names
from contrastive_jax.training.step.optimizers import build_optimizer
from contrastive_jax.training.step.state_sharding import state_shardings


@struct.dataclass
class TrainState:
    """Everything a step reads and writes; saved whole in every checkpoint."""

    step: jax.Array  # completed steps, int32
    params: Any  # nnx.Param leaves of the model
    rest: Any  # the model's other state (BatchNorm statistics)
    opt_state: Any
    rng: jax.Array  # raw key data; the step's key is fold_in(rng, step)
    skipped: jax.Array  # steps skipped for a non-finite loss or gradient, int32
    skipped_in_a_row: jax.Array
    extra: dict[str, Any]  # the method's own state


def create_state(config, steps: int, method: Method
                 ) -> tuple[nnx.GraphDef, TrainState, optax.GradientTransformation]:
    """``(graphdef, fresh state, optimiser)`` for ``config`` trained for ``steps`` steps.

    The parameters are freshly initialised (``config.model.init_from`` is applied by the
    trainer when a run starts, :mod:`contrastive_jax.training.run.init_from`); those named by
    ``config.model.frozen`` get no optimiser state
    (:mod:`~contrastive_jax.training.models.locked_towers`)."""
    frozen = frozen_names(config.model)
    model = build_model(architecture_block(config.model), nnx.Rngs(config.seed))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    check_frozen(frozen, params)
    tx = build_optimizer(config.optimizer, steps, params, frozen)
    def zero():  # one buffer per leaf: the step donates the state, and XLA cannot donate a
        return jnp.zeros((), jnp.int32)  # buffer that backs two of its inputs

    state = TrainState(step=zero(), params=params, rest=rest, opt_state=tx.init(params),
                       rng=jax.random.key_data(jax.random.key(config.seed)), skipped=zero(),
                       skipped_in_a_row=zero(),
                       extra=method.init_extra(model, params, rest, config))
    return graphdef, state, tx


def abstract_state(config, steps: int, method: Method, mesh: Mesh
                   ) -> tuple[nnx.GraphDef, TrainState, optax.GradientTransformation, TrainState]:
    """``(graphdef, state, optimiser, shardings)``: the state :func:`create_state` makes, as
    ``jax.ShapeDtypeStruct`` leaves (nothing is initialised: ``jax.eval_shape``) placed by
    ``config.sharding`` on ``mesh``
    (:func:`~contrastive_jax.training.step.state_sharding.state_shardings`): what a step is
    compiled ahead of time for (the plan, the model-FLOPs count)."""
    built = {}

    def build():
        built["graphdef"], state, built["tx"] = create_state(config, steps, method)
        return state

    abstract = jax.eval_shape(build)
    shardings = state_shardings(config.get("sharding"), mesh, abstract)
    state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                         abstract, shardings)
    return built["graphdef"], state, built["tx"], shardings


@jax.jit
def all_finite(tree) -> jax.Array:
    """Whether every floating-point number in ``tree`` is finite (a boolean scalar)."""
    leaves = [jnp.isfinite(x).all() for x in jax.tree.leaves(tree)
              if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def replicated(mesh: Mesh, tree):
    """A sharding for every leaf of ``tree``: replicated on every device of ``mesh``."""
    return jax.tree.map(lambda _: NamedSharding(mesh, P()), tree)


def host_value(leaf) -> np.ndarray:
    """The whole of ``leaf`` as a NumPy array on this host, however it is sharded (a leaf split
    over several processes' devices, as under FSDP, is all-gathered: every process must call)."""
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
        if leaf.sharding.is_fully_replicated:
            return np.asarray(leaf.addressable_data(0))
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
    return np.asarray(leaf)


def params_digest(state: TrainState) -> str:
    """SHA-256 of the parameters and the other model state (BatchNorm statistics), leaf by leaf
    in tree order: equal digests mean bit-identical models."""
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves((state.params, state.rest)):
        value = host_value(leaf)
        digest.update(str((value.shape, value.dtype.str)).encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    return digest.hexdigest()
