"""SimCLR on MNIST-1D: the default main job (a few minutes on 2 CPU cores).

    python -m contrastive_jax.main --config=configs/simclr_mnist1d.py --workdir=runs/simclr

Variants (``configs/simclr_mnist1d.py:key=value,...``): ``batch`` (global batch), ``epochs``,
``temperature``, ``learn_temperature``, ``strategy`` ('' | all_gather | ring), ``seed``,
``quick`` (a tiny smoke-test size).
"""

import ml_collections

from contrastive_jax import augmentations, data
from contrastive_jax.config_base import base_config, parse


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    v = parse(arg, batch=256, epochs=50.0, temperature=0.2, learn_temperature=False,
              strategy="", seed=0, quick=False)
    config = base_config()
    config.seed = v.seed
    config.num_epochs = v.epochs
    config.data = data.default_config()
    config.data.update({"name": "mnist1d", "batch_size": v.batch, "seed": v.seed})
    config.input_key = "signal"
    config.augment = augmentations.default_config("signal")
    config.model = {
        "name": "simclr",
        "encoder": {"name": "signal_cnn", "length": 40, "channels": (64, 128, 128),
                    "kernel_sizes": (5, 3, 3), "strides": (2, 2, 1), "features": 256,
                    "pool": "mean"},
        "head": {"hidden": 256, "out": 128, "layers": 2},
        "learn_temperature": v.learn_temperature,
        "init_temperature": v.temperature,
    }
    config.loss = {"name": "nt_xent", "temperature": v.temperature, "impl": "tiled",
                   "strategy": v.strategy}
    config.optimizer = {"name": "adamw", "learning_rate": 2e-3, "warmup_steps": 50,
                        "weight_decay": 1e-4}
    config.log_every = 100
    if v.quick:
        config.data.batch_size = 64
        config.total_steps = 6
        config.log_every = 2
        config.checkpoint_every = 3
        config.optimizer.warmup_steps = 1
        config.loss.impl = "autodiff"  # compiles fastest at this size
        config.evaluation.l2_grid = (1e-4,)
        config.model.encoder.channels = (8, 8, 8)
        config.model.encoder.features = 16
        config.model.head = {"hidden": 16, "out": 8, "layers": 2}
    return config
