"""Pod-scale template: CLIP ViT-B/16 on a TFDS image-text dataset, 32k global batch, ring loss.

On a TPU pod (every worker, same command; docs/launching.md "TPU VM pod"):

    CONTRASTIVE_JAX_DISTRIBUTED=auto python -m contrastive_jax.main \\
        --config=configs/clip_vit_b16_pod.py:tokenizer=gs://BUCKET/coco_sp32k.model \\
        --workdir=gs://BUCKET/clip_b16 --config.data.data_dir=gs://BUCKET/tensorflow_datasets

**Data** (docs/data.md "Image-text datasets"). The dataset (default ``coco_captions``, COCO
2014 with Karpathy & Fei-Fei's splits: train 82,783, restval 30,504, val 5,000, test 5,000
images, 5-7 captions each) must be prepared once as array_record in ``data_dir``, on a machine
with internet and TensorFlow (``tfds build coco_captions --file_format=array_record``); this
program reads the prepared folder without TensorFlow. Training uses ``train+restval``
(113,287 images, the usual Karpathy training set); evaluation (retrieval Recall@k both ways,
alignment, uniformity; the exact pair is the match) runs on ``val``; set
``data.eval_split=test`` for the 5k-test numbers. Images are resized (shorter side) and
centre-cropped to 224 (training: a random resized crop of 90-100% of the area, as open_clip;
bicubic; JPEGs decoded at reduced size), sent to the device as uint8 and normalised there with
CLIP's mean and std; of an image's captions, epoch ``e`` takes caption ``e mod k``.

**Tokenizer.** A SentencePiece model built from the training captions
(``python -m contrastive_jax.training.data.build_tokenizer --dataset=coco_captions
--split=train+restval --vocab_size=32000 --data_dir=... --output=coco_sp32k.model``), given by
the variant ``tokenizer=PATH`` (``data.preprocess.tokenizer.path``); captions are cut at 32
tokens. The text tower has ``vocab_size`` = 32000 embedding rows; a tokenizer needing more is
a ConfigError at start (``data.preprocess.vocab_size`` follows
``model.text_encoder.vocab_size``). Without a tokenizer the run stops at start with the
command above.

**Steps.** ``steps`` (default 0) is derived from ``epochs`` and the dataset's training size:
``ceil(epochs * 113,287 / batch)``. At 32768 a COCO epoch is only 3.46 steps, so the default
100 epochs is 346 steps (11.3M image-text pairs seen; each image 100 times, each of its
captions ~20 times), with a linear warmup over the first 10% (34 steps) then cosine decay.
COCO is small for a 32k batch: a from-scratch ViT-B/16 on it is data-limited long before
CLIP's 12.8B samples, and more epochs mostly overfit, so the template keeps the pass count
moderate; for a larger dataset pass ``data=NAME`` with ``epochs=`` (its training size must be
in ``TRAIN_EXAMPLES``) or ``steps=N``.

The loss is the exact CLIP loss with negatives passed round a ring of all devices (memory
O(N d / D) per device, contrastive_jax.losses.sharded), so the 32768 x 32768 logits are never
built anywhere.

**Your own shards** (docs/data.md "Your own image-text shards"), streamed:
``stream=PATTERN,steps=N`` trains straight from webdataset tars or parquet files, local or
``gs://`` (``data.source = "shards"``, ``data.shards = PATTERN``: brace ranges such as
``gs://BUCKET/laion/{00000..41407}.tar`` and globs; a pattern with a ``{a,b}`` list, whose
comma the variant syntax would split, goes in ``--config.data.shards``), evaluated on the
shards of ``heldout_stream=PATTERN`` (without it, no evaluation). Or converted first:
``shards=NAME,steps=N`` trains
on a dataset written by ``python -m contrastive_jax.training.data.convert_shards --name=NAME``
(one ``train`` split): its first ``heldout`` (default 5000) examples are the evaluation split
(``train[:5000]``), the rest the training split (``train[5000:]``).

**From a pretrained model** (LiT, [LiT]; docs/pretrained.md): ``pretrained=SOURCE`` (a
converted directory, a trainer workdir, an open_clip hub directory or cache snapshot, an
``hf-hub:`` id, a big_vision ``.npz``; :func:`contrastive_jax.pretrained.read_source` reads its
model block without its weights) makes the model exactly the source's (a CLIP or a SigLIP: then the
SigLIP method and loss), started from its parameters (``model.init_from``), with the image
tower locked (``mode=locked``, default: ``model.frozen = "sample_encoder"``) or everything
trained (``mode=finetune``); the images at the model's size with the model's resize kernel,
evaluation resize (SigLIP's ``squash``) and mean and std (filled at start from the source:
a trainer workdir's own, a converted directory's or open_clip's),
captions at its context length with its own tokenizer (the
source's file, or ``tokenizer=FILE``: that tokenizer's file, e.g. a SigLIP model's
``spiece.model``). LiT with a SigLIP image tower is then one config::

    python -m contrastive_jax.main --workdir=gs://BUCKET/lit \
        --config=configs/clip_vit_b16_pod.py:pretrained=converted/vit_b16_siglip

Lower resolution (CLIPA, docs/training.md "Cheaper training"): ``res=112`` trains on 112 x 112
images (49 patches instead of 196); the full-resolution tuning run is
``pretrained=WORKDIR,mode=finetune,res=224`` (the first run's model at 224, its position table
resampled to the 14 x 14 grid, docs/pretrained.md; the source's patch dropout is not carried
over).

Patch dropout (FLIP, docs/training.md "Cheaper training"): the variant ``patch_dropout=0.5``
(or ``--config.model.sample_encoder.patch_dropout=0.5``: the template writes the field, 0.0
by default) trains with each image keeping half of its 196 patch tokens (evaluation keeps
all); the unmasked tuning phase is the same config with
``--config.model.sample_encoder.patch_dropout=0`` and ``--accept_config_change`` on the same
workdir.

Variants: ``data`` (TFDS name), ``stream`` and ``heldout_stream`` (shard patterns),
``shards`` (a converted dataset), ``heldout``, ``batch``,
``epochs``, ``steps``, ``strategy``, ``tokenizer``, ``accumulation``, ``pretrained``, ``mode``,
``patch_dropout``, ``res``, ``tiny`` (a
few-KB model, or only the data and the step count with ``pretrained``; batch 16, one step, or
``steps=N`` steps: the
test suite runs it on 8 CPU devices on mock ``coco_captions``, written by
``python -m contrastive_jax.training.data.prepare --mock coco_captions``).
"""

