"""MoCo v3 on ImageNet as the paper ran it: ViT-B/16, batch 4096, AdamW, 300 epochs
([MoCoV3]).

On a TPU pod (every worker, same command; docs/launching.md "TPU VM pod"):

    CONTRASTIVE_JAX_DISTRIBUTED=auto python -m contrastive_jax.main \\
        --config=configs/moco_v3_vit_imagenet.py --workdir=gs://BUCKET/moco_v3_vitb \\
        --config.data.data_dir=gs://BUCKET/tensorflow_datasets

Chen, Xie, He 2021, "An Empirical Study of Training Self-Supervised Vision Transformers",
arXiv:2104.02057 (docs/references.md [MoCoV3]; the method: docs/training.md "MoCo v3",
docs/derivations.md §10.4). Each number below is the paper's (§5 and its official recipe for
ViT-B), docs/training.md "SimCLR and MoCo at ImageNet scale" has the table.

**Recipe**: no queue; the symmetric loss ctr(q1, k2) + ctr(q2, k1) over the global batch of
keys at tau = 0.2, queries through a 3-layer projector (4096 hidden, 256 out) and a 2-layer
predictor (4096, 256), BatchNorm in every layer of both (the last one without affine); the
key encoder an EMA with momentum from 0.99 to 1 by a half cosine; AdamW, lr = 1.5e-4 x batch
/ 256 (2.4e-3 at 4096), weight decay 0.1, 40 warm-up epochs then cosine, 300 epochs; the ViT's
patch projection frozen at its random initialisation (§4.2; ``model.frozen =
"encoder/embed"``); BYOL's asymmetric augmentations
(:func:`~contrastive_jax.training.augmentations.recipe_augment_config` ``"moco_v3"``: view 1
blurred always, view 2 blurred with p 0.1 and solarised with p 0.2); pixels normalised with
ImageNet's mean and std. The paper reports 76.7% linear top-1 for ViT-B/16 (its SGD
protocol; ours is CLIP's L-BFGS on centre crops, docs/evaluation.md).

**What differs from the official code**: the ViT learns its position embeddings (the code
fixes 2D sin-cos ones) and weight decay applies to kernels and embeddings only (the code's
AdamW decays every parameter but those it lists). Stated in docs/training.md.

**Memory** (docs/benchmarks.md "SimCLR and MoCo templates on a pod"): with the scanned ViT the
step needs accumulation 4 on a v5e-64 and 8 on a v4-32 (BatchNorm then per micro-batch);
``--config.model.encoder.scan=False`` fits a v5e-64 at one micro-batch (13.78 GiB of 15.75 by
the TPU compiler), at a longer compile.

**Steps**: ``ceil(epochs * 1,281,167 / batch)``: 93,836 at 300 epochs and batch 4096; the
momentum schedule spans them (``moco_v3.schedule_steps = 0``: ``total_steps``).

Variants: ``epochs`` (300), ``batch`` (4096), ``momentum`` (0.99: m at step 0),
``temperature`` (0.2), ``res`` (224), ``steps``, ``frozen_patch`` (True), ``accumulation`` (1),
``tiny`` (a one-block ViT on the mock ``imagenet2012`` at 32 px, batch 16, one step: the test
suite's).
"""

import ml_collections

from contrastive_jax.training import augmentations
from contrastive_jax.training.config import base_config, model_wide, parse
from contrastive_jax.training.data import imagenet


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    v = parse(arg, epochs=300.0, batch=4096, momentum=0.99, temperature=0.2, res=224, steps=0,
              frozen_patch=True, accumulation=1, tiny=False)
    config = base_config()
    size = 32 if v.tiny else v.res
    config.augment = augmentations.recipe_augment_config("moco_v3", size)
    config.data = imagenet.imagenet_data_config(config.augment, v.batch, normalize=True)
    config.input_key = "image"
    config.num_epochs = float(v.epochs)
    config.total_steps = v.steps or imagenet.steps_for_epochs(v.epochs, v.batch)
    config.model = {
        "name": "projected_encoder",
        # ViT-B/16, the class token's features (768) to the projector
        "encoder": {"name": "vit", "image_size": size, "patch": 16, "in_channels": 3,
                    "width": 768, "depth": 12, "heads": 12, "mlp_ratio": 4, "features": None,
                    "class_token": True, "pool": "token", "activation": "gelu",
                    "layer_norm_eps": 1e-6, "scan": True, "patch_dropout": 0.0},
        # projector g: 3 layers, 4096 hidden, 256 out; predictor p: 2 layers (§5)
        "head": {"hidden": 4096, "out": 256, "layers": 3, "out_batch_norm": True},
        "predictor": {"hidden": 4096, "out": 256, "layers": 2, "out_batch_norm": True},
        **model_wide(dtype="bfloat16", remat=False, attention="auto"),
    }
    if v.frozen_patch:
        config.model.frozen = "encoder/embed"  # the random patch projection (§4.2)
    config.method = "moco_v3"
    config.moco_v3 = {"momentum": v.momentum, "momentum_schedule": "cosine",
                      "schedule_steps": 0}
    config.loss = {"name": "moco_v3", "temperature": v.temperature, "strategy": "all_gather"}
    config.optimizer = {"name": "adamw", "learning_rate": 1.5e-4 * v.batch / 256,
                        "b1": 0.9, "b2": 0.999, "weight_decay": 0.1,
                        "warmup_steps": min(config.total_steps - 1,
                                            imagenet.steps_for_epochs(40, v.batch)),
                        "end_lr_fraction": 0.0}
    config.accumulation_steps = v.accumulation
    config.evaluation.classification = False
    config.evaluation.tasks = ("linear/imagenet2012", "knn/imagenet2012")
    config.log_every = 50
    config.checkpoint_every = 1000
    if v.tiny:
        imagenet.make_tiny_data(config)
        config.total_steps = v.steps or 1
        config.log_every = 1
        config.optimizer.warmup_steps = 0
        config.model.encoder.update({"patch": 8, "width": 16, "depth": 1, "heads": 2,
                                     "mlp_ratio": 2})
        config.model.head.update({"hidden": 32, "out": 8})
        config.model.predictor.update({"hidden": 32, "out": 8})
    return config
