"""InfoNCE as a mutual-information estimator on correlated Gaussians (Poole et al. 2019).

    python -m contrastive_jax.main --config=configs/mi_gaussian.py:mi=6 --workdir=runs/mi6

x ~ N(0, I_20), y = rho x + sqrt(1 - rho^2) eps with I(X; Y) = ``mi`` nats; a separable critic
(two MLPs, 2 x 256 ReLU, 32-d embeddings; cosine similarity times a learnable scale) trained
with one-directional InfoNCE; the logged ``mi_bound`` = log N - L is the estimate, never above
log N (log 64 = 4.16 at batch 64; docs/derivations.md §15.3). Variants: ``mi``, ``batch``,
``steps``,
``dim``, ``seed``, ``quick``.
"""

import ml_collections

from contrastive_jax.training import data
from contrastive_jax.training.config import base_config, model_wide, parse


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    v = parse(arg, mi=4.0, batch=64, steps=4000, dim=20, seed=0, quick=False)
    config = base_config()
    config.seed = v.seed
    config.total_steps = v.steps
    config.data = data.default_data_config()
    config.data.update({"name": "correlated_gaussians", "batch_size": v.batch, "seed": v.seed,
                        "options": {"dim": v.dim, "mutual_information": float(v.mi),
                                    "num_examples": {"train": 256_000, "test": 10_000}}})
    config.input_key = "x"
    config.text_key = "y"
    config.augment = None
    config.model = {
        "name": "dual_encoder",
        "sample_encoder": {"name": "mlp", "in_features": v.dim, "hidden": 256, "depth": 2,
                           "features": 32},
        "text_encoder": {"name": "mlp", "in_features": v.dim, "hidden": 256, "depth": 2,
                         "features": 32},
        "embed_dim": 32,
        "init_temperature": 0.1,
        **model_wide(),  # float32 compute, no remat (docs/training.md)
    }
    config.method = "mi_critic"
    config.loss = {"name": "clip", "direction": "x_to_y", "impl": "autodiff"}
    config.optimizer = {"name": "adamw", "learning_rate": 5e-4, "b1": 0.9, "b2": 0.999}
    config.evaluation.enabled = False  # no labels: the estimate is the result
    config.log_every = 200
    config.checkpoint_every = 1000
    if v.quick:
        config.total_steps = 6
        config.log_every = 2
        config.checkpoint_every = 3
        config.data.options.num_examples = {"train": 640, "test": 64}
    return config
