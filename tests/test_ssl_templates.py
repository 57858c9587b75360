"""The SimCLR and MoCo ImageNet templates (configs/simclr_resnet50_imagenet.py,
configs/moco_v2_resnet50_imagenet.py, configs/moco_v3_vit_imagenet.py): the papers' numbers
in each, the full models' sizes, their tiny variants one step each on 8 CPU devices on a mock
``imagenet2012``, and bad variants exiting 2 with one line."""

import math

import jax
import numpy as np
import pytest
from flax import nnx
from test_train import load_config

from contrastive_jax import main
from contrastive_jax.training import train
from contrastive_jax.training.data import imagenet
from contrastive_jax.training.data.example_preprocessing import make_preprocess
from contrastive_jax.training.data.pipeline import HostShard, train_dataset
from contrastive_jax.training.data.prepare import main as prepare_main
from contrastive_jax.training.data.sources import open_split
from contrastive_jax.training.models import architecture_block, build_model

TEMPLATES = ("simclr_resnet50_imagenet.py", "moco_v2_resnet50_imagenet.py",
             "moco_v3_vit_imagenet.py")


@pytest.fixture(scope="module")
def mock_imagenet(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("tfds"))
    assert prepare_main(["--mock", "imagenet2012", f"--data_dir={data_dir}"]) == 0
    return data_dir


def parameters(config, part: str | None = None) -> int:
    """Parameters of the config's model (of ``part`` only: ``encoder``, ``head``), from
    shapes alone."""
    model = nnx.eval_shape(lambda: build_model(architecture_block(config.model),
                                               nnx.Rngs(0)))
    state = nnx.state(getattr(model, part) if part else model, nnx.Param)
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state))


def test_simclr_template_is_the_papers_recipe():
    """[SimCLR] §B.1, Appendix A / B.9: ResNet-50, batch 4096, LARS at 0.3 x 4096 / 256 = 4.8,
    momentum 0.9, weight decay 1e-6, 10 warm-up epochs of 100, tau 0.1, head 2048-2048-128
    with BatchNorm, bf16; the steps are ceil(epochs x 1,281,167 / batch)."""
    c = load_config("simclr_resnet50_imagenet.py")
    assert c.total_steps == math.ceil(100 * 1_281_167 / 4096) == 31_279
    assert c.optimizer.warmup_steps == math.ceil(10 * 1_281_167 / 4096) == 3_128
    assert (c.optimizer.name, c.optimizer.learning_rate, c.optimizer.momentum,
            c.optimizer.weight_decay) == ("lars", 4.8, 0.9, 1e-6)
    assert (c.loss.name, c.loss.temperature, c.data.batch_size) == ("nt_xent", 0.1, 4096)
    assert dict(c.model.head) == {"hidden": 2048, "out": 128, "layers": 2}
    assert (c.model.encoder.depth, c.model.encoder.width_multiplier) == (50, 1)
    assert c.model.dtype == "bfloat16" and c.data.preprocess.views == 2
    assert tuple(c.augment.crop_scale) == tuple(c.data.preprocess.crop_scale) == (0.08, 1.0)
    assert c.data.preprocess.mean is None  # [0, 1] pixels, as SimCLR's code
    assert parameters(c, "encoder") == 23_508_032  # torchvision's resnet50 without fc
    wide = load_config("simclr_resnet50_imagenet.py:width=2,batch=256,epochs=1000")
    assert parameters(wide, "encoder") == 93_907_072  # ResNet-50 (2x): [SimCLR]'s 94M
    assert wide.model.head.hidden == 4096 and wide.optimizer.learning_rate == 0.3
    assert wide.total_steps == math.ceil(1000 * 1_281_167 / 256)


def test_moco_v2_template_is_the_papers_recipe():
    """[MoCoV2] / [MoCo] §3.3: ResNet-50, batch 256, queue 65,536, m 0.999, tau 0.2, SGD at
    0.03 with momentum 0.9 and weight decay 1e-4, no warm-up, 200 epochs, MLP head without
    BatchNorm, crops of 20-100%, ImageNet's mean and std, BatchNorm over groups of 32 with
    the keys shuffled."""
    c = load_config("moco_v2_resnet50_imagenet.py")
    assert c.total_steps == math.ceil(200 * 1_281_167 / 256) == 1_000_912
    assert (c.moco.queue_size, c.moco.momentum, c.loss.temperature) == (65_536, 0.999, 0.2)
    assert (c.optimizer.name, c.optimizer.learning_rate, c.optimizer.momentum,
            c.optimizer.weight_decay, c.optimizer.warmup_steps) == ("sgd", 0.03, 0.9, 1e-4, 0)
    assert dict(c.model.head) == {"hidden": 2048, "out": 128, "layers": 2,
                                  "batch_norm": False}
    assert tuple(c.data.preprocess.crop_scale) == (0.2, 1.0)
    assert tuple(c.data.preprocess.mean) == imagenet.IMAGENET_MEAN
    assert parameters(c, "encoder") == 23_508_032
    big = load_config("moco_v2_resnet50_imagenet.py:batch=1024")
    assert big.optimizer.learning_rate == 0.12 and big.moco.queue_size % 1024 == 0
    # shuffled BatchNorm over MoCo's 32 examples a GPU: 8 groups at 256, 32 at 1024
    assert (c.model.encoder.bn_groups, big.model.encoder.bn_groups) == (8, 32)


