"""``python -m contrastive_jax.plan``: :func:`contrastive_jax.plan.command.main`."""

from contrastive_jax.plan.command import main

if __name__ == "__main__":
    main()
