"""How the processes of a multi-process run start and what they do when one is lost.

:mod:`.distributed`: the launch settings, ``jax.distributed`` and the check that every process
runs the same config, code and data; :mod:`.job_supervisor`: each process trains in a watched
child, so a lost host is one line and exit 75; :mod:`.process_count`: a checkpoint resumed by
another number of processes (docs/launching.md, docs/reliability.md).
"""
