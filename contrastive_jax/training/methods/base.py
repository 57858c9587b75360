"""What every method shares: the ``loss`` block of a config, the context, the method interface.

The ``loss`` block of a config (:class:`LossSettings`)::

    name         "nt_xent" (SimCLR) | "moco" | "moco_v3" | "clip" | "siglip"
    temperature  fixed tau for nt_xent, moco and moco_v3 (a learnable one:
                 model.learn_temperature; not moco_v3's)
    impl         single-device loss: "tiled" | "dense_vjp" | "autodiff" (see clip_loss / nt_xent;
                 "analytic", the old name of "dense_vjp", is a deprecated alias)
    strategy     "" (the single-device loss on the global arrays, partitioned by XLA) or a
                 sharded strategy: "all_gather" | "all_gather_no_grad" | "ring" (shard_map over
                 the mesh's data axis; exact negatives across devices,
                 contrastive_jax.losses.sharded)
    block_size   tile rows for tiled and sharded losses (0: the default)
    positive_ids a batch feature (e.g. "caption_id", "label") whose equal values make pairs
                 positives (multi-positive InfoNCE, docs/derivations.md §5); "": each pair alone
    max_scale    cap on the logit scale, 100 (docs/derivations.md); ``float("inf")`` removes
                 the cap (nothing then stops a winning model from sharpening)
    normalize    nt_xent only: False drops the L2 normalisation (dot-product logits
                 z_i.z_j / tau, SimCLR Table 5's "no l2 norm"); needs impl "autodiff" and no
                 strategy
    direction    clip only: "both" (symmetric) | "x_to_y" | "y_to_x" (one-directional InfoNCE,
                 the mutual-information estimator)

The settings are parsed once, by :func:`~contrastive_jax.training.methods.method_for`, into
the method (``method.loss_settings``) and the step's :class:`MethodContext` (``ctx.loss``).
:meth:`LossSettings.nt_xent_on`, :meth:`~LossSettings.clip_on` and :meth:`~LossSettings.siglip_on`
are a method's one path to its loss whatever the mesh: the single-device loss on the global
arrays (``strategy = ""``, partitioned by XLA) or the sharded one over the mesh's data axis.

A :class:`Method` turns a model and a batch into ``(loss, metrics, outputs)`` and owns whatever
state it keeps besides the model (MoCo's key encoder and queue) and its own config block
(:attr:`Method.settings_block`: MoCo's ``config.moco``): the trainer
(:mod:`contrastive_jax.training.train`) only calls its hooks.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import jax
from jax.sharding import Mesh

from contrastive_jax.errors import ConfigError
from contrastive_jax.losses import clip_loss, nt_xent
from contrastive_jax.losses.parts.temperature import logit_scale
from contrastive_jax.losses.parts.validation import renamed_impl
from contrastive_jax.losses.sharded import (
    STRATEGIES,
    sharded_clip_loss,
    sharded_nt_xent,
    sharded_siglip_loss,
)
from contrastive_jax.losses.siglip import siglip_loss

LOSSES = ("nt_xent", "moco", "moco_v3", "clip", "siglip")
IMPLS = ("tiled", "dense_vjp", "autodiff")


@dataclasses.dataclass(frozen=True)
class LossSettings:
    """The ``loss`` block, checked (see the module docstring)."""

    name: str = "nt_xent"
    temperature: float = 0.1
    impl: str = "tiled"
    strategy: str = ""
    block_size: int = 0
    max_scale: float = 100.0
    direction: str = "both"
    normalize: bool = True
    positive_ids: str = ""

    def __post_init__(self):
        for field, kind in (("temperature", float), ("max_scale", float), ("block_size", int),
                            ("normalize", bool), ("name", str), ("impl", str),
                            ("strategy", str), ("direction", str), ("positive_ids", str)):
            value = getattr(self, field)
            ok = isinstance(value, kind) or (kind is float and isinstance(value, int)
                                             and not isinstance(value, bool))
            if not ok or (kind is int and isinstance(value, bool)):
                raise ConfigError(f"loss.{field} must be a {kind.__name__}; got {value!r}")
        if self.name not in LOSSES:
            raise ConfigError(f"unknown loss {self.name!r}; valid: {list(LOSSES)}")
        # a deprecated impl name (a DeprecationWarning) -> its new name
        object.__setattr__(self, "impl", renamed_impl(self.impl, stacklevel=4))
        if self.impl not in IMPLS:
            raise ConfigError(f"unknown loss.impl {self.impl!r}; valid: {list(IMPLS)}")
        if self.strategy and self.strategy not in STRATEGIES:
            raise ConfigError(f"unknown loss.strategy {self.strategy!r}; valid: '' or "
                              f"{list(STRATEGIES)}")
        if self.strategy and self.name == "moco":
            raise ConfigError("loss.strategy applies to nt_xent, clip and siglip; moco's queue "
                              "loss runs on the global arrays (set loss.strategy = '')")
        if self.name == "siglip" and (self.impl == "dense_vjp"
                                      or self.strategy == "all_gather_no_grad"):
            raise ConfigError(f"siglip runs with impl 'tiled' or 'autodiff' and strategy '', "
                              f"'all_gather' or 'ring'; got impl={self.impl!r}, "
                              f"strategy={self.strategy!r}")
        if self.positive_ids and self.name == "moco":
            raise ConfigError("loss.positive_ids does not apply to moco (its negatives are a "
                              "queue); set loss.positive_ids = ''")
        if not self.normalize and (self.name != "nt_xent" or self.impl != "autodiff"
                                   or self.strategy):
            raise ConfigError(
                "loss.normalize = False (dot-product logits) is an nt_xent ablation "
                f"implemented by impl='autodiff' without a strategy; got name={self.name!r}, "
                f"impl={self.impl!r}, strategy={self.strategy!r} (set loss.impl = 'autodiff' "
                "and loss.strategy = '')")
        if not self.max_scale > 0:
            raise ConfigError(f"loss.max_scale must be > 0 (inf: no cap); got {self.max_scale}")
        if not self.temperature > 0:
            raise ConfigError(f"loss.temperature must be > 0; got {self.temperature}")

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> LossSettings:
        """The settings of a config's ``loss`` block; unknown keys are a :class:`ConfigError`."""
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(config) - fields)
        if unknown:
            raise ConfigError(f"unknown loss settings {unknown}; valid: {sorted(fields)}")
        return cls(**dict(config))

    @property
    def block(self) -> int | None:
        """``block_size`` for the loss functions: ``None`` (their default) when 0."""
        return self.block_size or None

    def ids(self, batch):
        """The batch's positive ids (``positive_ids`` names the feature), or ``None``."""
        if not self.positive_ids:
            return None
        if self.positive_ids not in batch:
            raise ConfigError(f"loss.positive_ids = {self.positive_ids!r} is not a feature of "
                              f"the batch; features: {sorted(batch)}")
        return batch[self.positive_ids]

    def tiled_kwargs(self) -> dict:
        """``{"block_size": ...}`` for ``impl="tiled"``, else nothing (the others refuse it)."""
        return {"block_size": self.block} if self.impl == "tiled" else {}

    def nt_xent_on(self, mesh: Mesh, z1: jax.Array, z2: jax.Array, temperature,
                   positive_ids: jax.Array | None = None) -> jax.Array:
        """NT-Xent of ``z1, z2 (N, d)`` at ``temperature`` over the global batch
        (docs/derivations.md, NT-Xent): :func:`contrastive_jax.losses.nt_xent` with these
        settings' ``impl``, ``normalize`` and block, or with a ``strategy``
        :func:`~contrastive_jax.losses.sharded.sharded_nt_xent` over ``mesh``; the same
        number either way."""
        if self.strategy:
            return sharded_nt_xent(z1, z2, temperature, mesh=mesh, strategy=self.strategy,
                                   block_size=self.block, positive_ids=positive_ids)
        return nt_xent(z1, z2, temperature, impl=self.impl, normalize=self.normalize,
                       positive_ids=positive_ids, **self.tiled_kwargs())

    def clip_on(self, mesh: Mesh, x: jax.Array, y: jax.Array, log_scale: jax.Array,
                positive_ids: jax.Array | None = None) -> jax.Array:
        """The CLIP loss of ``x, y (N, d)`` with logit scale ``min(exp(log_scale), max_scale)``
        in these settings' ``direction`` ([CLIP]; docs/derivations.md, CLIP):
        :func:`contrastive_jax.losses.clip_loss` (``impl``, block), or with a ``strategy``
        :func:`~contrastive_jax.losses.sharded.sharded_clip_loss` over ``mesh``."""
        if self.strategy:
            return sharded_clip_loss(x, y, log_scale, mesh=mesh, strategy=self.strategy,
                                     max_scale=self.max_scale, direction=self.direction,
                                     block_size=self.block, positive_ids=positive_ids)
        return clip_loss(x, y, log_scale, max_scale=self.max_scale, impl=self.impl,
                         direction=self.direction, positive_ids=positive_ids,
                         **self.tiled_kwargs())

    def siglip_on(self, mesh: Mesh, x: jax.Array, y: jax.Array, log_scale: jax.Array,
                  bias: jax.Array, positive_ids: jax.Array | None = None) -> jax.Array:
        """The SigLIP loss of ``x, y (N, d)`` with logit scale and ``bias`` ([SigLIP];
        docs/derivations.md, SigLIP): :func:`contrastive_jax.losses.siglip.siglip_loss`
        (``impl``, block), or with a ``strategy``
        :func:`~contrastive_jax.losses.sharded.sharded_siglip_loss` over ``mesh``."""
        if self.strategy:
            return sharded_siglip_loss(x, y, log_scale, bias, mesh=mesh, strategy=self.strategy,
                                       max_scale=self.max_scale, block_size=self.block,
                                       positive_ids=positive_ids)
        return siglip_loss(x, y, log_scale, bias, max_scale=self.max_scale, impl=self.impl,
                           positive_ids=positive_ids, **self.tiled_kwargs())


