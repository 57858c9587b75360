"""contrastive_jax: exact, scalable contrastive representation learning in JAX."""

from contrastive_jax.losses import (
    clip_loss,
    info_nce,
    l2_normalize,
    mi_lower_bound,
    moco_infonce,
    nt_xent,
)

__version__ = "0.2.0"

__all__ = ["clip_loss", "info_nce", "l2_normalize", "mi_lower_bound", "moco_infonce", "nt_xent"]
