"""One process of the 2-process loopback test in test_distributed.py (not a test itself).

    python tests/multihost_worker.py PROCESS_ID PORT

Joins a 2-process job on 127.0.0.1:PORT with 2 CPU devices each, builds the global batch from
its half of the rows, runs every strategy of the sharded CLIP and NT-Xent losses, and prints
the losses and full gradients (gathered from both processes) as one JSON line. It also reads
the first global batches of the ``digits`` training stream through the input pipeline (each
process its own shard, from ``jax.process_index()``), and reports their example indices.
"""

import json
import sys

import jax

from contrastive_jax.mesh import global_batch
from contrastive_jax.training.run.launch.distributed import Launch, join_job

ROWS, DIM = 16, 6
DATA_BATCH, DATA_SEED, DATA_STEPS = 8, 3, 3


def data():
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, DIM)).astype(np.float32)
    return x, (x + 0.5 * rng.standard_normal((ROWS, DIM))).astype(np.float32)


def main(process_id: int, port: str) -> None:
    jax.config.update("jax_num_cpu_devices", 2)
    join_job(Launch(mode="explicit", coordinator_address=f"127.0.0.1:{port}",
                    num_processes=2, process_id=process_id, initialization_timeout_s=60,
                    heartbeat_timeout_s=10))
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import multihost_utils

    from contrastive_jax.losses.sharded import STRATEGIES, sharded_clip_loss, sharded_nt_xent
    from contrastive_jax.mesh import make_mesh

    assert jax.process_count() == 2 and jax.device_count() == 4
    x, y = data()
    half = ROWS // 2
    mine = slice(process_id * half, (process_id + 1) * half)
    mesh = make_mesh({"data": -1})
    gx, gy = global_batch((x[mine], y[mine]), mesh)
    losses = {"clip": (sharded_clip_loss, jnp.log(10.0)),
              "nt_xent": (sharded_nt_xent, jnp.float32(0.2))}

    @jax.jit
    def every_loss(gx, gy):  # one program for every (loss, strategy): one compile
        return {f"{name}/{strategy}": jax.value_and_grad(
                    lambda a, b, t, fn=fn, s=strategy: fn(a, b, t, mesh=mesh, strategy=s,
                                                          block_size=3),
                    argnums=(0, 1, 2))(gx, gy, third)
                for name, (fn, third) in losses.items() for strategy in STRATEGIES}

    out = {}
    for key, (loss, grads) in every_loss(gx, gy).items():
        grads = multihost_utils.process_allgather(grads, tiled=True)
        out[key] = {"loss": float(loss), "grads": [np.asarray(g).tolist() for g in grads]}
    from contrastive_jax.training.data import default_data_config, train_iterator

    config = default_data_config()
    config.update({"name": "digits", "batch_size": DATA_BATCH, "seed": DATA_SEED})
    stream = train_iterator(config, mesh)
    out["data/indices"] = [
        np.asarray(multihost_utils.process_allgather(next(stream)["index"], tiled=True)).tolist()
        for _ in range(DATA_STEPS)]
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
