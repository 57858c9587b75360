"""Model FLOPs of one train step: what the progress line's TFLOP/s and MFU divide.

``model FLOPs`` are the floating-point operations of the model's mathematics for one global
batch: the encoders' forward and backward passes, the loss and the optimiser update, counted
by XLA's cost analysis (``Lowered.cost_analysis()``: the HLO of the jitted step before
optimisation, so nothing is compiled) of the step *as a model computes it*, which may differ
from the program the run executes ([PaLM] §B, "model FLOPs utilization"):

* without rematerialisation (``model.remat = False``): remat's recomputation is extra work
  of the implementation, not of the model;
* without accumulation (``accumulation_steps = 1``): the exact accumulation's first pass
  (the rows without gradient) is recomputed work, and its ``lax.scan`` over micro-batches
  would be counted once;
* with every Transformer tower unrolled (``scan = False``): XLA counts a loop body once, so
  a scanned tower's blocks would count as one;
* with the dense single-device loss (``loss.strategy = ""``, ``loss.impl = "autodiff"``): the
  tiled and sharded losses loop over tiles and ring hops (counted once each) and recompute
  the logits in the backward pass;
* with XLA's attention (``model.attention = "xla"``): cuDNN's fused attention is a custom
  call, which XLA's cost analysis counts as no FLOPs.

So the count does not depend on those settings (tests/test_model_flops.py: equal for a
scanned and remat'd config and its plain form, and a ViT's count within a few per cent of the
closed form of its matmuls). Per chip, divide by the devices. Counting traces the
step once more (seconds for a ViT-B/16; a background thread beside the first step's
compilation, :class:`Counter`, waited for before the timed steps); the trainer keeps each count
beside JAX's persistent compilation cache, so a rerun or a resume of the same step reads it
instead (:class:`contrastive_jax.training.run.compilation_cache.ModelFlopsMemo`).

References:
  [PaLM] Chowdhery et al. 2022, Appendix B; docs/references.md.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol

import jax
import ml_collections
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax.mesh import DATA_AXIS
from contrastive_jax.training.models.scanned_layers import SCANNABLE

TOWERS = ("encoder", "sample_encoder", "text_encoder")


def counting_config(config, *, keep_remat: bool = False):
    """A copy of ``config`` whose step is the model's computation (module docstring): remat
    off, one micro-batch, every scanned tower unrolled, the dense single-device loss, XLA's
    attention. ``keep_remat``: remat as the config has it (the FLOPs the chips execute, with
    the recomputation)."""
    if isinstance(config, ml_collections.FrozenConfigDict):  # a RunSpec's: thawed
        config = config.as_configdict()
    copy = config.copy_and_resolve_references()
    # ignore_type: model.remat may hold a policy name or one entry per tower (an AnySetting,
    # resolved to its value by the copy), which a bool replaces
    with copy.unlocked(), copy.ignore_type():
        copy.accumulation_steps = 1
        model = copy.model
        model.attention = "xla"  # cuDNN's kernel is a custom call XLA counts as no FLOPs
        if not keep_remat:
            model.remat = False
            if "remat_policy" in model:
                del model["remat_policy"]
        for tower in TOWERS:
            block = model.get(tower)
            if hasattr(block, "get") and block.get("name") in SCANNABLE:
                block["scan"] = False
        loss = copy.get("loss")
        if loss is not None:
            if "strategy" in loss:
                loss.strategy = ""
            loss.impl = "autodiff"
    return copy


def step_flops(config, mesh: Mesh, batch_shapes: dict[str, jax.ShapeDtypeStruct],
               steps: int, *, as_model: bool = True, keep_remat: bool = False) -> float | None:
    """The global model FLOPs of one step of ``config`` (:func:`counting_config`) for a batch
    of ``batch_shapes`` (``{feature: shape struct}``, the global batch), XLA's count; ``None``
    when the backend gives no cost analysis. ``keep_remat``: with remat's recomputation (what
    the chips execute). ``as_model=False``: XLA's count of the config's own step as it runs
    (loop bodies once, remat's recomputation in)."""
    from contrastive_jax.training.methods import method_for
    from contrastive_jax.training.step.train_state import abstract_state
    from contrastive_jax.training.step.train_step import compiled_step

    counted = counting_config(config, keep_remat=keep_remat) if as_model else config
    try:
        method = method_for(counted)
    except Exception:  # a loss without the dense impl: count the config's own loss
        counted = config
        method = method_for(counted)
    graphdef, state, tx, _ = abstract_state(counted, steps, method, mesh)
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype,
                                     sharding=NamedSharding(mesh, P(DATA_AXIS)))
             for k, v in batch_shapes.items()}
    step = compiled_step(counted, mesh, graphdef, state, tx, steps, method)
    return flops_of(step.lower(state, batch))


def flops_of(lowered_or_compiled) -> float | None:
    """XLA's ``flops`` of a lowered or compiled program (a dict, or a one-element list on
    older JAX); ``None`` when the backend reports none."""
    try:
        cost = lowered_or_compiled.cost_analysis()
    except Exception:  # a backend without cost analysis
        return None
    if isinstance(cost, list | tuple):
        cost = cost[0] if cost else None
    value = (cost or {}).get("flops")
    return float(value) if value is not None and value >= 0 else None


class Memo(Protocol):
    """Where counts are kept between runs (the trainer's:
    :class:`contrastive_jax.training.run.compilation_cache.ModelFlopsMemo`)."""

    def key(self, batch_shapes: dict) -> str: ...

    def get(self, key: str) -> float | None: ...

    def put(self, key: str, flops: float) -> None: ...


class Counter:
    """:func:`step_flops` in a background thread, started with the first step (so that it
    runs while that step compiles); :meth:`result` once that step has run, before the timed
    steps (a count still running would slow them). ``memo``: a count kept by an earlier run
    of the same step is read instead of counted, a new one is kept."""

    def __init__(self, config, mesh: Mesh, method: Any, steps: int, memo: Memo | None = None):
        del method  # the counting config has its own
        self.config, self.mesh, self.steps, self.memo = config, mesh, steps, memo
        self.enabled = bool(config.get("log_model_flops", True))
        self._thread: threading.Thread | None = None
        self._value: float | None = None
        self.error: str | None = None

    def start(self, state, batch: dict) -> None:
        """Count the model FLOPs of a step on batches shaped like ``batch`` (shapes only)."""
        del state
        if not self.enabled or self._thread is not None:
            return
        shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch.items()}

        def count():
            try:
                key = self.memo.key(shapes) if self.memo is not None else None
                kept = self.memo.get(key) if key is not None else None
                if kept is not None:
                    self._value = kept
                    return
                self._value = step_flops(self.config, self.mesh, shapes, self.steps)
                if key is not None and self._value is not None:
                    self.memo.put(key, self._value)
            except Exception as err:  # never stops the run: the line shows no TFLOP/s
                self.error = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"

        self._thread = threading.Thread(target=count, name="model-flops", daemon=True)
        self._thread.start()

    def result(self) -> tuple[float | None, float]:
        """``(global model FLOPs per step or None (off, or not countable), seconds waited)``:
        the first call waits for the count to finish."""
        start = time.perf_counter()
        if self._thread is not None:
            self._thread.join()
        return self._value, time.perf_counter() - start
