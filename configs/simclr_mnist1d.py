"""SimCLR on MNIST-1D: the default main job (a few minutes on 2 CPU cores).

    python -m contrastive_jax.main --config=configs/simclr_mnist1d.py --workdir=runs/simclr

Variants (``configs/simclr_mnist1d.py:key=value,...``): ``batch`` (global batch), ``epochs``,
``temperature``, ``learn_temperature``, ``strategy`` ('' | all_gather | ring), ``seed``,
``quick`` (a tiny smoke-test size).
"""

import ml_collections

from contrastive_jax.training import augmentations, data
from contrastive_jax.training.config import (
    TINY_SIGNAL_CNN,
    base_config,
    make_quick,
    model_wide,
    parse,
)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    v = parse(arg, batch=128, epochs=20.0, temperature=0.2, learn_temperature=False,
              strategy="", seed=0, quick=False)
    config = base_config()
    config.seed = v.seed
    config.num_epochs = v.epochs
    config.data = data.default_data_config()
    config.data.update({"name": "mnist1d", "batch_size": v.batch, "seed": v.seed})
    config.input_key = "signal"
    config.augment = augmentations.default_augment_config("signal")
    config.model = {
        "name": "projected_encoder",
        # full time resolution, mean-pooled: MNIST-1D translates its digits circularly, so
        # absolute position is a nuisance (a search over strides, widths and pooling)
        "encoder": {"name": "signal_cnn", "length": 40, "channels": (32, 64, 64),
                    "kernel_sizes": (5, 3, 3), "strides": (1, 1, 1), "features": 256,
                    "pool": "mean"},
        "head": {"hidden": 256, "out": 128, "layers": 2},
        "learn_temperature": v.learn_temperature,
        "init_temperature": v.temperature,
        **model_wide(),  # float32 compute, no remat (docs/training.md)
    }
    config.method = "simclr"
    config.loss = {"name": "nt_xent", "temperature": v.temperature, "impl": "tiled",
                   "strategy": v.strategy,
                   # ablations (experiments/): normalize=False is dot-product logits (needs
                   # impl "autodiff"); max_scale caps a learned 1/tau (inf: no cap)
                   "normalize": True, "max_scale": 100.0}
    config.optimizer = {"name": "adamw", "learning_rate": 2e-3, "warmup_steps": 31,
                        "weight_decay": 0.1}
    config.log_every = 100
    if v.quick:
        make_quick(config)
        config.model.encoder.update(TINY_SIGNAL_CNN)
        config.model.head = {"hidden": 16, "out": 8, "layers": 2}
    return config
