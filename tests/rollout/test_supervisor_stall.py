"""The rollout's supervisor cuts a hung engine at the deadline its calls set, not at the ceiling, without vLLM.

As tests/rollout_engine/test_engine_procs.py does, a real `RolloutEngine` (never started) is given a real
process tree as its engine's processes (`EngineProcesses.record`), and a thread stands for vLLM's client: a step
blocked until that process answers or dies, raising when it died (as vLLM's EngineDeadError does). The
process is stopped (SIGSTOP, a hung GPU); the supervisor's checks run until it kills it. The floor is lowered
to one second so the test is fast: 40 steps of microseconds give the floor, far below the 120 s ceiling.
Also: a process that keeps computing (CPU) is progress, not a hang; /health and the status report the
deadline; the recovery starts when the hang is found.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tandem.sidecars.rollout.supervisor import EngineSupervisor
from tandem.sidecars.rollout_engine import stall_deadline
from tandem.sidecars.rollout_engine.engine import EngineConfig, RolloutEngine
from tandem.sidecars.rollout_engine.procs import EngineProcesses

CEILING = 120.0
FLOOR = 1.0
IDLE = "import sys; sys.stdin.read()"  # an engine process waiting for work: no CPU
SPIN = "import sys\nwhile True: pass"  # one that computes: progress on CPU


@pytest.fixture(autouse=True)
def _floor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stall_deadline, "FLOOR_S", FLOOR)


def engine_on(tmp_path: Path, code: str) -> tuple[RolloutEngine, subprocess.Popen[bytes]]:
    engine = RolloutEngine(EngineConfig(shm_root=tmp_path, job="none"))
    engine.procs = EngineProcesses.before_start()
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
    engine.procs.record()
    assert list(engine.procs.procs) == [proc.pid]
    for _ in range(40):  # the steps it served (the first 16 not recorded): microseconds each, so the floor
        with engine.watch.busy("step"):
            pass
    return engine, proc


def blocked_step(engine: RolloutEngine, proc: subprocess.Popen[bytes]) -> threading.Thread:
    """vLLM's client in a step waiting on its engine: returns when the process exits, raises if it died."""
    opened = threading.Event()

    def step() -> None:
        try:
            with engine.watch.busy("step"):
                opened.set()
                if proc.wait() != 0:
                    raise RuntimeError("engine dead")
        except RuntimeError:
            pass

    thread = threading.Thread(target=step, daemon=True)
    thread.start()
    assert opened.wait(10)
    return thread


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    made: list[subprocess.Popen[bytes]] = []
    yield made
    for p in made:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_a_hung_engine_is_killed_at_its_deadline_not_the_ceiling(tmp_path: Path,
                                                                  procs: list[subprocess.Popen[bytes]]) -> None:
    engine, proc = engine_on(tmp_path, IDLE)
    procs.append(proc)
    supervisor = EngineSupervisor(engine, str(tmp_path), CEILING, cpu_progress=True)
    assert engine.watch.ceiling_s == CEILING  # the supervisor hands the user's cap to the watch
    thread = blocked_step(engine, proc)
    proc.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    health = engine.status()
    assert health.busy == "step" and health.stall_deadline_s == FLOOR
    assert health.stall_deadline is not None and "the floor of 1s" in health.stall_deadline
    while engine.killed_for is None and time.monotonic() - stopped < 60:
        supervisor.check()
        time.sleep(0.05)
    cut = time.monotonic() - stopped
    thread.join(10)
    assert engine.killed_for is not None, "not killed within 60 s"
    assert FLOOR <= cut < CEILING / 4, cut  # at the deadline (one second, the checks' pace), not 120 s
    assert engine.killed_for.startswith("vLLM hung: its step made no progress for")
    assert "(deadline 1s: the floor of 1s" in engine.killed_for
    assert "failurePolicy.rolloutStallSeconds 120 caps it" in engine.killed_for
    assert proc.wait(10) == -signal.SIGKILL  # killed while stopped
    assert len(engine.watch.durations("step")) == 24  # the hung call is not a duration of the pace
    assert engine.recovery.down_since is not None and stopped < engine.recovery.down_since <= stopped + cut


def test_an_engine_that_computes_is_not_hung(tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    """On CPU its processes computing count as progress: a step open three deadlines long is waited for."""
    engine, proc = engine_on(tmp_path, SPIN)
    procs.append(proc)
    supervisor = EngineSupervisor(engine, str(tmp_path), CEILING, cpu_progress=True)
    thread = blocked_step(engine, proc)
    opened = time.monotonic()
    while time.monotonic() - opened < 3 * FLOOR:
        supervisor.check()
        time.sleep(0.05)
    assert engine.killed_for is None and proc.poll() is None
    call = engine.watch.open_call()
    assert call is not None and call.stalled_s < FLOOR  # its progress keeps resetting the clock
    proc.kill()
    thread.join(10)
