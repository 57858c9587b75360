"""The pod template's memory plan: per-device GiB under replicated / FSDP / + bf16 / + remat.

    python experiments/pod_memory_plan.py                  # 256 devices, 32k batch
    python experiments/pod_memory_plan.py --quick          # the tiny variant on 8 devices

Runs ``python -m contrastive_jax.plan`` (one process per setting: the fake device count is
fixed when JAX starts) on ``configs/clip_vit_b16_pod.py`` with each setting's overrides, and
writes ``experiments/results/pod_memory_plan.{md,csv}``: parameters, optimiser state, batch,
compiled temporaries and total per device, and which chips each fits. The temporaries are
XLA:CPU's (docs/sharding.md, "Before launch: the memory plan").
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from common.reporting import RESULTS, ROOT, command, markdown_table, parser, report

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


def plan_one(spec: str, devices: int, overrides: list[str]) -> dict:
    """One plan, in its own process; its JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan.json"
        subprocess.run([sys.executable, "-m", "contrastive_jax.plan", f"--devices={devices}",
                        f"--config={ROOT / 'configs' / spec}", f"--json={out}", *overrides],
                       check=True, cwd=ROOT)
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> None:
    args = parser(__doc__, "pod_memory_plan", quick="the tiny variant on 8 devices").parse_args(
        argv)
    spec, devices = (("clip_vit_b16_pod.py:tiny", 8) if args.quick
                     else ("clip_vit_b16_pod.py", 256))
    rows = []
    for name, overrides in SETTINGS:
        p = plan_one(spec, devices, overrides)
        rows.append({"setting": name, "devices": p["devices"], "global_batch": p["global_batch"],
                     "accumulation_steps": p["accumulation_steps"],
                     **{k: p[k] / GIB for k in ("params", "opt_state", "batch", "temporaries",
                                                "total")},
                     "compile_s": round(p["compile_s"], 1),
                     "fits": ", ".join(c for c, ok in p["fits"].items() if ok) or "none"})
    table = markdown_table(
        ["setting", "K", "params GiB", "optimiser GiB", "batch GiB", "temporaries GiB",
         "total GiB", "fits (<= 90% of memory)"],
        [[r["setting"], r["accumulation_steps"], f"{r['params']:.3f}", f"{r['opt_state']:.3f}",
          f"{r['batch']:.3f}", f"{r['temporaries']:.2f}", f"{r['total']:.2f}", r["fits"]]
         for r in rows])
    out = Path(args.out) if args.out else RESULTS / "pod_memory_plan"
    report(out, rows, title=f"Memory plan: {spec} on {devices} devices",
           produced=(f"{command('experiments/pod_memory_plan.py', argv)}: "
                     f"`python -m contrastive_jax.plan --devices={devices}` per setting, global "
                     f"batch {rows[0]['global_batch']}, per device; temporaries from XLA:CPU's "
                     "compile of the partitioned step (an estimate of the accelerator's). "
                     "K = micro-batches (exact accumulation)."),
           tables=[table], figure=None)


if __name__ == "__main__":
    main()
