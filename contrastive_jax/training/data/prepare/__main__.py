"""``python -m contrastive_jax.training.data.prepare``: runs
:func:`contrastive_jax.training.data.prepare.main`.

The command lives in the package's ``__init__`` with the functions it calls; this module is
what ``-m`` runs, and nothing imports it, so the package (imported by
``contrastive_jax.training.data``) is imported once, not a second time as ``__main__``.
"""

import sys

from contrastive_jax.training.data.prepare import main

if __name__ == "__main__":
    sys.exit(main())
