"""The run's plumbing: everything around the train step that makes a run a run.

What it keeps in its workdir (:mod:`.workdir`: where the workdir is, a local path or ``gs://``;
the lock that allows one run per workdir; the config record; JSON outputs) and
:mod:`.checkpoints`; how it starts (:mod:`.init_from`: ``model.init_from``; :mod:`.launch`:
several processes, and what a lost host of them does; :mod:`.compilation_cache`), how it
reports (:mod:`.progress`; :mod:`.profiling`: traces of chosen steps; :mod:`.provenance`: where
a result came from) and how it stops (:mod:`.preemption`: signals; :mod:`.skipped_updates`: the
non-finite guard). The loop that uses them is :mod:`contrastive_jax.training.train`.
"""
