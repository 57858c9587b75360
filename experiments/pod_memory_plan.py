"""The pod template's plan on a TPU v4-256 (128 chips): per-chip GiB under replicated / FSDP /
+ bf16 / + remat, the speed at 40% MFU; the template on a v4-512 (256 chips), and the search on
a v4-32 (16 chips).

    python experiments/pod_memory_plan.py                  # v4-256 (128 chips), 32k batch
    python experiments/pod_memory_plan.py --quick          # the tiny variant on a v4-16 (8)

Runs ``python -m contrastive_jax.plan --slice=...`` (one process per setting: the fake device
count is fixed when JAX starts) on ``configs/clip_vit_b16_pod.py`` with each setting's overrides,
timing each command (the plan of the template on 128 chips should finish within 120 s on 2
quiet cores), then the template on a v4-32, where it does not fit and the plan searches the
smallest ``accumulation_steps`` that does. Writes ``experiments/results/pod_memory_plan.{md,csv}``:
parameters, optimiser state, batch, compiled temporaries and total per chip, whether it fits,
FLOPs per chip, step time, the plan's seconds. The temporaries are XLA:CPU's (docs/sharding.md,
"Before launch: the memory and speed plan").
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common.reporting import RESULTS, ROOT, command, markdown_table, parser, report
from contrastive_jax.plan.search import paste

# (name, --config overrides), each adding to the one before, then the template as shipped
SETTINGS = [
    ("replicated, float32", ["--config.sharding.params=replicated", "--config.model.dtype=float32",
                             "--config.model.remat=False", "--config.accumulation_steps=1"]),
    ("fsdp, float32", ["--config.sharding.params=fsdp", "--config.model.dtype=float32",
                       "--config.model.remat=False", "--config.accumulation_steps=1"]),
    ("fsdp + bf16", ["--config.sharding.params=fsdp", "--config.model.dtype=bfloat16",
                     "--config.model.remat=False", "--config.accumulation_steps=1"]),
    ("fsdp + bf16 + remat", ["--config.sharding.params=fsdp", "--config.model.dtype=bfloat16",
                             "--config.model.remat=True", "--config.accumulation_steps=1"]),
    ("the template (as shipped)", []),
]
GIB = 2**30


def plan_one(spec: str, target: str, overrides: list[str]) -> tuple[dict, float]:
    """One plan, in its own process: its JSON and the command's wall-clock seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan.json"
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "contrastive_jax.plan", f"--slice={target}",
                        "--compiler=cpu",  # XLA:CPU's (the TPU's: benchmarks/plan_compilers.py)
                        f"--config={ROOT / 'configs' / spec}", f"--json={out}", *overrides],
                       check=True, cwd=ROOT)
        return json.loads(out.read_text()), time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    args = parser(__doc__, "pod_memory_plan", quick="the tiny variant on a v4-16").parse_args(
        argv)
    spec, target, small = (("clip_vit_b16_pod.py:tiny", "v4-16", None) if args.quick
                           else ("clip_vit_b16_pod.py", "v4-256", "v4-32"))
    rows = []
    for name, overrides in SETTINGS:
        p, seconds = plan_one(spec, target, [*overrides, "--nosearch"])
        rows.append(row(name, target, p, seconds))
    if small is not None:  # the template on 256 chips, and on 16 where it must search
        p, seconds = plan_one(spec, "v4-512", [])
        rows.append(row("the template on a v4-512", "v4-512", p, seconds))
        p, seconds = plan_one(spec, small, [])
        rows.append(row("the template on a v4-32 (search)", small, p, seconds))
    chips = rows[0]["chips"]
    table = markdown_table(
        ["setting", "slice (chips)", "K", "params GiB", "optimiser GiB", "batch GiB",
         "temporaries GiB", "total GiB", "fits (<= 90%)", "TFLOP per chip", "step s at 40%",
         "plan s"],
        [[r["setting"], f"{r['slice']} ({r['chips']})", r["accumulation_steps"],
          f"{r['params']:.3f}", f"{r['opt_state']:.3f}", f"{r['batch']:.3f}",
          f"{r['temporaries']:.2f}", f"{r['total']:.2f}", r["fits"],
          f"{r['tflop_per_chip']:.1f}", f"{r['step_s']:.3f}", f"{r['plan_s']:.0f}"]
         for r in rows])
    out = Path(args.out) if args.out else RESULTS / "pod_memory_plan"
    report(out, rows, title=f"Plan: {spec} on a TPU {target} ({chips} chips)",
           produced=(f"{command('experiments/pod_memory_plan.py', argv)}: "
                     f"`python -m contrastive_jax.plan --slice={target}` per setting (one "
                     f"process each; plan s = the command's wall clock, compile included), "
                     f"global batch {rows[0]['global_batch']}, per chip; temporaries from "
                     "XLA:CPU's compile of the partitioned step (an estimate of the "
                     "accelerator's). K = micro-batches (exact accumulation); for a config "
                     "that does not fit, the K the plan's search found and the total at that "
                     "K. TFLOP per chip: model FLOPs, XLA's count of the step without remat, "
                     "accumulation or scanned layers; "
                     "step s: at 40% of the chip's peak bf16 FLOP/s."),
           tables=[table], figure=None)


def row(name: str, target: str, p: dict, seconds: float) -> dict:
    """A table row from a plan's JSON; a plan that searched reports the answer's total."""
    answer = (p.get("search") or {}).get("answer")
    total, k, temporaries = p["total"], p["accumulation_steps"], p["temporaries"]
    fits = "yes" if p["fits_target"] else "no"
    if answer is not None:
        found = next(t for t in p["search"]["tried"] if t["overrides"] == answer)
        total, k, temporaries = found["total"], answer["accumulation_steps"], found["temporaries"]
        fits = (f"with {paste(answer)} (at K = 1: {p['total'] / GIB:.1f} GiB; "
                f"{len(p['search']['tried'])} candidates compiled)")
    speed = p["speed"] or {}
    return {"setting": name, "slice": target, "chips": p["devices"],
            "global_batch": p["global_batch"], "accumulation_steps": k,
            **{key: p[key] / GIB for key in ("params", "opt_state", "batch")},
            "temporaries": temporaries / GIB, "total": total / GIB, "fits": fits,
            "usable_gib": p["usable_bytes"] / GIB,
            "tflop_per_chip": (speed.get("flops_per_chip") or 0) / 1e12,
            "step_s": speed.get("step_s") or float("nan"),
            "compile_s": round(p["compile_s"], 1), "plan_s": round(seconds, 1)}


if __name__ == "__main__":
    main()
