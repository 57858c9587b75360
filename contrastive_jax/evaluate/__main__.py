"""``python -m contrastive_jax.evaluate``: :func:`contrastive_jax.evaluate.main`."""

import sys

from contrastive_jax.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
