"""The package's own datasets, generated locally (nothing is downloaded).

- :mod:`~contrastive_jax.training.data.datasets.mnist1d`: the TFDS builder ``mnist1d``
  (MNIST-1D signals ``(40, 1)``, 4000 / 1000);
- :mod:`~contrastive_jax.training.data.datasets.digits`: the TFDS builder ``digits``
  (scikit-learn's 8x8 digit images, 1437 / 360);
- :mod:`~contrastive_jax.training.data.datasets.digit_captions`: the TFDS builder
  ``digit_captions`` (configs ``mnist1d`` and ``digits``: each sample paired with a caption);
- :mod:`~contrastive_jax.training.data.datasets.shapes`: the TFDS builder ``shapes`` (32 x 32
  RGB images of ten shapes in colours drawn independently of the class, 20,000 / 2,000);
- :mod:`~contrastive_jax.training.data.datasets.correlated_gaussians`: pairs ``(x, y)`` with
  known mutual information, a random-access source and a jit-able sampler.

The TFDS builders register under those names when their module is imported;
:mod:`contrastive_jax.training.data.prepare` imports them and builds them into a data dir.
"""
