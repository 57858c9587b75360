"""The training layer: everything between a config and a trained, evaluated model.

Built on the losses (:mod:`contrastive_jax.losses`), never the other way round:

- :mod:`~contrastive_jax.training.methods`: SimCLR, MoCo, CLIP, SigLIP, the MI critic; each owns
  its loss call, its extra state and its hooks;
- :mod:`~contrastive_jax.training.models`, :mod:`~contrastive_jax.training.augmentations`,
  :mod:`~contrastive_jax.training.data`: Flax NNX encoders, JAX augmentations, TFDS + grain input;
- :mod:`~contrastive_jax.training.train` (the loop), :mod:`~contrastive_jax.training.train_state`,
  :mod:`~contrastive_jax.training.optimizers`, :mod:`~contrastive_jax.training.checkpoints`,
  :mod:`~contrastive_jax.training.progress`, :mod:`~contrastive_jax.training.preemption`,
  :mod:`~contrastive_jax.training.distributed`, :mod:`~contrastive_jax.training.config`;
- :mod:`~contrastive_jax.training.evaluation`: probes, zero-shot, retrieval, geometry.
"""
