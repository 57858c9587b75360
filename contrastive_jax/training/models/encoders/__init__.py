"""Encoders: the networks that map one input (a signal, an image, tokens, a vector) to features.

- :mod:`~contrastive_jax.training.models.encoders.signal_cnn`: :class:`SignalCNN`, a 1-D CNN
  for ``(B, L, C)`` signals such as MNIST-1D;
- :mod:`~contrastive_jax.training.models.encoders.resnet`: :class:`ResNet`, a small ResNet for
  ``(B, H, W, C)`` images;
- :mod:`~contrastive_jax.training.models.encoders.transformer`: :class:`ViT` and
  :class:`TextTransformer`, pre-LayerNorm Transformers (with the options of OpenAI's CLIP);
- :mod:`~contrastive_jax.training.models.encoders.mlp`: :class:`MLPEncoder` for ``(B, D)``
  vectors.

Each takes ``dtype`` (the compute dtype, :mod:`contrastive_jax.training.models.precision`) and
``remat_policy`` (:mod:`contrastive_jax.training.models.remat`) from the model's settings;
:func:`contrastive_jax.training.models.build_encoder` builds one from a config block.
"""

from contrastive_jax.training.models.encoders.mlp import MLPEncoder
from contrastive_jax.training.models.encoders.resnet import ResNet
from contrastive_jax.training.models.encoders.signal_cnn import SignalCNN
from contrastive_jax.training.models.encoders.transformer import TextTransformer, ViT

__all__ = ["MLPEncoder", "ResNet", "SignalCNN", "TextTransformer", "ViT"]
