"""The pod template's plan on both compilers: XLA:CPU on fake CPU devices against the TPU
compiler (libtpu, on this CPU) for the slice's own chips, per TPU generation.

    python benchmarks/plan_compilers.py                     # 3 variants x 4 slices, ~1 h
    python benchmarks/plan_compilers.py --variants tiny --slices v4-16 v5e-8   # a minute
    python benchmarks/plan_compilers.py --jobs 2            # two compiles at a time
    python benchmarks/plan_compilers.py --choose --variants template --slices v5e-256 \
        --out experiments/results/plan_choose                # the settings --choose picks
    python benchmarks/plan_compilers.py --variants template --slices v4-256 \
        --set model.dtype=float32 --out experiments/results/plan_compilers_float32

For each variant of ``configs/clip_vit_b16_pod.py`` (default: the template as shipped,
``patch_dropout=0.5`` and ``res=112``) and each slice (default ``v4-256``, ``v5e-256``,
``v5p-256``, ``v6e-256``) it plans the train step as ``python -m contrastive_jax.plan
--compiler=both`` does (:func:`contrastive_jax.plan.step_plan.plan` on a mesh of fake CPU devices
and on one of the slice's TPU devices, :func:`contrastive_jax.plan.tpu_compiler.topology_devices`),
and counts the model FLOPs per example once per variant
(:func:`contrastive_jax.plan.report.per_chip_flops`: the unrolled step without remat, as the
plan's speed section). One subprocess per variant and chip count: the fake CPU device count is
fixed when JAX starts, so the slices of one chip count share XLA:CPU's compile (v4-256 and
v5p-256 are both 128 chips). No remat check and no search: each row is the config as given.

``--choose`` runs ``python -m contrastive_jax.plan --compiler=tpu --choose`` per variant and slice
instead and tabulates the config as given against the best setting it found.

Writes ``experiments/results/plan_compilers.{md,json}``: per chip, each compiler's total and
its parts (arguments as the compiler counts them against the state and batch from the
shardings, temporaries, generated code, the TPU compiler's peak), the ratio of the two totals,
whether the TPU compiler's total fits 90% of the memory it says a chip has, FLOPs per example
and the compile seconds. docs/benchmarks.md ("The plan on the TPU compiler") reads it.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import pathlib
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
VARIANTS = ("", "patch_dropout=0.5", "res=112")
SLICES = ("v4-256", "v5e-256", "v5p-256", "v6e-256")
GIB = 2**30


def pod_template(variant: str, overrides: dict[str, object]):
    """``configs/clip_vit_b16_pod.py:<variant>`` as ``--config`` loads it, with ``overrides``
    (``{"model.dtype": "float32"}``) set as ``--config.KEY=VALUE`` would."""
    from compile_bench import pod_template as template

    from contrastive_jax.plan.search import with_overrides

    return with_overrides(template(variant or None), overrides)


def plan_fields(p) -> dict:
    """The numbers of one :class:`~contrastive_jax.plan.step_plan.Plan` the table shows."""
    return {"total": p.total, "arguments": p.arguments, "temporaries": p.temporaries,
            "outputs_not_aliased": p.outputs_not_aliased, "generated_code": p.generated_code,
            "peak": p.peak, "usable": p.usable, "refused": p.refused, "compile_s": p.compile_s,
            "state_and_batch": p.params + p.opt_state + p.other_state + p.batch,
            "laid_out": p.laid_out,
            "tpu_flops": None if p.cost is None else p.cost.flops}


def one(variant: str, chips: int, slices: list[str], flops: bool,
        overrides: dict[str, object]) -> dict:
    """In a subprocess with ``chips`` CPU devices: XLA:CPU's plan, each slice's TPU plan, and
    (``flops``) the model FLOPs per example."""
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    jax.config.update("jax_num_cpu_devices", chips)
    from contrastive_jax.accelerators import tpu_slice
    from contrastive_jax.mesh import make_mesh
    from contrastive_jax.plan import plan, planned, tpu_compiler
    from contrastive_jax.plan.report import per_chip_flops

    config = pod_template(variant, overrides)
    axes = dict(config.get("mesh", {"data": -1}))
    cpu_mesh = make_mesh(axes)
    record: dict = {"variant": variant, "chips": chips, "global_batch": config.data.batch_size,
                    "cpu": plan_fields(plan(planned(config, cpu_mesh), status=sys.stderr))}
    if flops:
        start = time.perf_counter()
        record["flops_per_example"] = (per_chip_flops(config, cpu_mesh) * chips
                                       / config.data.batch_size)
        record["flops_s"] = time.perf_counter() - start
    record["tpu"] = {}
    for name in slices:
        target = tpu_slice(name)
        mesh = make_mesh(axes, devices=tpu_compiler.topology_devices(target))
        record["tpu"][name] = plan_fields(plan(planned(config, mesh), status=sys.stderr))
    return record


def run_one(variant: str, chips: int, slices: list[str], flops: bool,
            overrides: dict[str, object]) -> dict:
    """:func:`one` in a fresh interpreter; its JSON record."""
    args = [sys.executable, __file__, "--one",
            json.dumps([variant, chips, slices, flops, overrides])]
    result = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    if result.returncode != 0:
        raise RuntimeError(f"{variant or 'template'} on {chips} chips failed:\n"
                           f"{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def literal(value: str) -> object:
    """A ``--set`` value as ``--config.KEY=VALUE`` reads it: a Python literal, else text."""
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value


def gib(n: float | None) -> str:
    return "-" if n is None else f"{n / GIB:.2f}"


def rows_of(records: list[dict], slices: list[str]) -> list[dict]:
    """One row per variant and slice."""
    from contrastive_jax.accelerators import tpu_slice

    flops = {r["variant"]: r["flops_per_example"] for r in records if "flops_per_example" in r}
    rows = []
    for r in records:
        for name, tpu in r["tpu"].items():
            cpu = r["cpu"]
            fits = tpu["refused"] is None and tpu["total"] <= 0.9 * tpu["usable"]
            rows.append({"variant": r["variant"] or "template", "slice": name,
                         "chips": tpu_slice(name).chips, "cpu": cpu, "tpu": tpu,
                         "ratio": cpu["total"] / tpu["total"], "fits": fits,
                         "flops_per_example": flops.get(r["variant"]),
                         "order": (VARIANTS.index(r["variant"]) if r["variant"] in VARIANTS
                                   else 0, slices.index(name))})
    return sorted(rows, key=lambda row: row["order"])


def table(rows: list[dict]) -> str:
    header = ["variant", "slice (chips)", "XLA:CPU total", "TPU total", "CPU / TPU",
              "arguments CPU / TPU (state + batch)", "temporaries CPU / TPU", "TPU code",
              "TPU peak", "fits (TPU, <= 90% of usable)", "GFLOP per example",
              "compile s CPU / TPU"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for row in rows:
        cpu, tpu = row["cpu"], row["tpu"]
        refused = f" (refused: {tpu['refused']})" if tpu["refused"] else ""
        lines.append("| " + " | ".join([
            row["variant"], f"{row['slice']} ({row['chips']})", gib(cpu["total"]),
            gib(tpu["total"]) + refused, f"{row['ratio']:.2f}",
            f"{gib(cpu['arguments'])} / {gib(tpu['arguments'])} ({gib(cpu['state_and_batch'])})",
            f"{gib(cpu['temporaries'])} / {gib(tpu['temporaries'])}",
            gib(tpu["generated_code"]), gib(tpu["peak"]),
            f"{'yes' if row['fits'] else 'no'} ({gib(tpu['usable'])})",
            "-" if row["flops_per_example"] is None else f"{row['flops_per_example'] / 1e9:.1f}",
            f"{cpu['compile_s']:.0f} / {tpu['compile_s']:.0f}"]) + " |")
    return "\n".join(lines)


def choose_one(variant: str, name: str, overrides: dict[str, object]) -> dict:
    """``python -m contrastive_jax.plan --choose`` for one variant and slice (the TPU compiler):
    its JSON record."""
    import tempfile

    spec = f"{ROOT / 'configs' / 'clip_vit_b16_pod.py'}" + (f":{variant}" if variant else "")
    with tempfile.TemporaryDirectory() as folder:
        out = pathlib.Path(folder) / "plan.json"
        start = time.perf_counter()
        result = subprocess.run(
            [sys.executable, "-m", "contrastive_jax.plan", f"--config={spec}", f"--slice={name}",
             "--compiler=tpu", "--choose", f"--json={out}",
             *(f"--config.{k}={v}" for k, v in overrides.items())],
            capture_output=True, text=True, cwd=ROOT)
        if result.returncode != 0:
            raise RuntimeError(f"--choose for {variant or 'template'} on {name} failed:\n"
                               f"{result.stderr[-3000:]}")
        record = json.loads(out.read_text())
    record["variant"], record["slice"] = variant, name
    record["command_s"] = time.perf_counter() - start
    return record


def choice_table(records: list[dict]) -> str:
    """The config as given against the best setting ``--choose`` found, per variant and slice."""
    from contrastive_jax.plan.search import paste

    header = ["variant", "slice", "as given: GiB, TFLOP per chip per step", "best: settings",
              "best: GiB, TFLOP per chip per step", "compiled (of candidates)", "command s"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for r in records:
        candidates = r["choice"]["candidates"]
        best = next(c for c in candidates if c["accumulation"] is not None)
        given = r["remat"]["flops_with_remat_per_chip"] if r["remat"] else r["speed"][
            "flops_per_chip"]
        lines.append("| " + " | ".join([
            r["variant"] or "template", r["slice"], f"{gib(r['total'])}, {given / 1e12:.2f}",
            "`" + paste({**best["settings"], "accumulation_steps": best["accumulation"]})
            .replace("--config.", "") + "`",
            f"{gib(best['total'])}, {best['flops'] / 1e12:.2f}",
            f"{sum(c['compiled'] for c in candidates)} of {len(candidates)}",
            f"{r['command_s']:.0f}"]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    arguments = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    arguments.add_argument("--variants", nargs="*", default=list(VARIANTS),
                           help="variants of the pod template ('' or template: as shipped)")
    arguments.add_argument("--slices", nargs="*", default=list(SLICES))
    arguments.add_argument("--jobs", type=int, default=1, help="subprocesses at a time")
    arguments.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                           help="config overrides for every variant (model.dtype=float32)")
    arguments.add_argument("--out", default=str(RESULTS / "plan_compilers"),
                           help="output path without suffix (.md, .json)")
    arguments.add_argument("--choose", action="store_true",
                           help="run the plan's --choose per variant and slice instead")
    arguments.add_argument("--one", help=argparse.SUPPRESS)
    args = arguments.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # libtpu installed: no TPU to look for
    if args.one:
        print(json.dumps(one(*json.loads(args.one))))
        return 0
    from contrastive_jax.accelerators import tpu_slice
    from contrastive_jax.training.run.provenance import provenance

    variants = ["" if v == "template" else v for v in args.variants]
    by_chips: dict[int, list[str]] = {}
    for name in args.slices:
        by_chips.setdefault(tpu_slice(name).chips, []).append(name)
    overrides = {k: literal(v) for k, v in (item.split("=", 1) for item in args.set)}
    if args.choose:
        cases = [(v, name) for v in variants for name in args.slices]
        with ThreadPoolExecutor(args.jobs) as pool:
            chosen = list(pool.map(lambda case: choose_one(*case, overrides), cases))
        text = "\n".join([
            "# The settings the plan chooses (--choose, the TPU compiler)", "",
            f"Provenance: {json.dumps(provenance(), sort_keys=True)}", "",
            f"Produced by `python benchmarks/plan_compilers.py --choose --jobs {args.jobs}"
            f"{''.join(f' --set {item}' for item in args.set)}` (variants "
            f"{', '.join(v or 'template' for v in variants)}; slices {', '.join(args.slices)}).",
            "", choice_table(chosen), ""])
        out = pathlib.Path(args.out)
        out.with_suffix(".md").write_text(text)
        out.with_suffix(".json").write_text(json.dumps(chosen, indent=1) + "\n")
        print(text)
        return 0
    jobs = [(v, chips, names, i == 0, overrides) for v in variants
            for i, (chips, names) in enumerate(sorted(by_chips.items()))]
    with ThreadPoolExecutor(args.jobs) as pool:
        records = list(pool.map(lambda job: run_one(*job), jobs))
    rows = rows_of(records, args.slices)
    batches = ", ".join(sorted({f"{r['global_batch']:,}" for r in records}))
    text = "\n".join([
        "# The pod template's plan: XLA:CPU against the TPU compiler", "",
        f"Provenance: {json.dumps(provenance(), sort_keys=True)}", "",
        f"Produced by `python benchmarks/plan_compilers.py --jobs {args.jobs}"
        f"{''.join(f' --set {item}' for item in args.set)}` (variants "
        f"{', '.join(v or 'template' for v in variants)}; slices {', '.join(args.slices)}); "
        f"GiB per chip; global batch {batches}.", "", table(rows), ""])
    out = pathlib.Path(args.out)
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(json.dumps(records, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
