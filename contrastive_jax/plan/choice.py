"""The plan's choice of settings for a target (``--choose``): every combination of remat, scanned
towers, FSDP and (as the user allows) patch dropout, each with the smallest accumulation that
fits, ranked by the FLOPs the chips execute.

A setting's cost is its executed FLOPs per chip per step: the model's, plus remat's
recomputation (a full remat recomputes each block's forward pass, a policy that saves the
matmuls recomputes less), less what patch dropout skips in the image tower; counted by XLA on
the unrolled step (:func:`contrastive_jax.plan.report.per_chip_flops` with ``keep_remat``).
Scanning a tower and FSDP change memory and communication, not FLOPs; accumulation neither
(the micro-batches sum to the batch). So the candidates are taken in order of FLOPs, and
within equal FLOPs by: the fewest micro-batches (larger matmuls use the chip better), replicated
parameters before FSDP (no gathers per step), scanned towers before unrolled ones (a compile
that does not grow with depth). Groups of more FLOPs than the best that fits are not compiled.
Each candidate's memory is the compiler's the plan was asked for (on a TPU slice: the TPU
compiler's, which for example finds unrolled towers smaller than scanned ones).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

from contrastive_jax.plan.search import paste, smallest_accumulation, with_overrides

# model.remat values tried, in the order of what they recompute (least first)
REMAT_CHOICES: tuple[object, ...] = (False, "dots_with_no_batch_dims_saveable", True)


@dataclasses.dataclass
class Candidate:
    """One combination of settings: its overrides (without accumulation), the smallest
    ``accumulation_steps`` that fits (``None``: none does), the plan there, and its
    executed FLOPs per chip per step."""

    settings: dict[str, object]
    flops: float | None
    accumulation: int | None = None
    total: int | None = None  # bytes per chip at that accumulation (or the last tried)
    compiled: bool = False

    @property
    def overrides(self) -> dict[str, object]:
        return {**self.settings, "accumulation_steps": self.accumulation}

    def key(self) -> tuple:
        """The ranking: FLOPs, micro-batches, FSDP, unrolled towers."""
        return (self.flops if self.flops is not None else float("inf"),
                self.accumulation or 0,
                self.settings.get("sharding.params") == "fsdp",
                any(k.endswith(".scan") and v is False for k, v in self.settings.items()))


@dataclasses.dataclass
class Choice:
    """The candidates, ranked (fitting ones first), and the best."""

    candidates: list[Candidate]

    @property
    def best(self) -> Candidate | None:
        fitting = [c for c in self.candidates if c.accumulation is not None]
        return fitting[0] if fitting else None

    def record(self) -> dict[str, Any]:
        """The JSON record's ``choice``."""
        best = self.best
        return {"best": None if best is None else best.overrides,
                "candidates": [dataclasses.asdict(c) for c in self.candidates]}


def settings_grid(config, allow_patch_dropout: float | None,
                  devices: int | None = None) -> list[dict[str, object]]:
    """Every combination of the settings ``config`` has: remat (:data:`REMAT_CHOICES`),
    ``scan`` on and off for the towers that take it, replicated or FSDP parameters (not on one
    device: the same program), and the image tower's patch dropout at its own value or
    ``allow_patch_dropout``."""
    model = config.model
    towers = [name for name in ("sample_encoder", "text_encoder", "encoder")
              if name in model and "scan" in model[name]]
    axes: list[list[dict[str, object]]] = [[{"model.remat": r} for r in REMAT_CHOICES]]
    if towers:
        axes.append([{f"model.{t}.scan": on for t in towers} for on in (True, False)])
    if devices is None or devices > 1:
        axes.append([{"sharding.params": m} for m in ("replicated", "fsdp")])
    image = model.get("sample_encoder") or model.get("encoder") or {}
    if allow_patch_dropout is not None and "patch_dropout" in image:
        tower = "sample_encoder" if "sample_encoder" in model else "encoder"
        values = sorted({float(image.patch_dropout), float(allow_patch_dropout)})
        axes.append([{f"model.{tower}.patch_dropout": v} for v in values])
    return [dict(itertools.chain.from_iterable(d.items() for d in combo))
            for combo in itertools.product(*axes)]


