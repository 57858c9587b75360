"""open_clip's models read and written without open_clip ([OpenCLIP] in docs/references.md).

- :mod:`.model_sources`: where a model's config, weights, pixels and tokenizer come from (a
  file, a hub directory, the Hugging Face cache, a recorded name in ``open_clip_models.json``);
- :mod:`.model_configs`: open_clip's model configs as ``dual_encoder`` blocks, every option
  (the tables of :mod:`.config_options`) converted exactly or refused by name
  (docs/open_clip_models.md); the timm image trunks they name: :mod:`.timm_trunks`;
- :mod:`.tensor_rules`: the table of a block's open_clip tensors (names, shapes, layouts), and
  :mod:`.tensor_layouts`: state dicts to parameters and back through it;
- :mod:`.export_files`: open_clip's files (``open_clip_model.safetensors``,
  ``open_clip_config.json``) of a model (the command is ``python -m contrastive_jax.clip_export``).

``model_sources``, ``config_options``, ``model_configs`` and ``timm_trunks`` import the standard
library only (no JAX, no PyTorch), so the fixture scripts run them where open_clip is
installed; this package imports none of its modules.
"""
