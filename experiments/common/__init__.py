"""Helpers shared by the experiment scripts (not part of the library): run sweeps, write reports.

The scripts run as ``python experiments/NAME.py``, so ``experiments/`` is on ``sys.path`` and
``from common import sweep, reporting`` finds this package.
"""
