"""optax optimisers from a config: AdamW / LARS / SGD, warmup + cosine, decay masks.

The ``optimizer`` block of a config::

    name            "adamw" | "lars" | "sgd"
    learning_rate   peak rate, reached after ``warmup_steps``, cosine-decayed to
                    ``end_lr_fraction * learning_rate`` at the last step
    weight_decay    decoupled weight decay, applied to kernels and embeddings only
    b1, b2, eps     AdamW; ``momentum`` for LARS and SGD (``nesterov`` for SGD)
    grad_clip_norm  clip the global gradient norm first (0: off)
    temperature_lr  peak rate of the log-temperature and the SigLIP bias (0: the main rate);
                    they are never decayed

Frozen parameters (``config.model.frozen``, :mod:`contrastive_jax.training.models.locked_towers`)
are labelled ``"frozen"`` in an ``optax.multi_transform`` and get ``optax.set_to_zero()``: the
other labels' states hold ``optax.MaskedNode()`` (no array) in their place and
``set_to_zero`` keeps no state, so the optimiser state has no entry for them, and they get no
weight decay.

Why the mask (docs/derivations.md §12.3): a normalised loss is invariant to the scale of the weights
feeding a normalisation, so its gradient is orthogonal to them and the weight norm only grows; the
effective step is ``lr / ||w||^2``. Weight decay on those kernels keeps the norm, hence the
effective learning rate, in check. Biases, normalisation scales and offsets, position embeddings,
the log-temperature and the SigLIP bias are not decayed: shrinking them changes the function, not
just its parameterisation. LARS (SimCLR's optimiser) also excludes them from the trust-ratio
adaptation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.parameter_paths import path_keys

OPTIMIZERS = ("adamw", "lars", "sgd")
DECAYED = ("kernel", "embedding")   # leaf names that get weight decay
TEMPERATURE = ("log_scale", "bias")  # top-level leaves of the dual encoder
DEFAULTS = {"name": "adamw", "learning_rate": 1e-3, "warmup_steps": 0, "end_lr_fraction": 0.0,
            "weight_decay": 0.0, "b1": 0.9, "b2": 0.999, "eps": 1e-8, "momentum": 0.9,
            "nesterov": False, "trust_coefficient": 0.001, "grad_clip_norm": 0.0,
            "temperature_lr": 0.0}


def decay_mask(params):
    """True for kernels and embeddings (decayed), False for everything else."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: bool(path_keys(path)) and path_keys(path)[-1] in DECAYED, params)


def is_temperature(path) -> bool:
    """The dual encoder's ``log_scale`` and SigLIP ``bias`` (top-level parameters)."""
    names = path_keys(path)
    return len(names) == 1 and names[0] in TEMPERATURE


def schedule(peak: float, total_steps: int, warmup_steps: int,
             end_fraction: float = 0.0) -> optax.Schedule:
    """Linear warmup from 0 to ``peak`` over ``warmup_steps``, cosine to ``end_fraction * peak``."""
    if total_steps < 1:
        raise ConfigError(f"total_steps must be >= 1; got {total_steps}")
    if not 0 <= warmup_steps < total_steps:
        raise ConfigError(f"warmup_steps must lie in [0, total_steps={total_steps}); "
                         f"got {warmup_steps}")
    if not 0 < peak < math.inf:  # nan fails both comparisons
        raise ConfigError(f"learning_rate must be a finite number > 0; got {peak}")
    return optax.warmup_cosine_decay_schedule(0.0, peak, warmup_steps, total_steps,
                                              end_value=end_fraction * peak)


def build_optimizer(config: Mapping[str, Any], total_steps: int, params,
                    frozen: Sequence[str] = ()) -> optax.GradientTransformation:
    """The optimiser a config's ``optimizer`` block describes (see the module docstring);
    ``frozen``: top-level entries of ``params`` that never change (no state, no update)."""
    unknown = sorted(set(config) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"unknown optimizer settings {unknown}; valid: {sorted(DEFAULTS)}")
    c = {**DEFAULTS, **dict(config)}
    if c["name"] not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {c['name']!r}; valid: {list(OPTIMIZERS)}")
    lr = schedule(c["learning_rate"], total_steps, c["warmup_steps"], c["end_lr_fraction"])
    main = _main_optimizer(c, lr, decay_mask(params))
    labels = jax.tree_util.tree_map_with_path(lambda path, _: _label(path, frozen), params)
    used = set(jax.tree.leaves(labels))
    if used - {"main"}:
        transforms = {"main": main, "frozen": optax.set_to_zero()}
        if "temperature" in used:
            t_lr = schedule(c["temperature_lr"] or c["learning_rate"], total_steps,
                            c["warmup_steps"], c["end_lr_fraction"])
            transforms["temperature"] = optax.adam(t_lr, b1=c["b1"], b2=c["b2"], eps=c["eps"])
        main = optax.multi_transform({k: v for k, v in transforms.items() if k in used}, labels)
    if c["grad_clip_norm"]:
        main = optax.chain(optax.clip_by_global_norm(c["grad_clip_norm"]), main)
    return main


def _label(path, frozen: Sequence[str]) -> str:
    """``"frozen"`` under a frozen entry (a top-level name or a ``/``-separated path such as
    ``"encoder/embed"``), else ``"temperature"`` or ``"main"``."""
    keys = tuple(str(k) for k in path_keys(path))
    if any(keys[:len(p)] == p for p in (tuple(name.split("/")) for name in frozen)):
        return "frozen"
    return "temperature" if is_temperature(path) else "main"


def _main_optimizer(c, lr, mask) -> optax.GradientTransformation:
    if c["name"] == "adamw":
        return optax.adamw(lr, b1=c["b1"], b2=c["b2"], eps=c["eps"],
                           weight_decay=c["weight_decay"], mask=mask)
    if c["name"] == "lars":
        return optax.lars(lr, weight_decay=c["weight_decay"], weight_decay_mask=mask,
                          trust_coefficient=c["trust_coefficient"], trust_ratio_mask=mask,
                          momentum=c["momentum"])
    chain = [optax.add_decayed_weights(c["weight_decay"], mask)] if c["weight_decay"] else []
    return optax.chain(*chain, optax.sgd(lr, momentum=c["momentum"], nesterov=c["nesterov"]))


def current_learning_rate(config: Mapping[str, Any], total_steps: int, step) -> jax.Array:
    """The main learning rate at ``step`` (for logging)."""
    c = {**DEFAULTS, **dict(config)}
    return schedule(c["learning_rate"], total_steps, c["warmup_steps"], c["end_lr_fraction"])(step)


def clamp_log_scale(params, max_scale: float):
    """The learnable ``log_scale`` clamped just below ``log(max_scale)`` after each update.

    The loss already caps the scale with zero gradient where the cap binds (``log_scale >=
    log(max_scale)``; docs/derivations.md, the logit scale); clamping the parameter too, as
    open_clip does, keeps it from drifting above the cap. It is clamped to the largest value of
    its dtype *below* ``log(max_scale)`` (scale ``100 - 5e-5`` in float32), where the cap does
    not bind, so the gradient reaches it and it moves down again as soon as the gradient says
    so; clamped at ``log(max_scale)`` itself it would stay there for good.
    """
    top = math.log(max_scale)

    def below_top(dtype):
        value = np.asarray(top, dtype)
        return np.nextafter(value, np.asarray(-np.inf, dtype)) if value >= top else value

    def clamp(path, leaf):
        if is_temperature(path) and path[0].key == "log_scale":
            return jnp.minimum(leaf, below_top(leaf.dtype))
        return leaf

    return jax.tree_util.tree_map_with_path(clamp, params)
