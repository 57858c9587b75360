"""Checkpoints of other projects converted to this project's models, and back, offline.

- :mod:`~contrastive_jax.training.models.converters.clip_import`: an OpenAI CLIP or open_clip
  checkpoint (CLIP towers, SigLIP's timm towers) as a ``dual_encoder`` config block and its
  parameters, from the model's own open_clip config or, without one, from tensor shapes (the
  command ``python -m contrastive_jax.training.models.converters.clip_import``;
  docs/pretrained.md);
- :mod:`~contrastive_jax.training.models.converters.clip_state_dict`: a CLIP state dict
  without its config, read as the default ViT CLIP (the assumptions stated in a warning);
- :mod:`~contrastive_jax.training.models.converters.open_clip`: open_clip's models: where a
  model's files come from, its config as a ``dual_encoder`` block (every option converted
  exactly or refused by name: docs/open_clip_models.md), the timm trunks the configs name,
  the state-dict tensors to parameters and back, and open_clip's files written (the command is
  ``python -m contrastive_jax.clip_export``);
- :mod:`~contrastive_jax.training.models.converters.big_vision_import`: big_vision's SigLIP
  ``.npz`` checkpoints (the file's arrays and the architecture read from their shapes:
  :mod:`~contrastive_jax.training.models.converters.big_vision_npz`);
- :mod:`~contrastive_jax.training.models.converters.state_dict_files`: PyTorch state dicts
  (``.safetensors``, ``.pt`` / ``.bin``) read as NumPy arrays, and a TorchScript archive's
  activation read without running it;
- :mod:`~contrastive_jax.training.models.converters.pretrained_source`: every pretrained
  source (a converted directory, a trainer workdir, an open_clip model, a big_vision ``.npz``)
  classified and read by one reader into one record, :class:`~contrastive_jax.training.
  models.converters.pretrained_source.PretrainedSource`;
- :mod:`~contrastive_jax.training.models.converters.converted_directory`: the converted
  directory on disk (``model.json``, ``params/``, ``preprocess.json``, ``tokenizer.json``) that
  the converters write, the one format every source converts to.

Training imports none of them but the pretrained-source reader (``model.init_from``, which
converts an open_clip source in memory: :mod:`contrastive_jax.training.run.init_from`); the
package itself imports no converter, so ``python -m`` runs each one without a second import.
"""
