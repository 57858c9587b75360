"""Flax NNX models: encoders, projection heads, the projected encoder (SimCLR / MoCo), the CLIP
dual encoder.

:func:`build_model` makes the model a config's ``model`` block describes::

    model.name = "projected_encoder"     encoder + projection head (SimCLR; MoCo's query
                                         encoder, whose key copy and queue are the method's);
                                         model.predictor = {"hidden", "out", "layers",
                                         "out_batch_norm", ...}: a second head on the
                                         projection (MoCo v3's, methods/moco_v3.py)
                 "dual_encoder"          sample tower + text tower + logit scale (CLIP, SigLIP)
    model.encoder / sample_encoder / text_encoder = {"name": one of ENCODERS, **its kwargs}
    model.dtype        "float32" (default) | "bfloat16": the compute dtype of every encoder and
                       head; parameters stay float32, the embeddings for the loss are float32
                       (precision.py)
    model.remat        False (default) | True: rematerialise the repeated blocks (Transformer
                       blocks, ResNet blocks, the signal CNN's and the MLP's layers; remat.py)
                       of every tower under model.remat_policy; a policy name (one of
                       remat.POLICIES): every tower under it; or one entry per tower,
                       {"sample_encoder": "dots_saveable", "text_encoder": False} (towers
                       left out: off)
    model.remat_policy "nothing_saveable" (default) or another of remat.POLICIES: the policy
                       of model.remat = True (and of a tower's True)
    model.attention    "auto" (default) | "xla" | "cudnn": the Transformer towers' attention
                       kernel (encoders/attention.py)
    model.<tower>.scan True (default for "vit" and "text_transformer") | False: the tower's
                       Transformer blocks as one lax.scan over stacked parameters, or unrolled
                       (scanned_layers.py); other encoders have no blocks to scan
    model.sample_projection, model.text_projection (dual encoder)
                       "linear" (default, bias-free) | "linear_bias" | "none" (identity; the
                       tower's features must equal embed_dim): dual_encoder.PROJECTIONS

``"simclr"`` and ``"moco"`` name the projected encoder too, deprecated
(:data:`DEPRECATED_MODEL_NAMES`: a ``DeprecationWarning``); MoCo's ``momentum`` and
``queue_size`` are settings of the method (``config.moco``,
:mod:`contrastive_jax.training.methods.momentum_contrast`), and in a ``model`` block they are a
:class:`ConfigError` naming the new key (:data:`MOVED_TO_METHODS`).

The ``vit`` and ``text_transformer`` options that express OpenAI's / open_clip's CLIP and
SigLIP towers (``pool="map"``, ``norm_after_pool``, text ``pool="last"|"first"|"eos"`` with
``eos_id``) are in encoders/transformer.py; converters/clip_import.py turns a CLIP checkpoint
into such a ``dual_encoder`` block and its parameters (docs/pretrained.md).
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from flax import nnx

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models.dual_encoder import DualEncoder
from contrastive_jax.training.models.encoders import (
    MLPEncoder,
    ResNet,
    SignalCNN,
    TextTransformer,
    ViT,
)
from contrastive_jax.training.models.heads import ProjectionHead
from contrastive_jax.training.models.precision import layers_dtype
from contrastive_jax.training.models.projected_encoder import ProjectedEncoder
from contrastive_jax.training.models.remat import POLICIES, check_policy
from contrastive_jax.training.models.scanned_layers import SCANNABLE

ENCODERS = {"signal_cnn": SignalCNN, "resnet": ResNet, "vit": ViT,
            "text_transformer": TextTransformer, "mlp": MLPEncoder}
MODELS = ("projected_encoder", "dual_encoder")
# model names of earlier releases: the same model, accepted with a DeprecationWarning
DEPRECATED_MODEL_NAMES = {"simclr": "projected_encoder", "moco": "projected_encoder"}
# model settings of earlier releases that are now a method's: where they live now
MOVED_TO_METHODS = {"momentum": "moco.momentum", "queue_size": "moco.queue_size"}
# settings of a model block about how a run trains it (locked towers, a pretrained start):
# not the architecture, left out of what builds the model (architecture_block)
TRAINING_SETTINGS = ("frozen", "init_from")
# every model takes the whole-model settings (compute dtype, rematerialisation, attention)
MODEL_WIDE = {"dtype", "remat", "remat_policy", "attention"}
# the value a model block without the setting runs with (build_model's defaults); the shipped
# configs write these out, so the command line can set them (training/config.py: model_wide)
MODEL_WIDE_DEFAULTS = {"dtype": "float32", "remat": False, "attention": "auto"}
# the settings of an encoder that configs write out since a release whose records lack them,
# with the value those records ran with (upgraded_model_block)
WRITTEN_TOWER_DEFAULTS = {"vit": {"patch_dropout": 0.0}}
# the towers of each model, as model.remat names them per tower
TOWERS = {"projected_encoder": ("encoder",), "dual_encoder": ("sample_encoder", "text_encoder")}
MODEL_KEYS = {
    "projected_encoder": {"name", "encoder", "head", "predictor", "learn_temperature",
                          "init_temperature", *MODEL_WIDE},
    "dual_encoder": {"name", "sample_encoder", "text_encoder", "embed_dim", "init_temperature",
                     "siglip", "init_bias", "sample_projection", "text_projection",
                     *MODEL_WIDE},
}
# set once for the whole model by build_model, never in an encoder's own block
_FROM_MODEL = {"dtype": "model.dtype", "remat_policy": "model.remat and model.remat_policy",
               "attention": "model.attention"}
# encoders with attention, which take model.attention
_ATTENTION = ("vit", "text_transformer")


def build_encoder(config: Mapping[str, Any], rngs: nnx.Rngs, *, dtype=None,
                  remat_policy: str | None = None, attention: str = "auto") -> nnx.Module:
    """``ENCODERS[config["name"]](**rest, dtype=dtype, remat_policy=..., attention=...)``;
    unknown names or arguments say what is valid. ``dtype`` (:func:`.precision.layers_dtype`),
    ``remat_policy`` (:mod:`.remat`; ``None``: off) and ``attention`` (the Transformer towers'
    kernel, :mod:`.encoders.attention`) come from the model's settings."""
    config = dict(config)
    name = config.pop("name", None)
    if name not in ENCODERS:
        raise ConfigError(f"unknown encoder {name!r}; valid: {sorted(ENCODERS)}")
    for key, where in _FROM_MODEL.items():
        if key in config:
            raise ConfigError(f"encoder {name!r}: {key!r} is a setting of the whole model; "
                              f"remove it from the encoder and set {where}")
    if "scan" in config and name not in SCANNABLE:
        raise ConfigError(f"encoder {name!r} has no Transformer blocks to scan; remove its "
                          f"'scan' setting (scan applies to {list(SCANNABLE)})")
    if "patch_dropout" in config and name != "vit":
        raise ConfigError(f"encoder {name!r} has no patch tokens to drop; remove its "
                          "'patch_dropout' setting (patch dropout applies to 'vit')")
    settings = {"dtype": dtype, "remat_policy": remat_policy}
    if name in _ATTENTION:
        settings["attention"] = attention
    return _construct(ENCODERS[name], config, rngs, f"encoder {name!r}", settings)


