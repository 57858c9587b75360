"""An encoder f followed by a projection head g: SimCLR's and MoCo's model ([SimCLR] §2.1;
docs/derivations.md §9.1); with a predictor, MoCo v3's query encoder ([MoCoV3] §3).

The methods :class:`contrastive_jax.training.methods.simclr.SimCLR`,
:class:`contrastive_jax.training.methods.momentum_contrast.MoCo` and
:class:`contrastive_jax.training.methods.moco_v3.MoCoV3` train it
(``model.name = "projected_encoder"``); the module itself knows nothing of the objective.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models.dropout import apply_encoder
from contrastive_jax.training.models.precision import up_to_float32


class ProjectedEncoder(nnx.Module):
    """``h = f(x)`` (the representation kept for evaluation), ``z = g(h)`` (fed to the loss).

    [SimCLR] §4.2 (docs/derivations.md §9.1 step 2): the projection head is discarded after
    pre-training and f is kept as the backbone. With ``learn_temperature`` the module also holds
    ``log_scale = log(1 / tau)``, a parameter trained with the rest (the temperature ablation);
    otherwise tau is fixed by the loss config. MoCo's query encoder is the same module; its key
    encoder is a copy of the parameters kept in the train state
    (:mod:`contrastive_jax.training.methods.momentum_contrast`). ``z`` and ``h`` leave the
    module in float32 (or float64) whatever the compute dtype (:func:`.precision.up_to_float32`).

    ``predictor`` (``model.predictor``; ``None`` by default): a second head ``p`` on ``z`` that
    ``__call__`` does not run; :meth:`predict` does. MoCo v3's queries are ``p(g(f(x)))`` and its
    momentum keys ``g(f(x))`` ([MoCoV3] Algorithm 1;
    :mod:`contrastive_jax.training.methods.moco_v3`).
    """

    def __init__(self, encoder: nnx.Module, head: nnx.Module, *, learn_temperature: bool = False,
                 init_temperature: float = 0.1, predictor: nnx.Module | None = None):
        if init_temperature <= 0:
            raise ConfigError(f"init_temperature must be > 0; got {init_temperature}")
        self.encoder, self.head, self.predictor = encoder, head, predictor
        # optional learnable log-scale s = 1 / tau (clipped at 100 by the objective,
        # docs/derivations.md §7.6)
        self.log_scale = nnx.Param(jnp.asarray(-math.log(init_temperature), jnp.float32)
                                   ) if learn_temperature else None

    def __call__(self, x: jax.Array, *, train: bool,
                 dropout_keys: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """``(z, h)``: projections ``(B, head.out_features)`` and representations;
        ``dropout_keys (B,)``: one key per example for encoders with dropout."""
        h = apply_encoder(self.encoder, x, train, dropout_keys)
        return up_to_float32(self.head(h, train=train)), up_to_float32(h)

    def predict(self, z: jax.Array, *, train: bool) -> jax.Array:
        """The predictor's output ``p(z)`` ``(B, predictor.out_features)``, float32; a
        :class:`ConfigError` for a model built without ``model.predictor``."""
        if self.predictor is None:
            raise ConfigError("this projected encoder has no predictor: set model.predictor "
                              "(e.g. {'hidden': 4096, 'out': 256, 'layers': 2, "
                              "'out_batch_norm': True})")
        return up_to_float32(self.predictor(z, train=train))

    def representations(self, x: jax.Array) -> jax.Array:
        """Representations ``h = f(x)`` ``(B, encoder.features)`` in inference mode (no
        dropout, BatchNorm's running statistics) for probes, float32."""
        return up_to_float32(apply_encoder(self.encoder, x, False, None))
