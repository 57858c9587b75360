"""The plan of the SimCLR and MoCo ImageNet templates on a TPU v4-32, a v5e-64 and 8 H100s:
memory per chip, model FLOPs per example, an epoch's time at a stated utilisation.

    python benchmarks/plan_ssl_templates.py                          # 3 x 3, ~30-40 min
    python benchmarks/plan_ssl_templates.py --templates moco_v2_resnet50_imagenet \
        --targets v5e-64                                              # one case, ~3-5 min
    python benchmarks/plan_ssl_templates.py --compiler both           # XLA:CPU beside the TPU's
    python benchmarks/plan_ssl_templates.py --templates moco_v3_vit_imagenet --targets v5e-64 \
        --set model.encoder.scan=False --out experiments/results/plan_ssl_templates_unrolled

For each template (``configs/simclr_resnet50_imagenet.py``: ResNet-50, batch 4096;
``configs/moco_v2_resnet50_imagenet.py``: ResNet-50, batch 256, queue 65,536;
``configs/moco_v3_vit_imagenet.py``: ViT-B/16, batch 4096; each as shipped, the papers'
settings) and each target (``v4-32``: 16 chips on 4 hosts; ``v5e-64``: 64 chips on 16 hosts;
``1x8:h100``: one node of 8 H100s) it runs ``python -m contrastive_jax.plan --json=...`` in a
fresh process, one case after the other: on a TPU slice the TPU compiler (libtpu, on this CPU,
for the slice's own devices; ``--compiler both``: XLA:CPU's figure beside), on the GPUs XLA:CPU
on 8 fake CPU devices (the plan has no CUDA compiler: docs/sharding.md), with JAX's default
GPU preallocation (75% of the memory; ``XLA_CLIENT_MEM_FRACTION`` is unset for the command).
When a case does not fit (more than 90% of the usable memory), the plan's search compiles
candidates (more micro-batches, then FSDP, then remat) and the table gives its answer.
``--set KEY=VALUE`` passes ``--config.KEY=VALUE`` to every case. A compile's host memory grows
with the program: MoCo v3's unrolled ViT-B/16 at 4 micro-batches of 64 per chip (v4-32) took
more than 23 GB.

Per case: the memory per chip (arguments, temporaries, total, usable), the model FLOPs per
example (the plan's count: XLA's count of the step without remat or accumulation, forward and
backward, both views and the key encoder, over the global batch), the step time at ``--mfu``
(the plan's default 40%), one ImageNet epoch (``ceil(1,281,167 / batch)`` steps) and the
template's whole run (its ``num_epochs``), and the host cores for input per host (the plan's
line: a decode and two random resized crops per example at the measured rate).

Writes ``experiments/results/plan_ssl_templates.{md,json}``; docs/benchmarks.md ("SimCLR and
MoCo templates on a pod") reads it. Nothing is cached in the repository.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
TEMPLATES = ("simclr_resnet50_imagenet", "moco_v2_resnet50_imagenet", "moco_v3_vit_imagenet")
TARGETS = ("v4-32", "v5e-64", "1x8:h100")
GIB = 2**30
# the memory-fraction variables the plan reads for a GPU target (accelerators.py)
UNSET = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")


def is_gpu(target: str) -> bool:
    """Whether ``target`` is a ``--gpus`` spec (``1x8:h100``) rather than a ``--slice``."""
    return "x" in target.split(":")[0]


def command(template: str, target: str, compiler: str, mfu: float, json_path: str,
            variant: str = "", overrides: tuple[str, ...] = ()) -> list[str]:
    """The plan's command line for one case (``variant``: ``tiny=True`` and the like;
    ``overrides``: ``KEY=VALUE`` items, passed as ``--config.KEY=VALUE``)."""
    spec = f"configs/{template}.py" + (f":{variant}" if variant else "")
    where = f"--gpus={target}" if is_gpu(target) else f"--slice={target}"
    return [sys.executable, "-m", "contrastive_jax.plan", f"--config={spec}", where,
            f"--compiler={'cpu' if is_gpu(target) else compiler}", f"--mfu={mfu}",
            f"--json={json_path}", *(f"--config.{item}" for item in overrides)]


def run_case(template: str, target: str, compiler: str, mfu: float, variant: str = "",
             overrides: tuple[str, ...] = ()) -> dict:
    """One plan in a fresh process: its JSON record, the command's seconds and printed report."""
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    env["JAX_PLATFORMS"] = "cpu"
    with tempfile.TemporaryDirectory() as folder:
        out = pathlib.Path(folder) / "plan.json"
        start = time.perf_counter()
        result = subprocess.run(command(template, target, compiler, mfu, str(out), variant,
                                        overrides),
                                capture_output=True, text=True, cwd=ROOT, env=env)
        seconds = time.perf_counter() - start
        if not out.exists():
            raise RuntimeError(f"the plan of {template} on {target} failed "
                               f"(exit {result.returncode}):\n{result.stderr[-3000:]}")
        record = json.loads(out.read_text())
    record.update(template=template, variant=variant, target_name=target, command_s=seconds,
                  exit_code=result.returncode, report=result.stdout)
    return record