def remat_policies(config: Mapping[str, Any], towers: tuple[str, ...]) -> dict[str, str | None]:
    """``{tower: remat policy or None}`` of a ``model`` block's ``remat`` and ``remat_policy``
    (see the module docstring: a bool, a policy name, or one entry per tower); bad values are
    a :class:`ConfigError` naming the valid ones."""
    remat = config.get("remat", False)
    remat = remat.to_dict() if hasattr(remat, "to_dict") else remat
    policy = check_policy(config.get("remat_policy", "nothing_saveable"))
    entries = remat if isinstance(remat, Mapping) else dict.fromkeys(towers, remat)
    unknown = sorted(set(entries) - set(towers))
    if unknown:
        raise ConfigError(f"model.remat: unknown towers {unknown}; this model's towers: "
                          f"{list(towers)}")
    if isinstance(remat, str) and "remat_policy" in config:
        raise ConfigError(f"model.remat = {remat!r} names the policy already; drop "
                          "model.remat_policy")
    out = {}
    for tower in towers:
        value = entries.get(tower, False)
        if isinstance(value, str) and value in POLICIES:
            out[tower] = value
        elif isinstance(value, bool):
            out[tower] = policy if value else None
        else:
            raise ConfigError(f"model.remat must be True or False, a policy name (one of "
                              f"{list(POLICIES)}) or one such value per tower ({list(towers)}); "
                              f"got {remat!r}")
    if policy != "nothing_saveable" and True not in entries.values():
        raise ConfigError(f"model.remat_policy = {policy!r} has no effect while model.remat is "
                          "False for every tower; set model.remat = True (or drop the policy)")
    return out


