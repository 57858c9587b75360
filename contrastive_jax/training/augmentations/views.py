"""Batched augmentation pipelines and SimCLR's pair of views.

A config names the kind of data and one strength per op::

    config = default_augment_config("signal")           # ConfigDict(kind="signal", shift=0.2, ...)
    config.noise = 0.3                          # any op; 0 switches it off
    x1, x2 = two_views(batch, key, config)      # (B, L, C) -> two (B, L, C) views

``augment`` applies every op whose strength is non-zero to every example, in the fixed order of
:data:`SIGNAL_OPS` / :data:`IMAGE_OPS` (SimCLR's: crop/shift, flip, rotation, colour, blur, noise,
cutout), each example with its own key (``jax.random.split(key, B)``, one per example) and each
op with its own key from that (``jax.random.split(example_key, len(ops))``, one slot per op
whether or not it is on, so switching one op off does not change the others' draws). Strengths
are static: they pick code paths and kernel sizes, and a strength of exactly 0 skips its op, so
an all-zero config returns the batch unchanged (bit-identical).

Under ``jit``. A ``ConfigDict`` is not hashable, so it cannot be a static argument; close over
it instead. Both of these compile once per config and batch shape::

    step = jax.jit(functools.partial(two_views, config=config))
    x1, x2 = step(batch, key)

    @jax.jit
    def train_step(state, batch, key):
        x1, x2 = two_views(batch, key, config)   # config from the enclosing scope
        ...

A ``ml_collections.FrozenConfigDict`` is hashable and may be static instead:
``jax.jit(two_views, static_argnames="config")(batch, key, config=FrozenConfigDict(config))``.
Internally the config is frozen into a hashable tuple and the batch function is itself jitted,
so eager calls are compiled too. An ``image_recipe`` config (SimCLR's, MoCo v2's, MoCo v3's:
:mod:`~contrastive_jax.training.augmentations.family`) runs through the same four functions.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import ml_collections

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.augmentations import family, image, signal
from contrastive_jax.training.augmentations.input_checks import check_augment_batch, check_key
from contrastive_jax.training.augmentations.signal import check_strength

Array = jax.Array
ConfigLike = ml_collections.ConfigDict | ml_collections.FrozenConfigDict | Mapping

KINDS = ("signal", "image")
SIGNAL_OPS: tuple[str, ...] = tuple(signal.OPS)
"""The signal ops, in the order they are applied."""
IMAGE_OPS: tuple[str, ...] = tuple(image.OPS)
"""The image ops, in the order they are applied."""

_MODULES = {"signal": signal, "image": image}
_Frozen = tuple[str, tuple[tuple[str, float], ...]]


def default_augment_config(kind: str) -> ml_collections.ConfigDict:
    """Default strengths for ``kind = "signal"`` (MNIST-1D) or ``"image"`` (8x8 digits, RGB).

    Signals, for MNIST-1D's standardised ``(40, 1)`` signals. MNIST-1D is made by padding a
    digit template, translating it circularly, scaling, shearing (a linear trend) and adding
    correlated and white noise; the views should differ in exactly those nuisances. Measured
    with SimCLR on MNIST-1D (``configs/simclr_mnist1d.py``), these four are what matters:

    * ``roll = 0.5``: circular shifts of up to 20 of 40 samples (the generator's translation).
    * ``resized_crop = 0.2``: windows of 80-100% stretched back (the template's scale).
    * ``trend = 2.0``: a linear ramp of rise up to 2 std (the generator's shear).
    * ``corr_noise = 0.3``: fresh smooth noise of 0.3 std (the generator's correlated noise).

    Everything else is off: ``flip`` changes the digit (time reversal turns one template into
    another shape), and adding ``shift``, ``noise``, ``cutout`` or amplitude changes on top of
    these lowered the linear probe in that search.

    Images, SimCLR's family (its CIFAR setting: colour strength 0.5, no blur) scaled to 8x8:

    * ``resized_crop = 0.4``: at least 60% of the area; SimCLR's 8% of an 8x8 digit is 2x2.
    * ``shift = 0.125`` (1 pixel), ``rotation = 0.1`` (up to 18 degrees).
    * ``flip = 0``: a mirrored digit is another shape (2 and 5); set 0.5 for natural images.
    * ``brightness = contrast = saturation = 0.4``, ``hue = 0.1``, ``grayscale = 0.2``: SimCLR's
      colour jitter (0.8 s, 0.2 s for hue) and colour drop; saturation, hue and grayscale are
      the identity on 1-channel images.
    * ``blur = 0``: SimCLR drops blur for small images (8x8 digits are already smooth).
    * ``noise = 0.05``, ``cutout = 0.25`` (a 2x2 hole in 8x8).

    Returns:
      A new, mutable ``ConfigDict`` with ``kind`` and one float per op (every op listed).
    """
    if kind == "signal":
        strengths = dict(
            resized_crop=0.2,
            roll=0.5,
            shift=0.0,
            flip=0.0,
            brightness=0.0,
            contrast=0.0,
            trend=2.0,
            blur=0.0,
            noise=0.0,
            corr_noise=0.3,
            cutout=0.0,
        )
    elif kind == "image":
        strengths = dict(
            resized_crop=0.4,
            shift=0.125,
            flip=0.0,
            rotation=0.1,
            brightness=0.4,
            contrast=0.4,
            saturation=0.4,
            hue=0.1,
            grayscale=0.2,
            blur=0.0,
            noise=0.05,
            cutout=0.25,
        )
    else:
        raise ConfigError(f"kind must be one of {KINDS}; got {kind!r}.")
    return ml_collections.ConfigDict({"kind": kind, **strengths})


def augment(batch: Array, key: Array, config: ConfigLike, view: int | None = None) -> Array:
    """One random augmentation of every example, each example with its own key.

    Args:
      batch: signals ``(B, L, C)`` (any float, unbounded) or images ``(B, H, W, C)`` (float in
        ``[0, 1]``, ``C`` = 1 or 3), matching ``config.kind``.
      key: one PRNG key (``jax.random.key(seed)``); split into ``B`` keys inside.
      config: ``kind`` and op strengths (:func:`default_augment_config`); ops left out are off. Each
        op's docstring in :mod:`~contrastive_jax.training.augmentations.signal` /
        :mod:`~contrastive_jax.training.augmentations.image` says what its strength means.

    Returns:
      An array of the batch's shape and dtype: ``y_b = t_b(x_b)``, ``t_b`` the composition of
      the active ops with parameters drawn from the ``b``-th key. Computed in float32 (float64
      for float64 input) and cast back. All strengths 0: the batch itself.

    An ``image_recipe`` config (:func:`~contrastive_jax.training.augmentations.family.
    recipe_augment_config`) draws view ``view`` of its recipe (needed when its views differ, or
    when the batch holds two views per example, ``(B, 2, H, W, C)``: then ``batch[:, view]``);
    other kinds ignore ``view``. The output is ``(B, size, size, C)`` with its ``crop =
    "device"``.
    """
    settings = _recipe_of(config)
    if settings is not None:
        batch = check_augment_batch("image", batch, views=settings.crop == "host")
        check_key(key)
        v = _recipe_view_index(settings, batch, view)
        return family.recipe_batch(_source(batch, v), jax.random.split(key, batch.shape[0]),
                                   settings, v)
    kind, strengths = _freeze(config)
    batch = check_augment_batch(kind, batch)
    check_key(key)
    return _augment(batch, key[None], kind, strengths)[0]


def two_views(batch: Array, key: Array, config: ConfigLike) -> tuple[Array, Array]:
    """SimCLR's positive pair: two independent augmentations of every example ([SimCLR] §2.1;
    docs/derivations.md §9.1 step 1).

    ``key`` is split once into ``(k1, k2)``; ``view1 = augment(batch, k1)`` and
    ``view2 = augment(batch, k2)``, so ``t`` and ``t'`` are drawn independently for each example
    ([SimCLR] §2.1: two augmentation operators t, t' drawn independently from one family T;
    docs/derivations.md §9.1 step 1), and row ``b`` of ``view1`` and of ``view2`` form a positive
    pair, the layout :func:`contrastive_jax.losses.nt_xent` expects for ``(z1, z2)``. Both views
    come from one vmapped pipeline over ``2B`` examples, so ``jit`` compiles the pipeline once.

    Args and shapes as :func:`augment`. Returns ``(view1, view2)``, each of the batch's shape
    and dtype. An ``image_recipe`` config draws view ``v`` with its view-``v`` settings, from
    ``batch[:, v]`` when the batch holds two views per example.
    """
    settings = _recipe_of(config)
    if settings is not None:
        batch = check_augment_batch("image", batch, views=settings.crop == "host")
        check_key(key)
        n = batch.shape[0]
        return tuple(family.recipe_batch(_source(batch, v), jax.random.split(k, n), settings, v)
                     for v, k in enumerate(jax.random.split(key)))
    kind, strengths = _freeze(config)
    batch = check_augment_batch(kind, batch)
    check_key(key)
    views = _augment(batch, jax.random.split(key), kind, strengths)
    return views[0], views[1]


def augment_each(batch: Array, keys: Array, config: ConfigLike,
                 view: int | None = None) -> Array:
    """:func:`augment` with the examples' own keys: example ``b`` is augmented with ``keys[b]``.

    An example's augmentation then does not depend on the batch it sits in, which is what the
    trainer needs to run one global batch as several micro-batches and draw the same views
    (:mod:`contrastive_jax.training.step.accumulation`).

    Args:
      batch: as :func:`augment`, ``(B, ...)``.
      keys: ``(B,)`` typed PRNG keys (``jax.random.split(key, B)``), one per example.
      config: as :func:`augment`.
      view: as :func:`augment` (MoCo passes the view it draws).
    """
    settings = _recipe_of(config)
    if settings is not None:
        batch = check_augment_batch("image", batch, views=settings.crop == "host")
        _check_example_keys(keys, batch.shape[0])
        v = _recipe_view_index(settings, batch, view)
        return family.recipe_batch(_source(batch, v), keys, settings, v)
    kind, strengths = _freeze(config)
    batch = check_augment_batch(kind, batch)
    _check_example_keys(keys, batch.shape[0])
    return _augment_examples(batch, keys[None], kind, strengths)[0]


def two_views_each(batch: Array, keys: Array, config: ConfigLike) -> tuple[Array, Array]:
    """:func:`two_views` with the examples' own keys: view ``v`` of example ``b`` is augmented
    with ``jax.random.split(keys[b])[v]`` (two independent draws per example, [SimCLR] §2.1).

    Args and shapes as :func:`augment_each`. Returns ``(view1, view2)``. An ``image_recipe``
    config as in :func:`two_views`.
    """
    settings = _recipe_of(config)
    if settings is not None:
        batch = check_augment_batch("image", batch, views=settings.crop == "host")
        _check_example_keys(keys, batch.shape[0])
        view_keys = jnp.moveaxis(jax.vmap(jax.random.split)(keys), 1, 0)  # (2, B)
        return tuple(family.recipe_batch(_source(batch, v), view_keys[v], settings, v)
                     for v in range(2))
    kind, strengths = _freeze(config)
    batch = check_augment_batch(kind, batch)
    _check_example_keys(keys, batch.shape[0])
    view_keys = jnp.moveaxis(jax.vmap(jax.random.split)(keys), 1, 0)  # (2, B)
    views = _augment_examples(batch, view_keys, kind, strengths)
    return views[0], views[1]


def _augment_examples(batch: Array, keys: Array, kind: str, strengths: tuple
                      ) -> Array | list[Array]:
    """``(V, B, ...)``: view v of example b uses ``keys[v, b]``."""
    if all(s == 0 for _, s in strengths):
        return [batch] * keys.shape[0]
    v, b = keys.shape
    xs = jnp.broadcast_to(batch, (v, *batch.shape)).reshape(v * b, *batch.shape[1:])
    ys = jax.vmap(lambda x, k: _augment_example(x, k, kind, strengths))(xs, keys.reshape(v * b))
    return ys.reshape(v, *batch.shape)


def _check_example_keys(keys, batch_size: int) -> None:
    if not (hasattr(keys, "dtype") and jnp.issubdtype(keys.dtype, jax.dtypes.prng_key)
            and keys.shape == (batch_size,)):
        got = (f"shape {keys.shape}, dtype {keys.dtype}" if hasattr(keys, "dtype")
               else repr(keys))
        raise ConfigError(f"keys must be ({batch_size},) typed PRNG keys, one per example "
                          f"(jax.random.split(key, {batch_size})); got {got}.")


def _augment(batch: Array, view_keys: Array, kind: str, strengths: tuple) -> Array | list[Array]:
    """``(V, B, ...)``: view v of example b uses ``jax.random.split(view_keys[v], B)[b]``."""
    if all(s == 0 for _, s in strengths):  # every op off: the batch itself, no copy
        return [batch] * view_keys.shape[0]
    return _augment_batch(batch, view_keys, kind, strengths)


@functools.partial(jax.jit, static_argnums=(2, 3))
def _augment_batch(batch: Array, view_keys: Array, kind: str, strengths: tuple) -> Array:
    v, b = view_keys.shape[0], batch.shape[0]
    keys = jnp.concatenate([jax.random.split(k, b) for k in view_keys])  # (V B,)
    xs = jnp.broadcast_to(batch, (v, *batch.shape)).reshape(v * b, *batch.shape[1:])
    ys = jax.vmap(lambda x, k: _augment_example(x, k, kind, strengths))(xs, keys)
    return ys.reshape(v, *batch.shape)


def _augment_example(x: Array, key: Array, kind: str, strengths: tuple) -> Array:
    ops = _MODULES[kind].OPS
    keys = jax.random.split(key, len(strengths))
    y = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    for op_key, (name, strength) in zip(keys, strengths, strict=True):
        if strength != 0:
            y = ops[name](y, op_key, strength)
    return y.astype(x.dtype)


def _items(config: ConfigLike) -> dict:
    if isinstance(config, (ml_collections.ConfigDict, ml_collections.FrozenConfigDict)):
        return dict(config.items())
    if isinstance(config, Mapping):
        return dict(config)
    raise ConfigError(
        "config must be a ConfigDict or a mapping with 'kind' and op strengths "
        f"(see default_augment_config); got {type(config).__name__}."
    )


def _recipe_of(config: ConfigLike) -> family.RecipeSettings | None:
    """The frozen settings of an ``image_recipe`` config; ``None`` for the other kinds."""
    items = _items(config)
    return family.freeze_recipe(items) if items.get("kind") == family.KIND else None


def _recipe_view_index(settings: family.RecipeSettings, batch: Array, view: int | None) -> int:
    if view is None:
        if batch.ndim == 5:
            raise ConfigError("the batch holds two views per example (B, 2, H, W, C): pass "
                              "view=0 or view=1")
        if not settings.symmetric:
            raise ConfigError("this augment recipe draws its two views differently (MoCo v3's "
                              "blur and solarize): pass view=0 or view=1")
        return 0
    if view not in (0, 1):
        raise ConfigError(f"view must be 0 or 1; got {view!r}")
    return view


def _source(batch: Array, view: int) -> Array:  # a two-view batch's view, or the images
    return batch[:, view] if batch.ndim == 5 else batch


def _freeze(config: ConfigLike) -> _Frozen:
    """Validate a config and freeze it to ``(kind, ((op, strength), ...))`` in op order."""
    items = _items(config)
    kind = items.pop("kind", None)
    if kind not in KINDS:
        raise ConfigError(
            f"config['kind'] must be one of {(*KINDS, family.KIND)}; got {kind!r}. Start from "
            "default_augment_config('signal') or default_augment_config('image'), or "
            "recipe_augment_config('simclr')."
        )
    module = _MODULES[kind]
    unknown = sorted(set(items) - set(module.OPS))
    if unknown:
        raise ConfigError(
            f"unknown augmentation(s) {unknown} for kind {kind!r}; valid keys are 'kind' and "
            f"{', '.join(module.OPS)}."
        )
    strengths = tuple(
        (name, check_strength(name, items.get(name, 0.0), *module.LIMITS.get(name, (None, True))))
        for name in module.OPS
    )
    return kind, strengths
