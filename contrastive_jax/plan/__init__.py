"""The memory and speed plan before launch (``python -m contrastive_jax.plan``).

:mod:`~contrastive_jax.plan.step_plan` compiles a run's train step with abstract inputs and
measures its bytes per device, by XLA:CPU on fake CPU devices or by the TPU compiler on this CPU
for a slice's devices (:mod:`~contrastive_jax.plan.tpu_compiler`);
:mod:`~contrastive_jax.plan.search` finds the smallest ``accumulation_steps`` (then FSDP, then
remat) that fits; :mod:`~contrastive_jax.plan.choice` ranks the settings that fit by the FLOPs
executed (``--choose``); :mod:`~contrastive_jax.plan.report` writes the tables;
:mod:`~contrastive_jax.plan.command` is the command line (its help says what it prints and how
far to trust each compiler).
"""

from contrastive_jax.plan.choice import Choice, choose
from contrastive_jax.plan.report import (
    RematCheck,
    Speed,
    memory_lines,
    per_chip_flops,
    remat_check,
    report,
    target_report,
    uses_remat,
)
from contrastive_jax.plan.search import Search, divisors, find_fit, paste, with_overrides
from contrastive_jax.plan.step_plan import (
    CHIPS,
    DEFAULT_MFU,
    HEADROOM,
    IMAGES_PER_CORE_SECOND,
    Plan,
    compiling,
    example_shapes,
    plan,
    planned,
)

__all__ = ["CHIPS", "DEFAULT_MFU", "HEADROOM", "IMAGES_PER_CORE_SECOND", "Choice", "Plan",
           "RematCheck", "Search", "Speed", "choose", "compiling", "divisors", "example_shapes",
           "find_fit",
           "memory_lines", "paste", "per_chip_flops", "plan", "planned", "remat_check",
           "report", "target_report", "uses_remat", "with_overrides"]
