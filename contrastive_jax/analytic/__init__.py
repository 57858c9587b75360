"""Closed-form gradients of the contrastive losses, one function per formula of docs/derivations.md.

:mod:`.anchor` holds the single-anchor results of docs/derivations.md §3, §4, §7 and §12;
:mod:`.batch` the matrix results of §2.2, §8.2-8.5 and §9.2 (index: §18.2).
"""

from contrastive_jax.analytic import anchor, batch

__all__ = ["anchor", "batch"]
