"""Pod-scale template: CLIP ViT-B/16 on a TFDS image-text dataset, 32k global batch, ring loss.

On a TPU pod (every worker, same command; see README "Launching"):

    CONTRASTIVE_JAX_DISTRIBUTED=auto python -m contrastive_jax.main \\
        --config=configs/clip_vit_b16_pod.py --workdir=gs://BUCKET/clip_b16 \\
        --config.data.data_dir=gs://BUCKET/tensorflow_datasets

The dataset (default ``coco_captions``) must be prepared as array_record in ``data_dir``
(``tfds build coco_captions --file_format=array_record``). Images are resized (shorter side)
and centre-cropped to 224, captions tokenised with the word vocabulary file
``data.preprocess.vocabulary`` (build one from the dataset's captions; the default is the
package's tiny digit vocabulary) and cut at 32 tokens. The loss is the exact CLIP loss with
negatives passed round a ring of all devices (memory O(N d / D) per device,
contrastive_jax.losses.sharded), so the 32768 x 32768 logits are never built anywhere.

Variants: ``data`` (TFDS name), ``batch``, ``steps``, ``strategy``, ``tiny`` (a few-KB model,
batch 16, one step: the test suite runs it on 8 CPU devices).
"""

import ml_collections

from contrastive_jax.training import augmentations, data
from contrastive_jax.training.config import base_config, parse


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    v = parse(arg, data="coco_captions", batch=32768, steps=20000, strategy="ring",
              tiny=False)
    config = base_config()
    config.total_steps = v.steps
    config.data = data.default_config()
    config.data.update({"name": v.data, "batch_size": v.batch, "num_threads": 16,
                        "prefetch": 4})
    config.data.preprocess = {"name": "image_text", "image_key": "image",
                              "caption_key": "captions/text", "image_size": 224,
                              "max_tokens": 32, "vocabulary": ""}
    config.input_key = "image"
    config.text_key = "caption"
    config.augment = augmentations.default_config("image")
    config.augment.update({"resized_crop": 0.1, "shift": 0.0, "rotation": 0.0, "flip": 0.5,
                           "brightness": 0.0, "contrast": 0.0, "saturation": 0.0, "hue": 0.0,
                           "grayscale": 0.0, "blur": 0.0, "noise": 0.0, "cutout": 0.0})
    config.model = {
        "name": "dual_encoder",
        "sample_encoder": {"name": "vit", "image_size": 224, "patch": 16, "in_channels": 3,
                           "width": 768, "depth": 12, "heads": 12, "mlp_ratio": 4,
                           "features": 768},
        "text_encoder": {"name": "text_transformer", "vocab_size": 49408, "max_tokens": 32,
                         "width": 512, "depth": 12, "heads": 8, "mlp_ratio": 4,
                         "features": 512},
        "embed_dim": 512,
        "init_temperature": 0.07,
    }
    config.method = "clip"
    config.loss = {"name": "clip", "strategy": v.strategy, "block_size": 1024}
    config.optimizer = {"name": "adamw", "learning_rate": 5e-4, "warmup_steps": 2000,
                        "b1": 0.9, "b2": 0.98, "eps": 1e-6, "weight_decay": 0.2,
                        "grad_clip_norm": 1.0}
    # captions, no labels: retrieval Recall@k both ways, alignment and uniformity on the
    # evaluation split (one caption per image, the exact pair is the match)
    config.data.eval_split = "val"
    config.evaluation.classification = False
    config.log_every = 20
    config.checkpoint_every = 1000
    if v.tiny:
        config.data.update({"batch_size": 16, "num_threads": 1, "prefetch": 1,
                            "eval_split": "train"})
        config.data.preprocess.update({"image_size": 32, "max_tokens": 12})
        config.total_steps = 1
        config.log_every = 1
        config.optimizer.warmup_steps = 0
        config.loss.block_size = 2
        config.model.sample_encoder.update({"image_size": 32, "width": 16, "depth": 1,
                                            "heads": 2, "features": 16})
        config.model.text_encoder.update({"vocab_size": 64, "max_tokens": 12, "width": 16,
                                          "depth": 1, "heads": 2, "features": 16})
        config.model.embed_dim = 8
    return config
