"""MoCo v2 on ImageNet as the paper ran it: ResNet-50, queue 65,536, m = 0.999, tau = 0.2
([MoCoV2]).

On a TPU pod (every worker, same command; docs/launching.md "TPU VM pod"):

    CONTRASTIVE_JAX_DISTRIBUTED=auto python -m contrastive_jax.main \\
        --config=configs/moco_v2_resnet50_imagenet.py --workdir=gs://BUCKET/moco_v2_r50 \\
        --config.data.data_dir=gs://BUCKET/tensorflow_datasets

Chen, Fan, Girshick, He 2020, "Improved Baselines with Momentum Contrastive Learning",
arXiv:2003.04297 (docs/references.md [MoCoV2]): MoCo ([MoCo], arXiv:1911.05722) with
SimCLR's MLP head, its stronger augmentation with blur, and a cosine learning rate. Each
number below is the paper's (its §3 and Table 1-2, MoCo's §3.3 / §4), docs/training.md
"SimCLR and MoCo at ImageNet scale" has the table.

**Recipe**: batch 256 (the papers' 8 GPUs x 32), SGD with momentum 0.9, lr = 0.03 x batch /
256, weight decay 1e-4, cosine decay over 200 epochs without warm-up; queries from view 1,
keys from the momentum encoder (m = 0.999) on view 2, InfoNCE against the key and a queue of
K = 65,536 past keys at tau = 0.2; head 2048 -> 2048 -> 128 without BatchNorm (MoCo v2's
MLP). Augmentations (Appendix / Figure of [MoCoV2]):
:func:`~contrastive_jax.training.augmentations.recipe_augment_config` ``"moco_v2"`` (crop
scale 0.2-1, jitter 0.4/0.4/0.4/0.1 with p 0.8, grayscale 0.2, blur p 0.5); pixels
normalised with ImageNet's mean and std. The paper reports 67.5% linear top-1 at 200 epochs
and 71.1% at 800 (its SGD protocol; ours is CLIP's L-BFGS on centre crops, docs/evaluation.md).

**Shuffling BN** ([MoCo] §3.3): MoCo ran 8 GPUs of 32 examples, each GPU's BatchNorm over its
own 32, and shuffled the keys' batch across GPUs so that a query and its positive key never share
a BatchNorm's statistics (the queue's keys, from other batches, never did: with shared
statistics the model cheats). The template does the same on any mesh: ``bn_groups = batch /
32`` (every BatchNorm of the ResNet normalises groups of 32 consecutive examples,
:mod:`contrastive_jax.training.models.encoders.ghost_batch_norm`) and the MoCo method
shuffles view 2 before the key encoder and puts its keys back.

**What differs from the papers' code**: weight decay applies to kernels only (PyTorch's SGD
decays every parameter); stated in docs/training.md.

**Steps**: ``ceil(epochs * 1,281,167 / batch)``: 1,000,912 at 200 epochs and batch 256.
At batch ``256 x n`` the queue stays 65,536 (a multiple of every power-of-two batch up to it)
and the learning rate scales linearly.

Variants: ``epochs`` (200; 800), ``batch`` (256), ``queue`` (65536), ``momentum`` (0.999),
``temperature`` (0.2), ``depth`` (50), ``width`` (1), ``res`` (224), ``steps``, ``tiny`` (a small
ResNet on the mock ``imagenet2012`` at 32 px, batch 16 in 2 BatchNorm groups, queue 64, one
step: the test suite's),
``small`` (the recipe at CPU size on the generated ``shapes`` at 32 px: a 16-32-64 ResNet, batch
256 in 8 BatchNorm groups, queue 4,096, m = 0.99 (m = 0.999 averages the key encoder over about
1,000 steps, more than the run), 300 steps, linear probe and kNN every 75;
experiments/ssl_recipes.py).
"""

import ml_collections

from contrastive_jax.training import augmentations
from contrastive_jax.training.config import base_config, model_wide, parse
from contrastive_jax.training.data import imagenet
from contrastive_jax.training.data.datasets import shapes

BN_GROUP = 32  # examples per BatchNorm: MoCo's per GPU (8 GPUs, batch 256)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    v = parse(arg, epochs=200.0, batch=256, queue=65536, momentum=0.999, temperature=0.2,
              depth=50, width=1, res=224, steps=0, tiny=False, small=False)
    config = base_config()
    size = 32 if v.tiny else v.res
    config.augment = augmentations.recipe_augment_config("moco_v2", size)
    config.data = imagenet.imagenet_data_config(config.augment, v.batch, normalize=True)
    config.input_key = "image"
    config.num_epochs = float(v.epochs)
    config.total_steps = v.steps or imagenet.steps_for_epochs(v.epochs, v.batch)
    config.model = {  # the query encoder; the key encoder and the queue are the method's
        "name": "projected_encoder",
        "encoder": {"name": "resnet", "depth": v.depth, "width_multiplier": v.width,
                    "stem": "imagenet", "in_channels": 3, "features": 0,
                    "zero_init_residual": False,
                    # MoCo's per-GPU BatchNorm: groups of 32, the keys shuffled ([MoCo] §3.3)
                    "bn_groups": max(1, v.batch // BN_GROUP)},
        # MoCo v2's MLP head: fc 2048 -> ReLU -> fc 128 ([MoCoV2] §2), no BatchNorm
        "head": {"hidden": 2048 * v.width, "out": 128, "layers": 2, "batch_norm": False},
        **model_wide(dtype="bfloat16", remat=False),
    }
    config.method = "moco"
    config.moco = {"momentum": v.momentum, "queue_size": v.queue}  # [MoCo] §3.3: m, K
    config.loss = {"name": "moco", "temperature": v.temperature}  # [MoCoV2] tau = 0.2
    config.optimizer = {"name": "sgd", "learning_rate": 0.03 * v.batch / 256, "momentum": 0.9,
                        "weight_decay": 1e-4, "warmup_steps": 0, "end_lr_fraction": 0.0}
    config.evaluation.classification = False
    config.evaluation.tasks = ("linear/imagenet2012", "knn/imagenet2012")
    config.log_every = 100
    config.checkpoint_every = 5000
    if v.tiny:
        imagenet.make_tiny_data(config)
        config.moco.queue_size = 64
        config.total_steps = v.steps or 1
        config.log_every = 1
        config.model.encoder = {"name": "resnet", "in_channels": 3, "widths": (8, 16),
                                "features": 16, "bn_groups": 2}  # groups of 8, shuffled
        config.model.head = {"hidden": 16, "out": 8, "layers": 2, "batch_norm": False}
    if v.small:  # CPU size: the generated shapes (two-view host crops as above), float32
        config.augment = augmentations.recipe_augment_config("moco_v2", shapes.SIZE)
        imagenet.make_small_run(config, v, {"epochs": 200.0, "batch": 256, "queue": 65536,
                                            "momentum": 0.999, "depth": 50, "width": 1,
                                            "res": 224}, normalize=True)
        batch = config.data.batch_size
        config.moco.queue_size = 4096
        config.moco.momentum = 0.99
        config.model.encoder = {"name": "resnet", "in_channels": 3, "widths": (16, 32, 64),
                                "blocks_per_stage": 1, "features": 0,
                                "bn_groups": batch // BN_GROUP}
        config.model.head = {"hidden": 64, "out": 64, "layers": 2, "batch_norm": False}
        config.optimizer.learning_rate = 0.03 * batch / 256
    return config
