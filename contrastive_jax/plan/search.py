"""The plan's search for a config that fits: the smallest ``accumulation_steps``, then FSDP, then
remat, each candidate compiled (:func:`find_fit`); used by :mod:`contrastive_jax.plan.command`.

A plan here is anything with ``total``, ``temporaries`` (bytes per device),
``accumulation_steps``, ``global_batch`` and ``devices``, as
:class:`contrastive_jax.plan.step_plan.Plan`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import ml_collections

Plan = Any  # contrastive_jax.plan.step_plan.Plan (duck-typed: tests pass a model of it)


@dataclasses.dataclass
class Search:
    """What the plan tried when the config did not fit: ``(overrides, plan)`` per compile, in
    order, and the overrides of the smallest candidate that fits (``None``: none fits)."""

    tried: list[tuple[dict[str, object], Plan]]
    answer: dict[str, object] | None


def with_overrides(config, overrides: Mapping[str, object]):
    """A copy of ``config`` with dotted ``overrides`` (``{"model.remat": True}``) set."""
    if isinstance(config, ml_collections.FrozenConfigDict):  # a RunSpec's: thawed
        config = config.as_configdict()
    copy = config.copy_and_resolve_references()
    # unlocked: model.remat may be new to a config that never set it; ignore_type: it may
    # hold a policy name or one entry per tower, which the search's True replaces
    with copy.unlocked(), copy.ignore_type():
        for key, value in overrides.items():
            *parents, leaf = key.split(".")
            node = copy
            for parent in parents:
                node = node[parent]
            node[leaf] = value
    return copy


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]


def smallest_accumulation(config, per_device: int, budget: float,
                          plan_at: Callable[[Any, int], Any]) -> tuple[int | None, Any]:
    """The smallest divisor ``k`` of ``per_device`` at or above the config's own
    ``accumulation_steps`` whose step needs at most ``budget`` bytes per chip
    (``plan_at(config, k)``: one compile, a plan with ``total`` and ``temporaries``), and its
    plan; ``(None, the last plan)`` when even one example per micro-batch does not fit.

    The first plan predicts the divisor (temporaries proportional to the micro-batch), then
    the walk to the smallest that fits (down while the one below fits, up while it does not):
    usually two compiles after the first. :func:`find_fit` and the plan's ``--choose``
    (:func:`contrastive_jax.plan.choice.choose`) search so."""
    k0 = int(config.get("accumulation_steps") or 1)
    candidates = [k for k in divisors(per_device) if k >= k0]
    plans: dict[int, Any] = {}

    def fits(i: int) -> bool:
        k = candidates[i]
        if k not in plans:
            plans[k] = plan_at(config, k)
        return plans[k].total <= budget

    if fits(0):
        return candidates[0], plans[candidates[0]]
    first = plans[candidates[0]]
    fixed = first.total - first.temporaries
    i = next((i for i, k in enumerate(candidates)
              if i > 0 and fixed + first.temporaries * k0 / k <= budget), len(candidates) - 1)
    if fits(i):
        while i > 1 and fits(i - 1):
            i -= 1
        return candidates[i], plans[candidates[i]]
    while i + 1 < len(candidates):
        i += 1
        if fits(i):
            return candidates[i], plans[candidates[i]]
    return None, plans[candidates[-1]]


def find_fit(config, mesh, budget: int, planned: Plan,
             compile_plan: Callable[..., Plan]) -> Search:
    """The smallest ``accumulation_steps`` (then with FSDP, then with remat as well, for what
    the config does not already have) whose plan needs at most ``budget`` bytes per device;
    ``planned``: the config's own plan, which does not fit.

    Candidates are the divisors of the per-device batch above the config's own; memory falls
    as the micro-batch shrinks. The first candidate compiled is the one ``planned`` predicts
    (its temporaries taken as proportional to the micro-batch), then the search walks to the
    smallest divisor that fits (:func:`smallest_accumulation`): usually two compiles. With
    FSDP or remat added there is no plan to predict from, and the search bisects.
    ``compile_plan(config, mesh)`` compiles one candidate's plan
    (:func:`contrastive_jax.plan.step_plan.plan`; tests pass a model).
    """
    per_device = planned.global_batch // planned.devices
    tried: list[tuple[dict[str, object], Plan]] = []
    plans: dict[tuple, Plan] = {}

    def plan_of(extra: dict[str, object], k: int) -> Plan:
        key = (tuple(extra.items()), k)
        if key not in plans:
            overrides = {**extra, "accumulation_steps": k}
            plans[key] = compile_plan(with_overrides(config, overrides), mesh)
            tried.append((overrides, plans[key]))
        return plans[key]

    k0 = planned.accumulation_steps
    plans[((), k0)] = planned  # not compiled again
    k, _ = smallest_accumulation(config, per_device, budget, lambda _, k: plan_of({}, k))
    if k is not None:
        return Search(tried, {"accumulation_steps": k})
    ladders: list[dict[str, object]] = []
    if (config.get("sharding") or {}).get("params", "replicated") != "fsdp":
        ladders.append({"sharding.params": "fsdp"})
    if not config.model.get("remat"):
        ladders.append({**(ladders[-1] if ladders else {}), "model.remat": True})
    for extra in ladders:  # no plan to predict from: bisect
        candidates = [d for d in divisors(per_device) if d >= k0]
        lo, hi, best = 0, len(candidates) - 1, None
        while lo <= hi:
            mid = (lo + hi) // 2
            if plan_of(extra, candidates[mid]).total <= budget:
                best, hi = mid, mid - 1
            else:
                lo = mid + 1
        if best is not None:
            return Search(tried, {**extra, "accumulation_steps": candidates[best]})
    return Search(tried, None)


def paste(overrides: Mapping[str, object]) -> str:
    """``--config.KEY=VALUE`` flags for ``overrides``."""
    return " ".join(f"--config.{k}={v}" for k, v in overrides.items())
