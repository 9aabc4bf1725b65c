"""One trainer rank's process: device, CPU compatibility layer, global rank from the pod index, process group,
then the loop (`loop.driver.run`).

Role: `run_rank` is `mp.spawn`'s importable target (one process per local trainer rank; not `__main__`);
`cpu_threads` shares the pod's cores among its CPU ranks. Caller: `python -m tandem.sidecars.trainer`.
"""

from __future__ import annotations

from datetime import timedelta

from tandem.sidecars.trainer.loop import host_wait
from tandem.sidecars.trainer.loop.driver import run
from tandem.spec.podenv import PodEnv


def run_rank(local_rank: int, env: PodEnv, ranks_per_pod: int) -> None:
    """One trainer rank: device, CPU compatibility layer, global rank from the pod index, the loop."""
    import os

    import torch

    from tandem.sidecars import gpu
    from tandem.sidecars.trainer.engines import cpu_compat

    job = env.load_job()
    on_gpu = gpu.select(job.spec.gpus_per_pod, "trainer")  # NoUsableGpu rather than a quiet CPU run
    if on_gpu:
        torch.cuda.set_device(local_rank)
    os.environ.update(RANK=str(env.pod_index * ranks_per_pod + local_rank), LOCAL_RANK=str(local_rank),
                      WORLD_SIZE=str(env.replicas * ranks_per_pod), MASTER_ADDR=env.master_addr,
                      MASTER_PORT=str(env.master_port))
    if not on_gpu:
        cpu_compat.apply()
        torch.set_num_threads(cpu_threads(ranks_per_pod))
    timeout = timedelta(minutes=job.spec.trainer.process_group_timeout_minutes)
    host_wait.init(backend="nccl" if on_gpu else "gloo", rank=int(os.environ["RANK"]),
                   world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout)
    host_wait.start(timeout)  # the other ranks wait out rollouts and evals here, not in NCCL
    run(env, job)


def cpu_threads(ranks_per_pod: int) -> int:
    """Threads of one CPU trainer rank: the pod's cores shared by its ranks. The hybrid deployment
    time-slices the pod, so while the trainer computes, the rollout (vLLM) sits idle and the
    active phase gets the machine (`tandem run` starts every sidecar with OMP_NUM_THREADS=1)."""
    import os

    return max(1, len(os.sched_getaffinity(0)) // max(1, ranks_per_pod))
