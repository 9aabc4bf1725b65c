"""A terminated or killed vLLM engine leaves no processes and no shared-memory segments behind.

Real vLLM (CPU). One engine of its own (not the session's: it is terminated and killed here),
started twice: once terminated in order, once with its engine core SIGKILLed under it.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.service.engine_status import Phase
from tandem.checkpoint_engine.versions import layout
from tandem.sidecars.rollout_engine.engine import EngineConfig, RolloutEngine
from tandem.sidecars.rollout_engine.sampling import SamplingOptions

pytestmark = pytest.mark.vllm
SHM = Path("/dev/shm")


def started(engine: RolloutEngine, model: Path) -> tuple[set[str], list[int]]:
    engine.start(str(model), dummy=True)
    segs, pids = set(engine.procs.segments), [p.pid for p in engine.procs.alive()]
    assert pids and segs, "vLLM's engine core/workers and their /dev/shm queues are recorded"
    assert all((SHM / s).exists() for s in segs)
    return segs, pids


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie holds nothing
    except FileNotFoundError:
        return True


def test_terminated_and_killed_engines_leave_nothing(tiny_dir: Path) -> None:
    root = SHM / f"tandem-test-{uuid.uuid4().hex[:8]}"
    engine = RolloutEngine(EngineConfig(shm_root=root, job="shm", max_model_len=256))
    try:
        segs, pids = started(engine, tiny_dir)
        engine.terminate()
        assert all(gone(p) for p in pids), "terminate returned with vLLM processes alive"
        assert not [s for s in segs if (SHM / s).exists()], "terminate left shm segments"

        segs, pids = started(engine, tiny_dir)
        core = next(p for p in engine.procs.alive() if "EngineCore" in p.name())
        os.kill(core.pid, signal.SIGKILL)  # the engine core dies (its workers follow it)
        deadline = time.monotonic() + 30
        while not gone(core.pid) and time.monotonic() < deadline:  # SIGKILL is delivered asynchronously
            time.sleep(0.05)
        with pytest.raises(errors.EngineNotRunning):
            engine.generate(["alpha beta"], SamplingOptions(max_tokens=4))
        assert engine.phase == Phase.FAILED
        assert all(gone(p) for p in pids), "a dead engine's processes are reaped"
        assert not [s for s in segs if (SHM / s).exists()], "a killed engine left shm segments"
    finally:
        engine.terminate()
        layout.clean_stale_temps(root, "shm")
        import shutil

        shutil.rmtree(root, ignore_errors=True)