def model_settings(config: Mapping[str, Any]) -> tuple[Any, str | None]:
    """``(compute dtype, remat policy or None)`` of a ``model`` block whose towers all share
    one policy (:func:`remat_policies`; a per-tower ``remat`` gives the first tower's); bad
    values are a :class:`ConfigError` naming the valid ones."""
    dtype = layers_dtype(config.get("dtype", "float32"))
    name = DEPRECATED_MODEL_NAMES.get(config.get("name"), config.get("name"))
    towers = TOWERS.get(name, ("encoder",))
    return dtype, remat_policies(config, towers)[towers[0]]


def model_name(config: Mapping[str, Any]) -> str:
    """The ``model`` block's ``name`` in today's terms: a deprecated name
    (:data:`DEPRECATED_MODEL_NAMES`) warns and gives the model it names; a setting that moved
    to a method's block (:data:`MOVED_TO_METHODS`) and an unknown name are a
    :class:`ConfigError` saying what to write instead."""
    moved = sorted(set(config) & set(MOVED_TO_METHODS))
    if moved:
        raise ConfigError("; ".join(f"model.{k} is a setting of the method now: set "
                                    f"config.{MOVED_TO_METHODS[k]} instead" for k in moved))
    name = config.get("name")
    if name in DEPRECATED_MODEL_NAMES:
        warnings.warn(f"model.name = {name!r} is deprecated; use "
                      f"{DEPRECATED_MODEL_NAMES[name]!r} (the same model)", DeprecationWarning,
                      stacklevel=3)
        return DEPRECATED_MODEL_NAMES[name]
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; valid: {list(MODELS)}")
    return name


def architecture_block(config: Mapping[str, Any]) -> dict[str, Any]:
    """A ``model`` block as plain values (a ConfigDict's too) without the settings of how a
    run trains it (:data:`TRAINING_SETTINGS`: ``frozen``, ``init_from``): what
    :func:`build_model` takes. The one place these settings are left out."""
    def plain(value: Any) -> Any:
        if hasattr(value, "to_dict"):  # ml_collections.ConfigDict
            value = value.to_dict()
        if isinstance(value, Mapping):
            return {str(k): plain(v) for k, v in value.items()}
        return value

    return {k: v for k, v in plain(config).items() if k not in TRAINING_SETTINGS}


def upgraded_model_block(config: Mapping[str, Any]) -> dict[str, Any]:
    """A ``model`` block recorded by an earlier release in today's keys, silently (a record is
    not the user's to edit): a deprecated ``name`` (:data:`DEPRECATED_MODEL_NAMES`) replaced by
    the model it names, the settings that moved to a method's block (:data:`MOVED_TO_METHODS`)
    left out (:func:`~contrastive_jax.training.run.workdir.config_record.upgrade` moves them),
    and the settings today's configs write out at the value a block without them ran with:
    ``dtype`` and ``remat`` of the model (:data:`MODEL_WIDE_DEFAULTS`) and a ViT tower's
    ``patch_dropout`` (:data:`WRITTEN_TOWER_DEFAULTS`), so a record written before the
    configs carried them compares equal to today's config of the same run. A block of no
    known model comes back as it is (a copy)."""
    block = {k: v for k, v in dict(config).items() if k not in MOVED_TO_METHODS}
    if block.get("name") in DEPRECATED_MODEL_NAMES:
        block["name"] = DEPRECATED_MODEL_NAMES[block["name"]]
    if block.get("name") not in MODELS:
        return block
    for key in ("dtype", "remat"):  # attention may change on a resume: not filled
        block.setdefault(key, MODEL_WIDE_DEFAULTS[key])
    for tower in TOWERS[block["name"]]:
        settings = block.get(tower)
        if isinstance(settings, Mapping) and settings.get("name") in WRITTEN_TOWER_DEFAULTS:
            block[tower] = {**WRITTEN_TOWER_DEFAULTS[settings["name"]], **settings}
    return block


