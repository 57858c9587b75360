"""InfoNCE as a mutual-information estimator: a critic trained on pairs with known MI.

[Poole] (docs/references.md): a critic ``f(x, y)`` (here a dual encoder: two MLPs and a learned
scale) trained with one-directional InfoNCE; ``log N - L`` estimates a lower bound on
``I(X; Y)`` (docs/derivations.md, the InfoNCE bound). On generated pairs whose MI is known
(``correlated_gaussians``), the true value goes into ``results.json`` next to the estimate: a
source whose MI is known says so by a ``true_mutual_information`` attribute, so the method asks
the source and knows no dataset.
"""

from __future__ import annotations

from contrastive_jax.training.methods.clip_siglip import CLIP


class MICritic(CLIP):
    """CLIP's step (use ``loss.direction = "x_to_y"``); reports the true MI where it is known."""

    name = "mi_critic"

    def results(self, source, config):
        known = getattr(source, "true_mutual_information", None)
        return {} if known is None else {"true_mutual_information": float(known)}
