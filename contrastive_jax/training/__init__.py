"""The training layer: everything between a config and a trained, evaluated model.

Built on the losses (:mod:`contrastive_jax.losses`), never the other way round:

- :mod:`~contrastive_jax.training.methods`: SimCLR, MoCo, CLIP, SigLIP, the MI critic; each owns
  its loss call, its settings, its extra state and its hooks;
- :mod:`~contrastive_jax.training.models`, :mod:`~contrastive_jax.training.augmentations`,
  :mod:`~contrastive_jax.training.data`: Flax NNX encoders, JAX augmentations, TFDS + grain input;
- :mod:`~contrastive_jax.training.step`: the train step, the train state, gradient accumulation,
  the state's sharding, the optimisers;
- :mod:`~contrastive_jax.training.run`: the run's plumbing (workdir, lock, checkpoints, config
  record, outputs, signals, progress, ``model.init_from``, several processes);
- :mod:`~contrastive_jax.training.train` (the loop), :mod:`~contrastive_jax.training.config`
  (what every config shares);
- :mod:`~contrastive_jax.training.evaluation`: probes, zero-shot, retrieval, geometry.
"""
