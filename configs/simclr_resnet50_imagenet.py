"""SimCLR on ImageNet as the paper ran it: ResNet-50, batch 4096, LARS, 100 epochs ([SimCLR]).

On a TPU pod (every worker, same command; docs/launching.md "TPU VM pod"):

    CONTRASTIVE_JAX_DISTRIBUTED=auto python -m contrastive_jax.main \\
        --config=configs/simclr_resnet50_imagenet.py --workdir=gs://BUCKET/simclr_r50 \\
        --config.data.data_dir=gs://BUCKET/tensorflow_datasets

Chen, Kornblith, Norouzi, Hinton 2020, "A Simple Framework for Contrastive Learning of Visual
Representations", arXiv:2002.05709 (docs/references.md [SimCLR]); each number below is the
paper's, the section where it says so in the comment; docs/training.md "SimCLR and MoCo at
ImageNet scale" has the table.

**Data**: ``imagenet2012`` prepared as array_record in ``data.data_dir``
(:mod:`contrastive_jax.training.data.imagenet`); two random resized crops of each image in the
input workers, the rest of SimCLR's augmentations on the device (Appendix A:
:func:`~contrastive_jax.training.augmentations.recipe_augment_config` ``"simclr"``); pixels in
[0, 1], no mean/std (SimCLR's code feeds [0, 1] images).

**Steps**: ``ceil(epochs * 1,281,167 / batch)``: 31,279 at the default 100 epochs and batch
4096, 10 of them warm-up epochs (3,128 steps), then cosine decay to 0 (§B.1).

**Evaluation** at the end (and every ``evaluation.every`` steps): the ``linear/imagenet2012``
and ``knn/imagenet2012`` tasks on the encoder's pooled features h (the head dropped): the
linear one is CLIP's L-BFGS protocol on centre crops, not SimCLR's 90-epoch SGD (docs/
evaluation.md), the kNN one weighted 20-NN at T = 0.07. The paper's ResNet-50 reaches 64.4%
linear top-1 at 100 epochs and batch 4096 with tau 0.1 (Table 5), 69.3% at 1000 epochs
(Table 6), by its own protocol (§B.6).

Variants: ``epochs`` (100), ``batch`` (4096; the learning rate follows as 0.3 x batch / 256),
``width`` (1, 2, 4: ResNet-50 (1x), (2x), (4x)), ``depth`` (50; 18, 34, 101, 152), ``temperature``
(0.1; the paper's 0.5 is for small batches), ``res`` (224), ``accumulation`` (1),
``tiny`` (a small ResNet on the mock ``imagenet2012`` at 32 px, batch 16, one step: the test
suite's), ``small`` (the recipe at CPU size on the generated ``shapes`` at 32 px: a 16-32-64
ResNet, batch 256, LARS at 0.075 x sqrt(batch) (§B.1), 300 steps, linear probe and kNN every
75; experiments/ssl_recipes.py).
"""

import ml_collections

from contrastive_jax.training import augmentations
from contrastive_jax.training.config import base_config, model_wide, parse
from contrastive_jax.training.data import imagenet
from contrastive_jax.training.data.datasets import shapes


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    v = parse(arg, epochs=100.0, batch=4096, width=1, depth=50, temperature=0.1, res=224,
              accumulation=1, steps=0, tiny=False, small=False)
    config = base_config()
    size = 32 if v.tiny else v.res
    config.augment = augmentations.recipe_augment_config("simclr", size)  # Appendix A
    config.data = imagenet.imagenet_data_config(config.augment, v.batch, normalize=False)
    config.input_key = "image"
    config.num_epochs = float(v.epochs)  # recorded; total_steps is what runs
    config.total_steps = v.steps or imagenet.steps_for_epochs(v.epochs, v.batch)
    config.model = {
        "name": "projected_encoder",
        # ResNet-50 (torchvision's layout) of width 1x / 2x / 4x, its pooled 2048 w features h
        "encoder": {"name": "resnet", "depth": v.depth, "width_multiplier": v.width,
                    "stem": "imagenet", "in_channels": 3, "features": 0,
                    "zero_init_residual": False},
        # g: 2048 -> 2048 -> 128, BatchNorm on the hidden layer (§B.1, Appendix B.4)
        "head": {"hidden": 2048 * v.width, "out": 128, "layers": 2},
        "learn_temperature": False,
        "init_temperature": v.temperature,
        # bf16 convolutions, float32 parameters and BatchNorm statistics; BatchNorm over the
        # global batch (the mesh's whole data axis: SimCLR's global BN, §2.3)
        **model_wide(dtype="bfloat16", remat=False),
    }
    config.method = "simclr"
    # NT-Xent over the 2N views, tau = 0.1 (§B.1 / Table 5), the negatives passed round a
    # ring of the devices (exact, never the 2N x 2N logits on one device)
    config.loss = {"name": "nt_xent", "temperature": v.temperature, "impl": "tiled",
                   "strategy": "ring", "normalize": True, "max_scale": 100.0}
    # LARS, lr = 0.3 x batch / 256 (4.8 at 4096), momentum 0.9, weight decay 1e-6, BatchNorm
    # and biases excluded from both the decay and the trust ratio (§B.1, Appendix B.1)
    config.optimizer = {"name": "lars", "learning_rate": 0.3 * v.batch / 256,
                        "momentum": 0.9, "weight_decay": 1e-6, "trust_coefficient": 0.001,
                        "warmup_steps": min(config.total_steps - 1,
                                            imagenet.steps_for_epochs(10, v.batch)),
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
        config.model.encoder = {"name": "resnet", "in_channels": 3, "widths": (8, 16),
                                "features": 16}
        config.model.head = {"hidden": 16, "out": 8, "layers": 2}
        config.loss.block_size = 4
    if v.small:  # CPU size: the generated shapes (two-view host crops as above), float32
        config.augment = augmentations.recipe_augment_config("simclr", shapes.SIZE)
        imagenet.make_small_run(config, v, {"epochs": 100.0, "batch": 4096, "width": 1,
                                            "depth": 50, "res": 224}, normalize=False)
        batch = config.data.batch_size
        config.model.encoder = {"name": "resnet", "in_channels": 3, "widths": (16, 32, 64),
                                "blocks_per_stage": 1, "features": 0}
        config.model.head = {"hidden": 64, "out": 64, "layers": 2}  # h's width, as 2048
        # square-root scaling, better than linear at small batches with LARS (§B.1)
        config.optimizer.learning_rate = 0.075 * batch ** 0.5
        config.optimizer.warmup_steps = max(1, config.total_steps // 10)
    return config
