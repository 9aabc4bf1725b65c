"""rollout.spareEngine with real vLLM: a kill -9 of the serving engine core is answered by adopting the spare.

The tiny Qwen2, a real etcd registry and publisher: an engine serves version 1 while a spare (spare.py) starts
beside it; its engine core is killed with SIGKILL, as an OOM kill does; the sidecar's supervisor checks until
the engine serves again. Asserted: the restart adopted the spare (its processes are now the engine's, no
third vLLM was started for it), loaded the current version and generates what version 1's weights generate;
the dead engine's processes are gone; /health names the serving processes and the spare's state; the next
spare starts once the engine serves, and one that dies idle is not handed over (a cold start follows);
closing and terminating leave none of the processes and /dev/shm segments of the engines started here.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import tiny_model
from test_rollout_engine import greedy

from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.checkpoint_engine.service.engine_status import Health, Phase
from tandem.sidecars.rollout.supervisor import EngineSupervisor
from tandem.sidecars.rollout_engine.engine import EngineConfig, RolloutEngine
from tandem.sidecars.rollout_engine.spare import SpareEngine

WAIT_S = 300.0  # a vLLM start on two loaded cores, with margin


def wait_for(cond: Callable[[], bool], what: str, seconds: float = WAIT_S) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def engine_core(pids: list[int]) -> int:
    """The engine core among an engine's processes: the one this process started itself."""
    me = os.getpid()
    return next(p for p in pids if psutil.Process(p).ppid() == me)


def gone(pids: set[int]) -> bool:
    def dead(p: int) -> bool:
        try:
            return psutil.Process(p).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    return all(dead(p) for p in pids)


def test_a_killed_engine_is_replaced_by_its_spare(etcd_server: Any, tiny_dir: Path, shm_root: Path,
                                                  job: str) -> None:
    from tandem.checkpoint_engine.service.publisher import Publisher

    reg = SyncRegistry(etcd_server.endpoint, "test", job, "pod0", "rollout", ttl=5, timeout=2.0).connect()
    pub_reg = SyncRegistry(etcd_server.endpoint, "test", job, "pod0", "trainer", ttl=5, timeout=2.0).connect()
    pub = Publisher(shm_root, job, pub_reg, keep=2)
    cfg = EngineConfig(shm_root=shm_root, job=job, max_model_len=256)
    engine = RolloutEngine(cfg, registry=reg)
    spare = SpareEngine(cfg, str(tiny_dir))
    engine.spare = spare
    segments: set[str] = set()  # vLLM's /dev/shm segments of every engine started here
    served: set[int] = set()
    spare_pids: set[int] = set()
    second: set[int] = set()
    try:
        version = pub.publish(None, tiny_model.random_state_dict(51).items()).version
        engine.start(str(tiny_dir), dummy=True)
        engine.update(None)
        expected = greedy(engine)
        spare.prepare()
        wait_for(lambda: spare.state == "ready", "the spare to start")
        spare_pids = set(spare._ready.procs.procs) if spare._ready else set()  # noqa: SLF001
        served = set(engine.status().pids)
        segments |= engine.procs.segments | (spare._ready.procs.segments if spare._ready else set())  # noqa: SLF001
        assert segments
        assert spare_pids and served and not spare_pids & served
        health = Health.of(engine.status(), True).body()
        assert set(health["pids"]) == served and health["spare"] == "ready" and health["sparesTaken"] == 0

        os.kill(engine_core(sorted(served)), signal.SIGKILL)  # as an OOM kill does
        supervisor = EngineSupervisor(engine, str(tiny_dir), stall_s=120.0, has_version=lambda: True)

        def served_again() -> bool:
            supervisor.check()
            return engine.restarts == 1 and engine.phase == Phase.READY

        wait_for(served_again, "the supervisor to restart the engine")
        assert spare.taken == 1
        assert set(engine.status().pids) == spare_pids  # the spare's processes serve: no cold start
        assert engine.version == version
        assert greedy(engine) == expected  # version 1's weights, loaded into the spare
        wait_for(lambda: gone(served), "the killed engine's processes to be reaped", 60)

        # the next spare starts once the engine serves; one that dies idle is not handed over
        wait_for(lambda: spare.state == "ready", "the next spare to start")
        second = set(spare._ready.procs.procs) if spare._ready else set()  # noqa: SLF001
        segments |= spare._ready.procs.segments if spare._ready else set()  # noqa: SLF001
        assert second and not second & spare_pids
        os.kill(engine_core(sorted(second)), signal.SIGKILL)
        wait_for(lambda: any(not psutil.pid_exists(p) or psutil.Process(p).status() == psutil.STATUS_ZOMBIE
                             for p in second), "the spare's engine core to die")
        assert spare.take(timeout_s=5) is None and spare.taken == 1
        wait_for(lambda: gone(second), "the dead spare's processes to be reaped", 60)
    finally:
        spare.close()
        engine.terminate()
        pub.close()
        reg.close()
        pub_reg.close()
    assert gone(served | spare_pids | second)  # every engine started here (the session's shared one runs on)
    assert not [name for name in segments if (Path("/dev/shm") / name).exists()]