def settings_key(config) -> tuple:
    """What a candidate's memory depends on among the settings :func:`choose` varies: two
    configs with the same key compile to the same step."""
    model = config.model
    towers = tuple((name, model[name].get("scan"), model[name].get("patch_dropout"))
                   for name in ("sample_encoder", "text_encoder", "encoder") if name in model)
    return (str(model.get("remat", False)), towers,
            (config.get("sharding") or {}).get("params", "replicated"),
            int(config.get("accumulation_steps") or 1))


def choose(config, per_device: int, budget: float, flops_of: Callable[[Any], float | None],
           plan_of: Callable[[Any], Any], allow_patch_dropout: float | None = None,
           known: Any = None, devices: int | None = None) -> Choice:
    """Rank :func:`settings_grid`'s candidates (module docstring): ``flops_of(config)`` the
    executed FLOPs per chip (one count per remat and patch dropout value), ``plan_of(config)``
    the plan of its step (a compile: ``total`` and ``temporaries`` in bytes per chip);
    ``known``: the plan of ``config`` itself, not compiled again; ``devices``: the mesh's
    (one: no FSDP candidates). Groups of more FLOPs than
    the best that fits are left uncompiled."""
    grid = settings_grid(config, allow_patch_dropout, devices)
    counted: dict[tuple, float | None] = {}
    given = settings_key(config)

    def flops(settings: dict[str, object]) -> float | None:
        key = tuple(sorted((k, str(v)) for k, v in settings.items()
                           if k == "model.remat" or k.endswith("patch_dropout")))
        if key not in counted:
            counted[key] = flops_of(with_overrides(config, settings))
        return counted[key]

    def plan_at(chosen, k: int):
        candidate = with_overrides(chosen, {"accumulation_steps": k})
        if known is not None and settings_key(candidate) == given:
            return known
        return plan_of(candidate)

    candidates = [Candidate(s, flops(s)) for s in grid]
    candidates.sort(key=Candidate.key)
    best_flops = None
    for candidate in candidates:
        if best_flops is not None and (candidate.flops or 0) > best_flops:
            break
        k, found = smallest_accumulation(with_overrides(config, candidate.settings),
                                         per_device, budget, plan_at)
        candidate.accumulation, candidate.total, candidate.compiled = k, found.total, True
        if k is not None and best_flops is None:
            best_flops = candidate.flops or 0
    candidates.sort(key=lambda c: (c.accumulation is None, not c.compiled, c.key()))
    return Choice(candidates)


def choice_lines(choice: Choice) -> list[str]:
    """The ranked candidates as a table, and the best as ``--config`` overrides."""
    names = {id(c): paste(c.settings).replace("--config.", "") for c in choice.candidates}
    width = max([8, *map(len, names.values())])
    lines = ["", "choice (--choose): the settings that fit, by the FLOPs the chips execute:",
             f"  {'settings':{width}s} {'accum.':>6s} {'memory':>10s} {'TFLOP/chip':>11s}"]
    for c in choice.candidates:
        memory = "-" if c.total is None else f"{c.total / 2**30:.2f} GiB"
        flops = "-" if c.flops is None else f"{c.flops / 1e12:.3f}"
        accumulation = ("none fits" if c.compiled and c.accumulation is None else
                        "-" if not c.compiled else str(c.accumulation))
        lines.append(f"  {names[id(c)]:{width}s} {accumulation:>6s} {memory:>10s} {flops:>11s}")
    best = choice.best
    lines.append("")
    if best is None:
        lines.append("  no setting fits: use a larger slice or a smaller data.batch_size")
    else:
        lines += ["best (add to the command):", f"  {paste(best.overrides)}"]
    uncompiled = sum(not c.compiled for c in choice.candidates)
    if uncompiled:
        lines.append(f"  ({uncompiled} candidates not compiled: they execute more FLOPs than "
                     "the best that fits)")
    return lines
