"""What a run keeps in its workdir, beside the checkpoints.

:mod:`.workdir_path`: the workdir as a path, local or ``gs://``; :mod:`.workdir_lock`: one run
per workdir; :mod:`.config_record`: ``config.json``, the recorded config a resume is checked
against; :mod:`.json_output`: strict JSON written atomically (``results.json``, the records).
"""
