"""Checkpoints of other projects converted to this project's models, offline.

- :mod:`~contrastive_jax.training.models.converters.clip_import`: an OpenAI CLIP or open_clip
  ViT-CLIP checkpoint as a ``dual_encoder`` config block and its parameters (the command
  ``python -m contrastive_jax.training.models.converters.clip_import``; docs/pretrained.md);
- :mod:`~contrastive_jax.training.models.converters.state_dict_files`: PyTorch state dicts
  (``.safetensors``, ``.pt`` / ``.bin``) read as NumPy arrays.

Nothing here is imported by training; the package itself imports no converter, so
``python -m`` runs each one without a second import.
"""