import math

import ml_collections

from contrastive_jax.errors import ConfigError
from contrastive_jax.training import augmentations, data
from contrastive_jax.training.augmentations import pixels
from contrastive_jax.training.config import base_config, model_wide, parse
from contrastive_jax.training.models.dropout import check_patch_dropout

# Training examples of the datasets whose step count the template derives from ``epochs``
# (TFDS catalog sizes of the prepared splits).
TRAIN_EXAMPLES = {("coco_captions", "train+restval"): 82_783 + 30_504,
                  ("coco_captions", "train"): 82_783}
TRAIN_SPLIT = {"coco_captions": "train+restval"}
WARMUP_FRACTION = 0.1


def steps_for(name: str, split: str, epochs: float, batch: int) -> int:
    """``ceil(epochs * examples / batch)`` for a dataset in TRAIN_EXAMPLES."""
    if (name, split) not in TRAIN_EXAMPLES:
        raise ConfigError(f"the template does not know the size of {name}[{split}]; give the "
                          "step count with the variant steps=N")
    return math.ceil(epochs * TRAIN_EXAMPLES[name, split] / batch)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    v = parse(arg, data="coco_captions", shards="", stream="", heldout_stream="", heldout=5000,
              batch=32768, epochs=100,
              steps=0, strategy="ring", tokenizer="", accumulation=1, tiny=False,
              pretrained="", mode="locked", patch_dropout=0.0, res=0)
    config = base_config()
    config.data = data.default_data_config()
    split, eval_split = TRAIN_SPLIT.get(v.data, "train"), "val"
    if v.shards:  # a dataset written by convert_shards: one split, its first examples held out
        if not v.steps:
            raise ConfigError(f"shards={v.shards}: give the step count with the variant steps=N "
                              "(the template does not know the dataset's size)")
        split, eval_split = f"train[{v.heldout}:]", f"train[:{v.heldout}]"
    if v.stream and (v.shards or not v.steps):
        raise ConfigError(f"stream={v.stream}: give the step count with steps=N (a stream's "
                          "size is not known)" if not v.steps else
                          "stream= and shards= are two sources: choose one")
    # 24 worker processes: ~6 host cores per v4 chip, 4 chips a host (docs/benchmarks.md
    # "Image input")
    config.data.update({"name": v.shards or v.data, "batch_size": v.batch, "num_threads": 2,
                        "worker_count": 24, "prefetch": 4, "train_split": split,
                        "eval_split": eval_split,
                        # a multiple of 256 devices; val's 5000 images in 2 padded batches
                        "eval_batch_size": 2560})
    if v.stream:  # straight from the shards (data.source = "shards"), evaluation on
        config.data.update({"source": "shards", "shards": v.stream,  # the held-out ones
                            "heldout_shards": v.heldout_stream, "eval_split": "heldout"})
    config.total_steps = v.steps or steps_for(v.data, split, v.epochs, v.batch)
    config.num_epochs = float(v.epochs)  # recorded; total_steps above is what runs
    # decoded (JPEGs at reduced size), cropped and resized (bicubic) on the host, uint8 to the
    # device; open_clip's training crop (a random resized crop of 90-100% of the area),
    # the centre crop in evaluation; CLIP's mean/std applied on the device
    config.data.preprocess = {"name": "image_text", "image_key": "image",
                              "caption_key": "captions/text", "image_size": 224,
                              "max_tokens": 32, "resize": "bicubic", "crop": "random",
                              "crop_scale": (0.9, 1.0), "reduced_decode": True,
                              "mean": pixels.CLIP_MEAN, "std": pixels.CLIP_STD,
                              "tokenizer": {"kind": "sentencepiece", "path": v.tokenizer}}
    config.input_key = "image"
    config.text_key = "caption"
    config.augment = augmentations.default_augment_config("image")
    config.augment.update({"resized_crop": 0.0, "shift": 0.0, "rotation": 0.0, "flip": 0.5,
                           "brightness": 0.0, "contrast": 0.0, "saturation": 0.0, "hue": 0.0,
                           "grayscale": 0.0, "blur": 0.0, "noise": 0.0, "cutout": 0.0})
    config.model = {
        "name": "dual_encoder",
        # scan: each tower's blocks as one lax.scan over stacked parameters (compile time
        # flat in depth; False: unrolled, docs/training.md)
        "sample_encoder": {"name": "vit", "image_size": 224, "patch": 16, "in_channels": 3,
                           "width": 768, "depth": 12, "heads": 12, "mlp_ratio": 4,
                           "features": 768, "scan": True, "patch_dropout": 0.0},
        "text_encoder": {"name": "text_transformer", "vocab_size": 32000, "max_tokens": 32,
                         "width": 512, "depth": 12, "heads": 8, "mlp_ratio": 4,
                         "features": 512, "scan": True},
        "embed_dim": 512,
        "init_temperature": 0.07,
        # bf16 matmuls, float32 parameters, optimiser state and loss statistics; every
        # Transformer block recomputed in the backward pass (docs/training.md); cuDNN's fused
        # attention on a GPU where it applies, else XLA (encoders/attention.py)
        **model_wide(dtype="bfloat16", remat=True, attention="auto"),
    }
    # parameters and AdamW moments split over the 256 chips (docs/sharding.md)
    config.sharding.params = "fsdp"
    config.accumulation_steps = v.accumulation
    config.method = "clip"
    config.loss = {"name": "clip", "strategy": v.strategy, "block_size": 1024}
    config.optimizer = {"name": "adamw", "learning_rate": 5e-4,
                        "warmup_steps": int(WARMUP_FRACTION * config.total_steps),
                        "b1": 0.9, "b2": 0.98, "eps": 1e-6, "weight_decay": 0.2,
                        "grad_clip_norm": 1.0}
    if v.pretrained:
        _from_pretrained(config, v.pretrained, v.mode, v.tokenizer, v.strategy)
    elif v.mode != "locked":
        raise ConfigError("mode= applies with pretrained=SOURCE (LiT or fine-tuning)")
    # the tokenizer's ids must fit the text tower's embedding rows (checked at start)
    config.data.preprocess.vocab_size = config.model.text_encoder.get_ref("vocab_size")
    # captions, no labels: retrieval Recall@k both ways, alignment and uniformity on the
    # evaluation split (one caption per image, the exact pair is the match)
    config.evaluation.classification = False
    # a stream without held-out shards has nothing to evaluate on
    config.evaluation.enabled = not v.stream or bool(v.heldout_stream)
    config.log_every = 10
    config.checkpoint_every = 50  # ~15 COCO epochs at 32k; the last step is saved as well
    if v.tiny:
        config.data.update({"batch_size": 16, "eval_batch_size": 16, "num_threads": 1,
                            "worker_count": 0, "prefetch": 1})
        config.total_steps = v.steps or 1
        config.log_every = 1
        config.optimizer.warmup_steps = 0
        config.loss.block_size = 2
        config.sharding.min_size = 0  # split even the tiny leaves, so the test covers FSDP
        if v.pretrained:  # the source's model as it is
            return _cheaper(config, v.res, v.patch_dropout)
        config.data.preprocess.update({"image_size": 32, "max_tokens": 12})
        config.model.sample_encoder.update({"image_size": 32, "width": 16, "depth": 1,
                                            "heads": 2, "features": 16})
        config.model.text_encoder.update({"vocab_size": 64, "max_tokens": 12, "width": 16,
                                          "depth": 1, "heads": 2, "features": 16})
        config.model.embed_dim = 8
    return _cheaper(config, v.res, v.patch_dropout)


