"""CLIP (or SigLIP) on MNIST-1D signals paired with templated captions (digit_captions).

    python -m contrastive_jax.main --config=configs/clip_mnist1d.py --workdir=runs/clip
    python -m contrastive_jax.main --config=configs/clip_mnist1d.py:loss=siglip --workdir=...

A signal tower (1-D CNN) and a text tower (small Transformer) into a 64-d space, learnable
logit scale (init 1 / 0.07, capped at 100). Identical captions in a batch are false negatives
(see the README's Data section). Variants: ``loss`` (clip | siglip), ``batch``, ``epochs``,
``strategy`` ('' | all_gather | all_gather_no_grad | ring), ``seed``, ``quick``.
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
from contrastive_jax.training.data.text import captions


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    v = parse(arg, loss="clip", batch=256, epochs=50.0, strategy="", seed=0, quick=False)
    config = base_config()
    config.seed = v.seed
    config.num_epochs = v.epochs
    config.data = data.default_data_config()
    config.data.update({"name": "digit_captions/mnist1d", "batch_size": v.batch,
                        "seed": v.seed, "features": ("signal", "caption", "caption_id",
                                                     "label")})
    config.input_key = "signal"
    config.text_key = "caption"
    config.augment = augmentations.default_augment_config("signal")
    config.model = {
        "name": "dual_encoder",
        "sample_encoder": {"name": "signal_cnn", "length": 40, "channels": (64, 128, 128),
                           "kernel_sizes": (5, 3, 3), "strides": (2, 2, 1), "features": 256},
        # scan: the blocks as one lax.scan over stacked parameters (False: unrolled)
        "text_encoder": {"name": "text_transformer", "vocab_size": len(captions.vocabulary()),
                         "max_tokens": captions.MAX_TOKENS, "width": 64, "depth": 2,
                         "heads": 4, "features": 64, "scan": True},
        "embed_dim": 64,
        "siglip": v.loss == "siglip",
        # SigLIP starts at scale 10, bias -10; CLIP at 1 / 0.07
        "init_temperature": 0.1 if v.loss == "siglip" else 0.07,
        # float32 compute, no remat; the text tower's attention kernel: "auto" | "xla" |
        # "cudnn" (docs/training.md)
        **model_wide(attention="auto"),
    }
    config.method = v.loss
    # identical captions are positives, not false negatives (docs/derivations.md §5.4)
    config.loss = {"name": v.loss, "strategy": v.strategy, "positive_ids": "caption_id"}
    config.evaluation.zero_shot_prompts = "signal"  # "a plot of the digit seven", ...
    # a caption says the class and a template drawn independently of the signal, so a text
    # naming the right digit is a correct retrieval (exact pairs would cap Recall@1 near 1/8)
    config.evaluation.retrieval_match = "label"
    config.optimizer = {"name": "adamw", "learning_rate": 1e-3, "warmup_steps": 50,
                        "weight_decay": 1e-4, "temperature_lr": 1e-2}
    if v.quick:
        make_quick(config)
        config.model.sample_encoder.update(TINY_SIGNAL_CNN)
        config.model.text_encoder.update({"width": 16, "depth": 1, "heads": 2, "features": 16})
        config.model.embed_dim = 8
    return config
