"""Closed-form gradients of the contrastive losses, one function per formula of the texts.

:mod:`.anchor` holds the single-anchor results of ``000`` Problems 1-5, 7, 8 and 10;
:mod:`.batch` the matrix results of Problems 6 and 9 and ``002`` A.12.6-A.12.8.
"""

from contrastive_jax.analytic import anchor, batch

__all__ = ["anchor", "batch"]
