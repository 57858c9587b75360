"""The guard on skipped updates: when a run stops because its steps keep coming out non-finite.

The train step skips an update whose loss, gradient or new parameters are not finite
(:func:`contrastive_jax.training.step.train_step.train_step`) and counts ``skipped_in_a_row``.
The training loop reads that counter one step late (no wait on the device) and asks
:func:`check_skipped_updates`; docs/reliability.md, "Numerical guard".
"""

from __future__ import annotations

from contrastive_jax.errors import NonFiniteError


def check_skipped_updates(step: int, in_a_row, limit: int, *, run_ended: bool = False) -> None:
    """A :class:`NonFiniteError` once ``in_a_row`` updates in a row were skipped up to ``step``
    (``limit`` of them), or, when ``run_ended``, if the last update was skipped at all: no later
    finite step shows the model recovered, and a short run whose every update was skipped would
    otherwise end as trained. ``limit`` 0 turns both off."""
    if not limit:  # off: the counter is not read (no wait on the device)
        return
    in_a_row = int(in_a_row)
    if not in_a_row or (in_a_row < limit and not run_ended):
        return
    if in_a_row >= limit:
        what = (f"were non-finite for {in_a_row} steps in a row (each update skipped); "
                f"stopping. Lower the learning rate, check the data, or raise "
                f"max_skipped_in_a_row (now {limit}).")
    else:
        what = (f"were non-finite for the run's last {in_a_row} update(s), each skipped, so "
                "its final model is not a trained one; stopping without results. Lower the "
                "learning rate or check the data.")
    raise NonFiniteError(f"step {step}: the loss, gradient or updated parameters {what}",
                         step=step, in_a_row=in_a_row)
