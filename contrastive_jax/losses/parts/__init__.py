"""The pieces every loss is built from.

:mod:`.validation` checks a loss's inputs at the boundary (shapes, dtypes, the loss dtype);
:mod:`.normalize` is the zero-norm-safe L2 normalisation and its closed-form VJP
(docs/derivations.md §2); :mod:`.similarity` the full-precision ``a_hat @ b_hat.T`` (§3);
:mod:`.temperature` the learnable logit scale and its clip at ``max_scale`` (§7.6). They import
nothing else of the package; the public losses (:mod:`contrastive_jax.losses`), the tiling engine
(:mod:`contrastive_jax.losses.tiling`) and the closed forms (:mod:`contrastive_jax.analytic`)
import them.
"""
