"""Contrastive losses: pure, jit-compatible, numerically stable, zero-norm safe.

Every loss takes raw float32/bfloat16/float64 embeddings, computes logits and log-sum-exps in
float32 (or float64), and validates shapes before tracing. See each function for its formula
and the section of docs/derivations.md it follows.
"""

from contrastive_jax.losses.clip import clip_loss
from contrastive_jax.losses.info_nce import info_nce, masked_logsumexp
from contrastive_jax.losses.moco import moco_infonce
from contrastive_jax.losses.mutual_information import mi_lower_bound
from contrastive_jax.losses.nt_xent import nt_xent
from contrastive_jax.losses.parts.normalize import l2_normalize, l2_normalize_vjp
from contrastive_jax.losses.parts.temperature import logit_scale
from contrastive_jax.losses.siglip import siglip_loss
from contrastive_jax.losses.tiling.custom_vjps import DEFAULT_BLOCK_SIZE

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "clip_loss",
    "info_nce",
    "l2_normalize",
    "l2_normalize_vjp",
    "logit_scale",
    "masked_logsumexp",
    "mi_lower_bound",
    "moco_infonce",
    "nt_xent",
    "siglip_loss",
]