def config_of(template: str, variant: str = ""):
    """The template's config (``configs/TEMPLATE.py:VARIANT``) as ``--config`` loads it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(template, ROOT / "configs" / f"{template}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(variant or None)


def summary(record: dict) -> dict:
    """The numbers of one case the table shows, from the plan's JSON record."""
    from contrastive_jax.training.data.imagenet import steps_for_epochs

    config = config_of(record["template"], record["variant"])
    batch, chips = record["global_batch"], record["target"]["chips"]
    search = record.get("search") or {}
    answer = search.get("answer")
    found = next((t for t in search.get("tried", []) if answer and t["overrides"] == answer),
                 None)
    speed = record.get("speed") or {}
    step_s = speed.get("step_s")
    epoch_steps = steps_for_epochs(1, batch)
    compilers = record.get("compilers", {})
    cpu = compilers.get("XLA:CPU") if record["compiler"] == "TPU" else None
    return {
        "template": record["template"], "target": record["target_name"],
        "kind": record["target"]["kind"], "chips": chips, "hosts": record["target"]["hosts"],
        "compiler": "TPU compiler" if record["compiler"] == "TPU" else "XLA:CPU",
        "global_batch": batch, "per_chip": batch // chips,
        "arguments": record["arguments"], "temporaries": record["temporaries"],
        "total": record["total"], "usable": record["usable_bytes"],
        "refused": record.get("refused"), "fits": record["fits_target"],
        "cpu_total": None if cpu is None else cpu["total"],
        "answer": answer, "answer_total": None if found is None else found["total"],
        "tried": len(search.get("tried", [])),
        "gflop_per_example": (speed["flops_per_chip"] * chips / batch / 1e9
                              if speed.get("flops_per_chip") else None),
        "mfu": speed.get("mfu"), "step_s": step_s,
        "epoch_steps": epoch_steps, "epoch_s": None if step_s is None else step_s * epoch_steps,
        "epochs": float(config.num_epochs),
        "run_h": (None if step_s is None
                  else step_s * steps_for_epochs(config.num_epochs, batch) / 3600),
        "host_cores": speed.get("host_cores"), "command_s": record["command_s"],
        "compile_s": record["compile_s"],
    }


def gib(n: float | None) -> str:
    return "-" if n is None else f"{n / GIB:.2f}"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def verdict(row: dict) -> str:
    """Fits as shipped, or the search's answer (``accumulation_steps=2 (9.1 GiB)``)."""
    if row["fits"]:
        return "yes"
    if row["answer"] is None:
        return "no; nothing the search tried fits"
    settings = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in row["answer"].items())
    return f"no; {settings} ({gib(row['answer_total'])} GiB)"


