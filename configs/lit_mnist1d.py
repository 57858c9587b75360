"""Locked-image tuning (LiT) on MNIST-1D signals and digit captions: CLIP with the signal tower
taken from a SimCLR run and locked.

    python -m contrastive_jax.main --config=configs/simclr_mnist1d.py --workdir=runs/simclr
    python -m contrastive_jax.main --config=configs/lit_mnist1d.py:pretrained=runs/simclr \\
        --workdir=runs/lit

The setup of ``configs/clip_mnist1d.py`` (digit_captions/mnist1d, CLIP loss with caption ids
as positives, zero-shot prompts, retrieval by label), with the signal tower's encoder being
exactly the SimCLR config's (``configs/simclr_mnist1d.py``: same block, ``quick`` included),
initialised from the latest checkpoint of the SimCLR workdir ``pretrained``
(``model.init_from``: its ``encoder`` -> ``sample_encoder``, BatchNorm statistics included) and,
in LiT's recipe, frozen (``model.frozen = "sample_encoder"``: no gradient, no optimiser state,
inference mode). The signal projection, the text tower and the logit scale train
([LiT]; docs/pretrained.md).

Variants: ``pretrained`` (the SimCLR workdir; required unless ``mode=scratch``), ``mode``
(``locked``: LiT; ``finetune``: initialised from ``pretrained``, both towers trained;
``scratch``: the same architecture, randomly initialised, both towers trained), ``batch``,
``epochs``, ``seed``, ``quick`` (pair it with a SimCLR workdir trained with ``quick``).
"""

import importlib.util
import pathlib

import ml_collections

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.config import parse

MODES = ("locked", "finetune", "scratch")
HERE = pathlib.Path(__file__).resolve().parent


def _config(name: str, arg: str):
    """``configs/<name>``'s ``get_config(arg)``."""
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), HERE / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    v = parse(arg, pretrained="", mode="locked", batch=256, epochs=50.0, seed=0, quick=False)
    if v.mode not in MODES:
        raise ConfigError(f"lit_mnist1d: mode must be one of {list(MODES)}; got {v.mode!r}")
    if v.mode != "scratch" and not v.pretrained:
        quick = ":quick" if v.quick else ""
        raise ConfigError(
            "lit_mnist1d needs the pretrained SimCLR workdir: first run `python -m "
            f"contrastive_jax.main --config=configs/simclr_mnist1d.py{quick} "
            "--workdir=runs/simclr`, then pass "
            f"--config=configs/lit_mnist1d.py:pretrained=runs/simclr{',quick' if v.quick else ''}"
            " (or mode=scratch to train both towers from scratch)")
    quick = ",quick" if v.quick else ""
    config = _config("clip_mnist1d.py", f"batch={v.batch},epochs={v.epochs},seed={v.seed}{quick}")
    simclr = _config("simclr_mnist1d.py", f"seed={v.seed}{quick}")
    config.model.sample_encoder = simclr.model.encoder.to_dict()
    if v.mode != "scratch":
        config.model.init_from = {"path": str(v.pretrained), "source": "encoder",
                                  "target": "sample_encoder"}
    if v.mode == "locked":
        config.model.frozen = "sample_encoder"
    return config