def _cheaper(config: ml_collections.ConfigDict, res: int,
             patch_dropout: float) -> ml_collections.ConfigDict:
    """``res=N``: images of N x N pixels, cropped and resized so on the host and fed to a ViT
    of that size (CLIPA's low-resolution pre-training; 0: the config's own size);
    ``patch_dropout=P``: each training image keeps 1 - P of its patch tokens (FLIP; 0: all,
    written out so that ``--config.model.sample_encoder.patch_dropout`` can set it)."""
    config.model.sample_encoder.patch_dropout = check_patch_dropout(patch_dropout)
    if res:
        if not isinstance(res, int) or isinstance(res, bool) or res < 1:
            raise ConfigError(f"res={res!r}: give the image size in pixels, e.g. res=112")
        config.data.preprocess.image_size = res
        config.model.sample_encoder.image_size = res
    return config


def _from_pretrained(config: ml_collections.ConfigDict, source: str, mode: str, tokenizer: str,
                     strategy: str) -> None:
    """The model, pixels, captions and loss of a run that starts from ``source`` (the module
    docstring, "From a pretrained model")."""
    from contrastive_jax.pretrained import read_source

    if mode not in ("locked", "finetune"):
        raise ConfigError(f"mode must be 'locked' (LiT: the image tower frozen) or 'finetune'; "
                          f"got {mode!r}")
    found = read_source(source)  # its description; the weights are read when the run starts
    block, spec, pixels = found.model, found.tokenizer, found.preprocess
    if block.get("name") != "dual_encoder" or block["sample_encoder"].get("name") != "vit":
        raise ConfigError(f"pretrained={source}: a dual encoder with a ViT image tower is "
                          f"needed; its model is {block.get('name')!r}")
    if spec is None:
        raise ConfigError(f"pretrained={source}: its tokenizer is not one this project "
                          "computes (CLIP's BPE, SigLIP's SentencePiece)")
    if tokenizer:
        spec = {**spec, "path": tokenizer}
    if not spec.get("path"):
        raise ConfigError(f"pretrained={source} has no tokenizer file: give its own with "
                          f"tokenizer=FILE (kind {spec['kind']!r}: CLIP's "
                          "bpe_simple_vocab_16e6.txt.gz or a SigLIP model's spiece.model)")
    # the source's architecture; its patch dropout was a setting of its training run (this
    # run's is the variant's, 0.0 by default: _cheaper)
    towers = {k: {"scan": True, **{s: u for s, u in block[k].items() if s != "patch_dropout"}}
              for k in ("sample_encoder", "text_encoder")}
    config.model = {**block, **towers,
                    **model_wide(dtype="bfloat16", remat=True, attention="auto"),
                    "init_from": {"path": source}}
    if mode == "locked":
        config.model.frozen = "sample_encoder"
    pixels = dict(pixels or {})
    config.data.preprocess.update({
        "image_size": block["sample_encoder"]["image_size"],
        "max_tokens": block["text_encoder"]["max_tokens"], "tokenizer": spec,
        # the source's resize kernel and evaluation resize (SigLIP: squash)
        "resize": pixels.get("resize", "bicubic"),
        "resize_mode": pixels.get("resize_mode", "shortest"),
        "mean": None, "std": None})  # the source's, filled at start (training/run_spec.py)
    if block.get("siglip"):
        config.method = "siglip"
        config.loss = {"name": "siglip", "strategy": strategy, "block_size": 1024}
