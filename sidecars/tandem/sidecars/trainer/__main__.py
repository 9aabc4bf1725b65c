"""`python -m tandem.sidecars.trainer`: the trainer container's entry point.

Reads the pod environment (`PodEnv`), applies the CPU compatibility layer when there is no GPU,
starts one process per local trainer rank (gloo on CPU, NCCL on GPUs) with global ranks derived
from the pod index, and runs the driver loop (`driver.run`). SIGTERM stops it cleanly.
Caller: the pod built by `tandem.operator.builders` (in a cluster) or `tandem run` (locally).
"""

from __future__ import annotations

import logging
import os
import sys

from tandem.sidecars.podenv import PodEnv, start_sidecar

log = logging.getLogger("tandem.trainer")


def _rank_main(local_rank: int, env: PodEnv, ranks_per_pod: int) -> None:
    import torch

    from tandem.sidecars.trainer import cpu_compat, driver

    if not torch.cuda.is_available():
        cpu_compat.apply()
    else:
        torch.cuda.set_device(local_rank)
    world = env.replicas * ranks_per_pod
    os.environ.update(RANK=str(env.pod_index * ranks_per_pod + local_rank), LOCAL_RANK=str(local_rank),
                      WORLD_SIZE=str(world), MASTER_ADDR=env.master_addr, MASTER_PORT=str(env.master_port))
    driver.run(env, env.load_job())


def main() -> int:
    started = start_sidecar(log)
    if started is None:
        return 2
    env, job = started
    ranks = job.spec.trainer_ranks_per_pod()
    if ranks == 1:
        _rank_main(0, env, 1)
    else:
        import torch.multiprocessing as mp

        mp.spawn(_rank_main, args=(env, ranks), nprocs=ranks, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
