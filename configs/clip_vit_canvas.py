"""CLIP with a small ViT on digits pasted on 48 x 48 canvases (digit_captions/canvas), read at
32 x 32: a CPU-sized image-text task for patch dropout and resolution changes.

    python -m contrastive_jax.main --config=configs/clip_vit_canvas.py --workdir=runs/canvas
    python -m contrastive_jax.main --config=configs/clip_vit_canvas.py:patch_dropout=0.5 ...
    python -m contrastive_jax.main --config=configs/clip_vit_canvas.py:res=16 ...

Images go through the pod's path (``data.preprocess`` ``image_text``: resized bicubically on
the host to ``res`` x ``res``, uint8 to the device; the captions' text tokenised by the word
vocabulary), into a ViT of patch 4 (64 patches at 32 x 32, 16 at 16 x 16), 4 blocks of width
64; the text tower and the loss as configs/clip_mnist1d.py's (identical captions are
positives). Evaluation: zero-shot accuracy with the digit prompts and Recall@k where a caption
naming the right digit is a match.

Variants: ``patch_dropout=P`` (FLIP: each training image keeps ``1 - P`` of its patches),
``res=N`` (the image size; CLIPA's low resolution), ``steps=N``, ``batch=B``, ``seed``,
``quick``. experiments/cheaper_clip.py compares them at equal FLOPs.
"""

import ml_collections

from contrastive_jax.training import augmentations, data
from contrastive_jax.training.config import base_config, make_quick, model_wide, parse
from contrastive_jax.training.data.text import captions

PATCH = 4


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    v = parse(arg, patch_dropout=0.0, res=32, steps=1500, batch=128, seed=0, quick=False)
    config = base_config()
    config.seed = v.seed
    config.total_steps = v.steps
    config.data = data.default_data_config()
    config.data.update({"name": "digit_captions/canvas", "batch_size": v.batch,
                        "eval_batch_size": 240, "seed": v.seed})
    config.data.preprocess = {"name": "image_text", "image_key": "image",
                              "caption_key": "caption", "image_size": v.res,
                              "max_tokens": captions.MAX_TOKENS, "resize": "bicubic",
                              "crop": "center", "extra_features": ("label",),
                              "tokenizer": {"kind": "words", "path": ""},
                              "vocab_size": len(captions.vocabulary())}
    config.input_key = "image"
    config.text_key = "caption"
    config.augment = augmentations.default_augment_config("image")
    for op in augmentations.IMAGE_OPS:  # the canvases vary in place and size already
        config.augment[op] = 0.0
    config.model = {
        "name": "dual_encoder",
        "sample_encoder": {"name": "vit", "image_size": v.res, "patch": PATCH,
                           "in_channels": 3, "width": 64, "depth": 4, "heads": 4,
                           "mlp_ratio": 4, "features": 64, "patch_dropout": v.patch_dropout,
                           "scan": True},
        "text_encoder": {"name": "text_transformer", "vocab_size": len(captions.vocabulary()),
                         "max_tokens": captions.MAX_TOKENS, "width": 64, "depth": 2,
                         "heads": 4, "features": 64, "scan": True},
        "embed_dim": 64,
        "init_temperature": 0.07,
        # float32 compute, no remat, the towers' attention kernel (docs/training.md)
        **model_wide(attention="auto"),
    }
    config.method = "clip"
    config.loss = {"name": "clip", "positive_ids": "label"}
    config.evaluation.classification = False  # zero-shot and retrieval say what is learnt
    config.evaluation.zero_shot_prompts = "image"  # "a photo of the digit seven", ...
    config.evaluation.retrieval_match = "label"
    config.optimizer = {"name": "adamw", "learning_rate": 1e-3, "warmup_steps": 100,
                        "weight_decay": 1e-4, "temperature_lr": 1e-2}
    config.log_every = 100
    config.checkpoint_every = 500
    if v.quick:
        make_quick(config)
        config.model.sample_encoder.update({"width": 16, "depth": 1, "heads": 2,
                                            "features": 16})
        config.model.text_encoder.update({"width": 16, "depth": 1, "heads": 2, "features": 16})
        config.model.embed_dim = 8
    return config