def build_model(config: Mapping[str, Any], rngs: nnx.Rngs) -> nnx.Module:
    """The model of a config's ``model`` block (see the module docstring)."""
    config = dict(config)
    name = model_name(config)
    unknown = sorted(set(config) - MODEL_KEYS[name])
    if unknown:
        raise ConfigError(f"model {name!r}: unknown settings {unknown}; valid: "
                         f"{sorted(MODEL_KEYS[name])}")
    dtype = layers_dtype(config.get("dtype", "float32"))
    policies = remat_policies(config, TOWERS[name])
    attention = config.get("attention", "auto")
    if name != "dual_encoder":
        encoder = build_encoder(config["encoder"], rngs, dtype=dtype,
                                remat_policy=policies["encoder"], attention=attention)
        head = _head("head", encoder.features, config.get("head", {}), dtype, rngs)
        options = {k: config[k] for k in ("learn_temperature", "init_temperature")
                   if k in config}
        if config.get("predictor"):  # MoCo v3's (methods/moco_v3.py), on the head's output
            options["predictor"] = _head("predictor", head.out_features, config["predictor"],
                                         dtype, rngs)
        return ProjectedEncoder(encoder, head, **options)
    sample = build_encoder(config["sample_encoder"], rngs, dtype=dtype,
                           remat_policy=policies["sample_encoder"], attention=attention)
    text = build_encoder(config["text_encoder"], rngs, dtype=dtype,
                         remat_policy=policies["text_encoder"], attention=attention)
    options = {k: config[k] for k in ("embed_dim", "init_temperature", "siglip", "init_bias",
                                      "sample_projection", "text_projection") if k in config}
    return DualEncoder(sample, text, dtype=dtype, rngs=rngs, **options)


def _head(key: str, in_features: int, settings: Mapping[str, Any], dtype,
          rngs: nnx.Rngs) -> ProjectionHead:
    """The :class:`ProjectionHead` of ``model.<key>`` (``head`` or ``predictor``) on
    ``in_features``: ``hidden`` (256), ``out`` (128) and the head's keyword arguments."""
    settings = dict(settings)
    if "dtype" in settings:
        raise ConfigError(f"model.{key}: 'dtype' is a setting of the whole model; remove it "
                          f"from the {key} and set model.dtype")
    valid = sorted({"hidden", "out", "layers", "batch_norm", "out_batch_norm"})
    unknown = sorted(set(settings) - set(valid))
    if unknown:
        raise ConfigError(f"model.{key}: unknown settings {unknown}; valid: {valid}")
    hidden, out = settings.pop("hidden", 256), settings.pop("out", 128)
    return ProjectionHead(in_features, hidden, out, dtype=dtype, rngs=rngs, **settings)


def unwritten_setting_hint(model: Mapping[str, Any], keys: Sequence[str]) -> str:
    """What works instead of ``model.<keys>`` (a path of keys under the ``model`` block) that
    the block does not write, so that ``--config.model.<keys>=...`` names no field: a tower's
    ``scan`` or ``patch_dropout`` where the tower's kind has no blocks or patches (the towers
    that take it), the remat policy through ``model.remat``, ``attention`` without a
    Transformer tower, a setting the model or the encoder takes that the config file must write
    (with its default), the arguments of the encoder; ``""`` when none applies."""
    towers = {t: dict(v) for t, v in model.items() if t in ("encoder", "sample_encoder",
                                                             "text_encoder")
              and isinstance(v, Mapping)}
    applies = {"scan": SCANNABLE, "patch_dropout": ("vit",)}
    what = {"scan": "Transformer blocks to scan", "patch_dropout": "patch tokens to drop"}

    def where_it_works(setting: str) -> str:
        found = [f"--config.model.{t}.{setting}" for t, v in towers.items()
                 if v.get("name") in applies[setting] and setting in v]
        return (f"{setting} applies to a {' or '.join(map(repr, applies[setting]))} tower; "
                + (f"this config's: {', '.join(found)}" if found else "this config has none"))

    keys = list(keys)
    if len(keys) == 2 and keys[0] not in model and keys[1] in applies:  # a tower it lacks
        have = ", ".join(f"model.{t} ({v.get('name')!r})" for t, v in towers.items())
        return f"this config's towers are {have or 'none'}; {where_it_works(keys[1])}"
    if len(keys) == 2 and keys[0] in towers and towers[keys[0]].get("name") in ENCODERS:
        tower, key, kind = keys[0], keys[1], towers[keys[0]]["name"]
        if key in applies and kind not in applies[key]:
            return f"model.{tower} (encoder {kind!r}) has no {what[key]} ({where_it_works(key)})"
        defaults = with_defaults({"name": kind})
        if key in defaults:
            return (f"model.{tower} (encoder {kind!r}) runs with {key} = {defaults[key]!r}, "
                    "which the config file does not write, so no flag can set it: write it in "
                    f"the config file's model.{tower} block")
        takes = set(inspect.signature(ENCODERS[kind].__init__).parameters)
        return f"encoder {kind!r} takes {', '.join(sorted(takes - {'self', 'rngs', *MODEL_WIDE}))}"
    if len(keys) != 1:
        return ""
    if keys[0] == "remat_policy":
        return (f"set the policy with --config.model.remat=POLICY (every tower; one of "
                f"{', '.join(POLICIES)}) or one per tower, "
                "--config.model.remat=\"{'TOWER': 'POLICY'}\"")
    if keys[0] == "attention" and not any(v.get("name") in _ATTENTION for v in towers.values()):
        return ("model.attention picks the kernel of the Transformer towers (vit, "
                "text_transformer); this config's model has none")
    name = DEPRECATED_MODEL_NAMES.get(model.get("name"), model.get("name"))
    if keys[0] in MODEL_KEYS.get(name, set()) | set(TRAINING_SETTINGS):
        return (f"model.{keys[0]} is a setting of a {name!r} model that the config file does "
                "not write, so no flag can set it: write it in the config file's model block")
    return ""