def test_moco_v3_template_is_the_papers_recipe():
    """[MoCoV3] §5 and its ViT-B recipe: batch 4096, AdamW at 1.5e-4 x 16 = 2.4e-3, weight
    decay 0.1, 40 warm-up epochs of 300, tau 0.2, m from 0.99 by a cosine, 3-layer projector
    and 2-layer predictor (4096 hidden, 256 out), the patch projection frozen; ViT-B/16's
    85.8M parameters."""
    c = load_config("moco_v3_vit_imagenet.py")
    assert c.total_steps == math.ceil(300 * 1_281_167 / 4096) == 93_836
    assert c.optimizer.warmup_steps == math.ceil(40 * 1_281_167 / 4096) == 12_512
    assert (c.optimizer.name, c.optimizer.learning_rate, c.optimizer.weight_decay) == (
        "adamw", pytest.approx(2.4e-3), 0.1)
    assert (c.moco_v3.momentum, c.moco_v3.momentum_schedule, c.loss.temperature) == (
        0.99, "cosine", 0.2)
    assert (c.model.head.layers, c.model.head.hidden, c.model.head.out) == (3, 4096, 256)
    assert (c.model.predictor.layers, c.model.predictor.hidden) == (2, 4096)
    assert c.model.frozen == "encoder/embed"
    assert round(parameters(c, "encoder") / 1e5) == 858  # ViT-B/16 without a classifier
    assert "frozen" not in load_config("moco_v3_vit_imagenet.py:frozen_patch=False").model


@pytest.mark.parametrize("template", TEMPLATES)
def test_tiny_variant_trains_a_step_on_8_devices_on_mock_imagenet(template, mock_imagenet,
                                                                   tmp_path, capsys):
    """Each template's ``tiny`` variant on the mock: every batch holds two host-cropped
    uint8 views per example, one step on 8 CPU devices with a finite loss, then the
    ``linear/imagenet2012`` and ``knn/imagenet2012`` tasks on the encoder's features."""
    config = load_config(f"{template}:tiny")
    config.data.data_dir = mock_imagenet
    source = open_split("imagenet2012", "train", mock_imagenet, encoded_images=("image",))
    batch = next(iter(train_dataset(source, global_batch_size=16, seed=0,
                                    shard=HostShard(0, 1),
                                    preprocess=make_preprocess(config.data, training=True))))
    assert batch["image"].shape == (16, 2, 32, 32, 3) and batch["image"].dtype == np.uint8
    assert not np.array_equal(batch["image"][:, 0], batch["image"][:, 1])  # two crops
    results = train.train_and_evaluate(config, str(tmp_path / "run"))
    out = capsys.readouterr().out
    assert "on 8 devices" in out and results["steps"] == 1
    assert np.isfinite(results["final_train_metrics"]["loss"])
    for task in ("linear", "knn"):
        assert 0.0 <= results[f"{task}/imagenet2012/acc1"] <= 1.0


@pytest.mark.parametrize("variant,message", [
    ("simclr_resnet50_imagenet.py:depth=42",
     "ResNet depth 42 does not exist; use one of [18, 34, 50, 101, 152]"),
    ("simclr_resnet50_imagenet.py:width=0", "ResNet width_multiplier must be an int >= 1"),
    ("moco_v2_resnet50_imagenet.py:res=16,batch=16,steps=1",
     "a ResNet-50 strides its input by 32: data.preprocess.image_size = 16 is too small"),
    ("moco_v3_vit_imagenet.py:momentum=1.5", "moco_v3.momentum must be a number in [0, 1]"),
])
def test_bad_variants_exit_2_with_one_line(variant, message, mock_imagenet, tmp_path, capsys,
                                           monkeypatch):
    monkeypatch.setenv("CONTRASTIVE_JAX_DATA_DIR", mock_imagenet)
    with pytest.raises(SystemExit) as exit_:
        main.main([f"--config=configs/{variant}", f"--workdir={tmp_path / 'run'}"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert exit_.value.code == 2 and len(err) == 1 and message in err[0], err
