"""The fault injector's waits (bench/chaos.py, used by tests/e2e/test_rollout_faults.py) end by their own
deadline with a TimeoutError naming what they waited for, before any pytest timeout: each of `Chaos`'s waits at
the injector's deadline, `wait_run` at its seconds for the run itself, and early once the injector failed."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
from chaos import WAIT_S, Chaos, wait_run  # noqa: E402


def idle() -> subprocess.Popen[str]:
    """A process that runs until its stdin closes."""
    return subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, text=True)


def test_a_wait_of_the_injector_ends_at_its_deadline_naming_what_it_waited_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chaos = Chaos(tmp_path / "run", "j", deadline=time.monotonic() + 0.5)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"^no 1 iterations within \d+s$"):
        chaos.wait_rows(1, threading.Event())  # no metrics.jsonl ever appears
    assert time.monotonic() - started < WAIT_S / 10
    monkeypatch.setattr(chaos, "_wait_engine", lambda pod, stop: (None, []))
    with pytest.raises(TimeoutError, match="no stop of j-0's engine during its step before the deadline"):
        chaos.hang("j-0", seconds=60, stop=threading.Event(), during="step")  # its engine never steps

def test_a_wait_stops_when_the_run_ended(tmp_path: Path) -> None:
    ended = threading.Event()
    ended.set()
    with pytest.raises(RuntimeError, match="the run ended before 1 iterations"):
        Chaos(tmp_path / "run", "j").wait_rows(1, ended)


def test_wait_run_returns_when_the_run_ends() -> None:
    proc = idle()
    closer = threading.Thread(target=lambda: proc.stdin.close() if proc.stdin else None)  # ends it meanwhile
    closer.start()
    wait_run(proc, 60, [], "the idle process")
    assert proc.returncode == 0
    closer.join()


def test_wait_run_fails_naming_the_run_past_its_seconds() -> None:
    proc = idle()
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="^the idle process did not end within 0s$"):
            wait_run(proc, 0.3, [], "the idle process")
        assert time.monotonic() - started < 10 and proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_wait_run_returns_early_once_the_injector_failed() -> None:
    proc, failures = idle(), list[BaseException]()
    try:
        failer = threading.Timer(0.2, lambda: failures.append(TimeoutError("no e2e-faults-2 generating within 600s")))
        failer.start()
        wait_run(proc, 600, failures, "the idle process")  # returns: the test reports the injector's failure
        assert proc.poll() is None and failures
    finally:
        proc.kill()
        proc.wait()