def _defaults(cls, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    return {name: p.default for name, p in inspect.signature(cls.__init__).parameters.items()
            if p.default is not inspect.Parameter.empty
            and name not in ("self", "rngs", *_FROM_MODEL, *skip)}


def encoder_input_shape(block: Mapping[str, Any], image_size: int | None = None
                        ) -> tuple[int, ...]:
    """One example's input of an encoder block: its class's ``input_shape`` (the encoder
    protocol, docs/architecture.md; ``image_size``: the data's, for an encoder that takes any
    size, such as a ResNet). A :class:`ConfigError` for an unknown encoder or an input it
    cannot take (a ResNet-50 on images smaller than its total stride)."""
    block = with_defaults(block)
    if block.get("name") not in ENCODERS:
        raise ConfigError(f"unknown encoder {block.get('name')!r}; valid: {sorted(ENCODERS)}")
    return tuple(ENCODERS[block["name"]].input_shape(block, image_size))


def with_defaults(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a ``model`` block or an encoder block with every setting left out written
    with the value its constructor takes by default (nested encoder blocks too), so that two
    blocks that build the same model compare equal whether a default is written out or not
    (``model.init_from``'s check). A block of another kind comes back as it is."""
    config = dict(config)
    name = config.get("name")
    if name in ENCODERS:
        return {**_defaults(ENCODERS[name]), **config}
    name = DEPRECATED_MODEL_NAMES.get(name, name)
    if name == "dual_encoder":
        config = {**_defaults(DualEncoder), **config}
        towers = ("sample_encoder", "text_encoder")
    elif name == "projected_encoder":
        config = {**_defaults(ProjectedEncoder, skip=("predictor",)), **config}
        towers = ("encoder",)
    else:
        return config
    for key in towers:
        if isinstance(config.get(key), Mapping):
            config[key] = with_defaults(config[key])
    return config


def _construct(cls, kwargs: dict, rngs: nnx.Rngs, what: str, settings: dict):
    params = inspect.signature(cls.__init__).parameters
    valid = sorted(p for p in params if p not in ("self", "rngs", *settings))
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise ConfigError(f"{what}: unknown arguments {unknown}; valid: {valid}")
    return cls(**kwargs, **settings, rngs=rngs)


__all__ = ["DEPRECATED_MODEL_NAMES", "ENCODERS", "MODELS", "MODEL_WIDE_DEFAULTS",
           "MOVED_TO_METHODS", "TRAINING_SETTINGS", "WRITTEN_TOWER_DEFAULTS", "DualEncoder",
           "MLPEncoder", "ProjectedEncoder", "ProjectionHead", "ResNet", "SignalCNN",
           "TextTransformer", "ViT", "architecture_block", "build_encoder", "build_model",
           "encoder_input_shape", "model_name", "model_settings", "unwritten_setting_hint",
           "upgraded_model_block", "with_defaults"]