def table(rows: list[dict]) -> str:
    header = ["template", "target (chips, hosts)", "batch (per chip)", "compiler",
              "arguments / temporaries / total GiB per chip", "usable GiB",
              "fits (<= 90%) / the search's answer", "GFLOP per example",
              "step s", "epoch", "whole run (epochs)", "host cores per host", "command s"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for row in rows:
        total = gib(row["total"]) + (" (refused)" if row["refused"] else "")
        if row["cpu_total"] is not None:
            total += f"; XLA:CPU {gib(row['cpu_total'])}"
        lines.append("| " + " | ".join([
            row["template"], f"{row['target']} ({row['chips']}, {row['hosts']})",
            f"{row['global_batch']:,} ({row['per_chip']})", row["compiler"],
            f"{gib(row['arguments'])} / {gib(row['temporaries'])} / {total}",
            gib(row["usable"]), verdict(row),
            "-" if row["gflop_per_example"] is None else f"{row['gflop_per_example']:.1f}",
            "-" if row["step_s"] is None else f"{row['step_s']:.3f}",
            duration(row["epoch_s"]),
            "-" if row["run_h"] is None else f"{row['run_h']:.1f} h ({row['epochs']:.0f})",
            "-" if row["host_cores"] is None else str(math.ceil(row["host_cores"])),
            f"{row['command_s']:.0f}"]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    arguments = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    arguments.add_argument("--templates", nargs="*", default=list(TEMPLATES))
    arguments.add_argument("--targets", nargs="*", default=list(TARGETS),
                           help="TPU slices (v4-32) and GPU clusters (1x8:h100)")
    arguments.add_argument("--variant", default="", help="config variant (tiny=True) for all")
    arguments.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                           help="config overrides for every case (model.encoder.scan=False)")
    arguments.add_argument("--compiler", default="tpu", choices=("tpu", "both", "cpu", "auto"),
                           help="the plan's --compiler on a TPU slice")
    arguments.add_argument("--mfu", type=float, default=0.4,
                           help="model-FLOPs utilisation of the step time (the plan's default)")
    arguments.add_argument("--out", default=str(RESULTS / "plan_ssl_templates"),
                           help="output path without suffix (.md, .json)")
    args = arguments.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, str(ROOT))
    from contrastive_jax.training.run.provenance import provenance

    records, rows = [], []
    for target in args.targets:  # in sequence: one compile at a time on a small machine
        for template in args.templates:
            record = run_case(template, target, args.compiler, args.mfu, args.variant,
                              tuple(args.set))
            records.append(record)
            rows.append(summary(record))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    order = {t: i for i, t in enumerate(args.templates)}
    rows.sort(key=lambda r: (order[r["template"]], args.targets.index(r["target"])))
    flags = "".join(f" {k} {' '.join(v) if isinstance(v, list) else v}" for k, v in
                    (("--templates", args.templates), ("--targets", args.targets),
                     ("--compiler", args.compiler), ("--mfu", args.mfu))
                    if v != []) + (" --set " + " ".join(args.set) if args.set else "")
    text = "\n".join([
        "# The SimCLR and MoCo templates' plan on a TPU v4-32, a v5e-64 and 8 H100s", "",
        f"Provenance: {json.dumps(provenance(), sort_keys=True)}", "",
        f"Produced by `python benchmarks/plan_ssl_templates.py{flags}`"
        + (f" (variant {args.variant})" if args.variant else "")
        + f"; GiB per chip; step and epoch times at {args.mfu:.0%} model-FLOPs utilisation "
          "of the chip's dense bf16 peak; an epoch is ceil(1,281,167 / batch) steps; the "
          "GPUs' memory is XLA:CPU's on 8 fake devices against 75% of an H100's (JAX's "
          "preallocation).", "", table(rows), ""])
    out = pathlib.Path(args.out)
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(json.dumps(
        {"provenance": provenance(), "rows": rows,
         "records": [{k: v for k, v in r.items() if k != "report"} for r in records]},
        indent=1, default=str) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