@dataclasses.dataclass(frozen=True)
class MethodContext:
    """What a method needs besides the model and the batch (static under ``jit``)."""

    loss: LossSettings
    mesh: Mesh
    input_key: str
    text_key: str
    augment: Any  # a frozen augmentation config, or None
    graphdef: Any = None  # the model's graph (MoCo rebuilds its key encoder from it)
    # model.frozen: top-level parameters that stay fixed
    # (contrastive_jax.training.models.locked_towers)
    frozen: tuple[str, ...] = ()
    # data.preprocess.mean/std, applied after the augmentations
    # (contrastive_jax.training.augmentations.pixels); None: the tower reads [0, 1]
    pixels: Any = None


def temperature_of(model, loss: LossSettings):
    """A learned temperature ``1 / min(exp(log_scale), max_scale)`` if the model has one,
    else the fixed ``loss.temperature``."""
    if getattr(model, "log_scale", None) is not None:
        return 1.0 / logit_scale(model.log_scale[...], loss.max_scale)
    return loss.temperature


@dataclasses.dataclass(frozen=True)
class Method(abc.ABC):
    """A contrastive method. Subclasses set ``name`` and implement :meth:`embed` and
    :meth:`objective`; one that has settings of its own names its config block
    (``settings_block``) and reads it in :meth:`from_config`.

    ``loss_settings`` is the config's ``loss`` block, parsed once
    (:func:`~contrastive_jax.training.methods.method_for`).

    A step is ``loss = objective(model, embed(model, batch, keys), targets(batch, keys))``:
    :meth:`embed` maps each example to its differentiable rows (embeddings), :meth:`targets`
    to rows that take no gradient (MoCo's momentum keys), and :meth:`objective` is the loss on
    the whole global batch of rows. The split is what makes gradient accumulation exact
    (:mod:`contrastive_jax.training.step.accumulation`): rows are computed micro-batch by
    micro-batch, the objective once.

    ``keys (B,)`` holds one PRNG key per example (augmentations, dropout), so an example's
    randomness does not depend on the micro-batch it sits in.

    Hooks, in the order the trainer calls them:

    - :meth:`check` (before any work): settings the method needs, as :class:`ConfigError`;
    - :meth:`init_extra`: the method's own state (a dict of arrays, saved in checkpoints);
    - :meth:`targets` (no gradient): ``(rows, extra)``;
    - :meth:`embed` (differentiated): ``rows``, every leaf ``(B, ...)``;
    - :meth:`objective`: ``(loss, metrics, outputs)`` on the global batch;
    - :meth:`after_update` (after the optimiser): the new extra state;
    - :meth:`results` (at the end): entries it adds to ``results.json``.
    """

    loss_settings: LossSettings = LossSettings()
    name: ClassVar[str] = ""
    losses: ClassVar[tuple[str, ...]] = ()  # the loss.name values this method runs with
    settings_block: ClassVar[str] = ""  # the config block of its own settings ("": none)

    @classmethod
    def from_config(cls, config, loss_settings: LossSettings) -> Method:
        """The method with the config's settings (its ``settings_block``; none by default)."""
        return cls(loss_settings=loss_settings)

    def check(self, config) -> None:  # noqa: B027 (a hook: nothing to check by default)
        """Raise :class:`ConfigError` for settings this method cannot run with."""

    def init_extra(self, model, params, rest, config) -> dict[str, jax.Array]:
        """The method's state besides the model (none by default)."""
        return {}

    def targets(self, batch: Mapping[str, jax.Array], keys: jax.Array,
                extra: Mapping[str, jax.Array], ctx: MethodContext
                ) -> tuple[dict[str, jax.Array], dict[str, Any]]:
        """Rows that take no gradient (every leaf ``(B, ...)``) and the extra state after
        computing them (none and unchanged by default)."""
        return {}, dict(extra)

    @abc.abstractmethod
    def embed(self, model, batch: Mapping[str, jax.Array], keys: jax.Array,
              ctx: MethodContext) -> dict[str, jax.Array]:
        """The differentiable rows of a batch: a dict of ``(B, ...)`` arrays."""

    @abc.abstractmethod
    def objective(self, model, rows: Mapping[str, jax.Array],
                  targets: Mapping[str, jax.Array], batch: Mapping[str, jax.Array],
                  extra: Mapping[str, jax.Array], ctx: MethodContext):
        """``(scalar loss, metrics dict, outputs dict)`` on one global batch of rows; uses the
        model only for the loss's own parameters (log-scale, bias)."""

    def loss(self, model, batch: Mapping[str, jax.Array], keys: jax.Array,
             extra: Mapping[str, jax.Array], ctx: MethodContext):
        """``objective(model, embed(...), targets(...))`` on one batch (the trainer's ``K = 1``
        step; a convenience for tests and notebooks)."""
        targets, extra = self.targets(batch, keys, extra, ctx)
        return self.objective(model, self.embed(model, batch, keys, ctx), targets, batch,
                              extra, ctx)

    def after_update(self, extra: dict, params, outputs: Mapping[str, Any],
                     ctx: MethodContext) -> dict:
        """The extra state after an optimiser step (unchanged by default)."""
        return extra

    def results(self, source, config) -> dict[str, Any]:
        """Entries this method adds to ``results.json`` (none by default)."""
        return {}


def example_keys(keys: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Each example's ``(augmentation, dropout)`` keys from its step key: ``split(keys[b])``."""
    pairs = jax.vmap(jax.random.split)(keys)
    return pairs[:, 0], pairs[:, 1]
