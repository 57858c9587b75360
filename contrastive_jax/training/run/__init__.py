"""The run's plumbing: everything around the train step that makes a run a run.

Where it writes (:mod:`.workdir_path`, a local path or ``gs://``; :mod:`.workdir_lock`, one
run per workdir), what it keeps (:mod:`.checkpoints`, :mod:`.config_record`, :mod:`.json_output`),
how it starts (:mod:`.init_from`: ``model.init_from``; :mod:`.distributed`: several processes;
:mod:`.compilation_cache`), how it reports (:mod:`.progress`) and how it stops
(:mod:`.preemption`). The loop that uses them is :mod:`contrastive_jax.training.train`.
"""
