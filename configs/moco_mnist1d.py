"""MoCo on MNIST-1D: momentum key encoder and a queue of 4096 negatives ([MoCo];
docs/derivations.md §10).

    python -m contrastive_jax.main --config=configs/moco_mnist1d.py --workdir=runs/moco

Variants: ``batch``, ``epochs``, ``queue`` (a multiple of ``batch``), ``momentum``,
``temperature``, ``seed``, ``quick``.
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
    v = parse(arg, batch=256, epochs=200.0, queue=4096, momentum=0.99, temperature=0.2,
              seed=0, quick=False)
    config = base_config()
    config.seed = v.seed
    config.num_epochs = v.epochs
    config.data = data.default_data_config()
    config.data.update({"name": "mnist1d", "batch_size": v.batch, "seed": v.seed})
    config.input_key = "signal"
    config.augment = augmentations.default_augment_config("signal")
    config.model = {  # MoCo's query encoder; the key encoder and the queue are the method's
        "name": "projected_encoder",
        "encoder": {"name": "signal_cnn", "length": 40, "channels": (64, 128, 128),
                    "kernel_sizes": (5, 3, 3), "strides": (2, 2, 1), "features": 256},
        "head": {"hidden": 256, "out": 128, "layers": 2},
        **model_wide(),  # float32 compute, no remat (docs/training.md)
    }
    config.method = "moco"
    config.moco = {"momentum": v.momentum, "queue_size": v.queue}  # MoCoSettings
    config.loss = {"name": "moco", "temperature": v.temperature}
    config.optimizer = {"name": "adamw", "learning_rate": 2e-3, "warmup_steps": 50,
                        "weight_decay": 1e-4}
    if v.quick:
        config.moco.queue_size = 256
        make_quick(config)
        config.model.encoder.update(TINY_SIGNAL_CNN)
        config.model.head = {"hidden": 16, "out": 8, "layers": 2}
    return config
