"""A tour of the loss library: every loss on a synthetic batch, then the gradient check.

    python -m contrastive_jax.demo [--batch 256] [--dim 8] [--rho 0.5] [--quick]
        [--skip-gradcheck]

Prints each loss (with each of its implementations), the InfoNCE bound on the
mutual information of the synthetic pairs, and the table of every analytic gradient formula
against ``jax.grad`` in float32 and float64 (written by ``experiments/gradcheck.py`` to
``experiments/results/gradcheck.md``). Nothing is downloaded. Compilation dominates: on 2 CPU
cores with another job running (measured 2026-12-01) it takes 2.5 minutes, ``--quick`` 70 s
(45 s once JAX's compilation cache holds its programs), ``--skip-gradcheck`` 11 s.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from absl import flags

from contrastive_jax import command_line
from contrastive_jax.analytic import gradcheck
from contrastive_jax.losses import clip_loss, info_nce, mi_lower_bound, moco_infonce, nt_xent
from contrastive_jax.training.run.compilation_cache import enable_compilation_cache


def correlated_pairs(key: jax.Array, n: int, d: int, rho: float) -> tuple[jax.Array, jax.Array]:
    """x ~ N(0, I_d), y = rho x + sqrt(1 - rho^2) eps: I(X;Y) = -(d/2) log(1 - rho^2) nats."""
    kx, ke = jax.random.split(key)
    x = jax.random.normal(kx, (n, d))
    return x, rho * x + math.sqrt(1 - rho**2) * jax.random.normal(ke, (n, d))


def show_losses(n: int, d: int, rho: float) -> None:
    """Print every loss and its mutual-information bound on correlated pairs of ``n`` rows."""
    x, y = correlated_pairs(jax.random.key(0), n, d, rho=rho)
    log_scale = jnp.log(1 / 0.07)  # CLIP's initial temperature
    print(f"Synthetic pairs: N = {n}, d = {d}, rho = {rho} "
          f"(true I(X;Y) = {-(d / 2) * math.log(1 - rho**2):.3f} nats)\n")
    rows = []
    for impl in ("tiled", "dense_vjp", "autodiff"):
        grad_fn = jax.jit(jax.value_and_grad(clip_loss, argnums=(0, 1, 2)),
                          static_argnames="impl")
        loss, (gx, _, gs) = grad_fn(x, y, log_scale, impl=impl)
        rows.append((f"clip_loss (impl={impl})", float(loss),
                     f"|grad x| = {float(jnp.linalg.norm(gx)):.6e}, "
                     f"dL/dlog_scale = {float(gs):+.6e}"))
        loss, (g1, _, gt) = jax.jit(jax.value_and_grad(nt_xent, argnums=(0, 1, 2)),
                                    static_argnames="impl")(x, y, 0.1, impl=impl)
        rows.append((f"nt_xent tau=0.1 (impl={impl})", float(loss),
                     f"|grad z1| = {float(jnp.linalg.norm(g1)):.6e}, dL/dtau = {float(gt):+.6e}"))
    one_way = clip_loss(x, y, log_scale, direction="x_to_y")
    rows.append(("clip_loss direction=x_to_y", float(one_way),
                 f"one-batch estimate of the bound log N - L = "
                 f"{float(mi_lower_bound(one_way, n)):.3f} nats "
                 f"(ceiling log N = {math.log(n):.3f})"))
    queue = jax.random.normal(jax.random.key(1), (4 * n, d))
    rows.append(("moco_infonce, queue 4N, tau=0.2", float(moco_infonce(x, y, queue, 0.2)),
                 "no gradient into keys or queue"))
    logits = 10.0 * jnp.eye(8)[:, :8] + jax.random.normal(jax.random.key(2), (8, 8))
    dup = jnp.eye(8, dtype=bool).at[0, 1].set(True).at[1, 0].set(True)
    rows.append(("info_nce, two duplicate captions", float(info_nce(logits, dup)),
                 f"vs {float(info_nce(logits, jnp.arange(8))):.6f} treating them as negatives"))
    width = max(len(r[0]) for r in rows)
    for name, value, note in rows:
        print(f"  {name:<{width}}  {value:12.6f}   {note}")
    print()


FLAGS = flags.FlagValues()  # this command's own (contrastive_jax.command_line)
_BATCH = flags.DEFINE_integer("batch", 256, "rows of the synthetic batch", flag_values=FLAGS)
_DIM = flags.DEFINE_integer("dim", 8, "dimensions of each row", flag_values=FLAGS)
_RHO = flags.DEFINE_float("rho", 0.5, "per-dimension correlation", flag_values=FLAGS)
_QUICK = flags.DEFINE_bool("quick", False, "one small shape in the gradcheck", flag_values=FLAGS)
_SKIP_GRADCHECK = flags.DEFINE_bool(
    "skip-gradcheck", False, "only the losses (experiments/gradcheck.py writes the table)",
    flag_values=FLAGS)
COMMAND = command_line.Command(program="python -m contrastive_jax.demo", doc=__doc__,
                               flag_values=FLAGS)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m contrastive_jax.demo`` (``argv``: its arguments, ``sys.argv[1:]`` when
    None): the losses, then the gradient-check table; the exit status
    (:func:`contrastive_jax.command_line.run_command`)."""
    return command_line.run_command(COMMAND, _tour, argv)


def _tour(positional: list[str]) -> None:
    """Print the losses on the synthetic batch, then (unless skipped) the gradient check."""
    enable_compilation_cache()
    print(f"contrastive_jax demo on {jax.device_count()} {jax.devices()[0].platform} device(s)\n")
    show_losses(_BATCH.value, _DIM.value, _RHO.value)
    if _SKIP_GRADCHECK.value:
        return
    shapes = ((3, 2),) if _QUICK.value else gradcheck.DEFAULT_SHAPES
    print(f"Gradient check: every closed form vs jax.grad, shapes (n, d) in {list(shapes)}")
    start = time.time()

    def progress(i, total, row):
        eta = (time.time() - start) / i * (total - i)
        print(f"  [{i:2d}/{total}] {row['source']:<13} f32 {row['float32']:.1e}  "
              f"f64 {row['float64']:.1e}  (ETA {eta:4.0f} s)  {row['formula']}", flush=True)

    rows = gradcheck.run_gradcheck(shapes=shapes, progress=progress)
    print()
    print(gradcheck.markdown_table(rows))
    worst = max(r["float64"] for r in rows)
    print(f"\nWorst float64 error {worst:.1e} ({'below' if worst < 1e-10 else 'ABOVE'} 1e-10).")


if __name__ == "__main__":
    sys.exit(main())
