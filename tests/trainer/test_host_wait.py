"""Trainer ranks wait for the driver's long phases on the host group (`host_wait`), not in a collective of
the main group: two real gloo ranks whose main group has a short timeout (3 s, standing in for NCCL's),
rank 0 busy for longer (8 s, the rollout phase it stands for: the sleep is the phase, not a wait), then
broadcasting the samples. Over the host group rank 1 receives them; over the main group, as the trainer
did before, rank 1's wait fails with the timeout (the control that shows the phase is long enough)."""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from tandem.checkpoint_engine.ports import free_port
from tandem.sidecars.trainer.loop import host_wait

MAIN_TIMEOUT = timedelta(seconds=3)
PHASE_S = 8.0
SAMPLES = {"iteration": 3, "tokens": [[1, 2, 3], [4, 5]]}


def rank_main(rank: int, port: int, mode: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    host_wait.init(backend="gloo", rank=rank, world_size=2, timeout=MAIN_TIMEOUT)
    host_wait.start(MAIN_TIMEOUT, wait=timedelta(minutes=2))
    if rank == 0:
        time.sleep(PHASE_S)  # the driver's rollout and evaluation
    t = time.monotonic()
    try:
        if mode == "host":
            got = host_wait.broadcast(SAMPLES if rank == 0 else None)
        else:
            box = [SAMPLES if rank == 0 else None]
            dist.broadcast_object_list(box, src=0)
            got = box[0]
        result = {"got": got}
    except Exception as e:  # noqa: BLE001 - the control expects the timeout
        result = {"error": f"{type(e).__name__}: {e}"}
    result["waited_s"] = time.monotonic() - t
    Path(out, f"{rank}.json").write_text(json.dumps(result))
    os._exit(0)  # no teardown: after a timed-out collective it may block


def run(mode: str, tmp_path: Path) -> dict[int, dict[str, object]]:
    mp.spawn(rank_main, args=(free_port(), mode, str(tmp_path)), nprocs=2, join=True)
    return {r: json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)}


@pytest.mark.timeout(300)
def test_ranks_wait_out_a_long_phase_on_the_host_group(tmp_path: Path) -> None:
    results = run("host", tmp_path)
    assert results[0]["got"] == SAMPLES and results[1]["got"] == SAMPLES, results
    assert float(results[1]["waited_s"]) > MAIN_TIMEOUT.total_seconds(), results  # longer than the main timeout


@pytest.mark.timeout(300)
def test_the_same_wait_on_the_main_group_times_out(tmp_path: Path) -> None:
    results = run("main", tmp_path)
    assert "error" in results[1], results
    assert "timed out" in str(results[1]["error"]).lower() or "timeout" in str(results[1]["error"]).lower(), results
