"""InfoNCE as a mutual-information estimator: a critic trained on pairs with known MI.

[Poole] (docs/references.md): a critic ``f(x, y)`` (here a dual encoder: two MLPs and a learned
scale) trained with one-directional InfoNCE; ``log N - L`` estimates a lower bound on
``I(X; Y)`` (docs/derivations.md, the InfoNCE bound). On generated pairs whose MI is known
(``correlated_gaussians``), the true value goes into ``results.json`` next to the estimate.
"""

from __future__ import annotations

from contrastive_jax.training.data.correlated_gaussians import (
    CorrelatedGaussians,
    mutual_information,
)
from contrastive_jax.training.methods.clip_siglip import CLIP


class MICritic(CLIP):
    """CLIP's step (use ``loss.direction = "x_to_y"``); reports the true MI where it is known."""

    name = "mi_critic"

    def results(self, source, config):
        if isinstance(source, CorrelatedGaussians):
            return {"true_mutual_information": mutual_information(source.dim, source.rho)}
        return {}
