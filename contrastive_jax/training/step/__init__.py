"""The train step: one pure function from a train state and a global batch to the next state.

:mod:`.train_step` (the step, jitted over the mesh), :mod:`.train_state` (the state and how it
is created), :mod:`.accumulation` (K micro-batches, the gradient unchanged),
:mod:`.state_sharding` (the state replicated or FSDP over the mesh), :mod:`.optimizers` (the
optimiser, its schedule, the logit-scale clamp). The method
(:mod:`contrastive_jax.training.methods`) supplies the loss; the loop
(:mod:`contrastive_jax.training.train`) calls the step.
"""
