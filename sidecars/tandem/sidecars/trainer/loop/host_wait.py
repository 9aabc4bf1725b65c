"""Trainer ranks wait for the driver on the host, not inside an NCCL collective.

Role: while the driver (rank 0) runs the rollout and evaluation, which take minutes to hours, every
other rank waits for the iteration's samples. A `broadcast_object_list` on the main (NCCL) group
would park those ranks in a GPU collective for the whole phase, where NCCL's watchdog kills the job
once the process-group timeout passes. `start` makes a gloo group beside the main one, with a timeout
of its own (a day, or the main group's if longer); `broadcast` sends rank 0's object to every rank
over it, so the waiting happens in a CPU socket. The main group keeps `trainer.processGroupTimeoutMinutes`
(`init`), which now bounds only real collectives (gradients, exports). Callers: `trainer.rank.run_rank`
(`init`, `start`), `TrainerContext.broadcast`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist

HOST_WAIT = timedelta(days=1)  # the longest rollout + evaluation phase the other ranks wait through
_group: Any = None


def init(*, backend: str, rank: int, world_size: int, timeout: timedelta) -> None:
    """The main process group (env:// rendezvous: MASTER_ADDR/MASTER_PORT) with `timeout`."""
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size, timeout=timeout)


def start(main_timeout: timedelta = timedelta(0), wait: timedelta = HOST_WAIT) -> None:
    """The host-side group every rank waits on, with timeout max(`wait`, the main group's) (collective:
    every rank calls it, in the same order)."""
    global _group
    if dist.is_initialized() and dist.get_world_size() > 1 and _group is None:
        _group = dist.new_group(backend="gloo", timeout=max(wait, main_timeout))


def broadcast(obj: Any) -> Any:
    """Rank 0's `obj` on every rank; the others block in a gloo receive (host) until it comes."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=_group)  # _group None (not started): the main group
    return box[0]
