"""How the rollout engine fails: killed when hung, found dead, marked FAILED, freed; the phase a call needs.

Role: `EngineFailures`, the part of `engine.RolloutEngine` (which derives from it) that decides an engine is no
longer serving: `kill` ends a hung engine's processes without the lock its hung call holds; `release_waiters`
fails the calls blocked on a dead engine core; `check_alive` and `ensure_alive` find an engine whose
processes died and free what they left; `fail` and `mark_failed` set FAILED with the cause; `_need` refuses a
call in the wrong phase (EngineNotRunning, WrongPhase). The supervisor (`tandem.sidecars.rollout.supervisor`)
calls the first three; generation and reloads call the rest.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.service.engine_status import Phase
from tandem.sidecars.rollout_engine import llm
from tandem.sidecars.rollout_engine.procs import EngineProcesses

log = logging.getLogger(__name__)


class EngineFailures:
    """The failure half of the rollout engine; the engine holds the state it reads."""

    llm: Any
    procs: EngineProcesses
    phase: Phase
    error: str | None
    killed_for: str | None
    _lock: threading.RLock

    def _destroy(self) -> None:
        raise NotImplementedError

    def set_phase(self, phase: Phase, error: str | None = None) -> None:
        raise NotImplementedError

    def kill(self, cause: str) -> int:
        """SIGKILL vLLM's processes (a hung engine: its call never returns), without the engine's lock,
        which that call holds. The call then fails, and the engine goes FAILED naming `cause`. Returns
        the processes signalled."""
        self.killed_for = cause
        killed = self.procs.kill()
        log.warning("killed vLLM's processes %s: %s", killed, cause)
        return len(killed)

    def release_waiters(self) -> int:
        """Fail the calls blocked on a dead engine core (llm.release_waiters), so the call fails, the engine goes
        FAILED and its lock is freed. Called by the supervisor once a process of a busy engine is dead."""
        return llm.release_waiters(self.llm)

    def check_alive(self) -> bool:
        """False (and the engine FAILED, what its processes left freed) when an idle engine's processes
        died; True while it serves or is busy (a call in progress finds a death itself)."""
        if not self._lock.acquire(blocking=False):
            return True
        try:
            if self.phase != Phase.READY:
                return self.phase != Phase.FAILED
            self.ensure_alive()
            return True
        except errors.EngineNotRunning:
            return False
        finally:
            self._lock.release()

    def mark_failed(self, error: str) -> None:
        with self._lock:
            self.set_phase(Phase.FAILED, error=error)

    def fail(self, error: str, free: bool = True) -> None:
        """The engine FAILED naming `error`; with `free`, what its processes left is freed if one died."""
        if free and self.procs.any_dead():
            self._destroy()
        self.set_phase(Phase.FAILED, error=error)

    def cause(self, e: BaseException) -> str:
        return f"{self.killed_for} ({e})" if self.killed_for else str(e)

    def ensure_alive(self) -> None:
        """Refuse to use an engine whose processes died (vLLM 0.32's blocking client would wait for
        their output forever), after freeing what they left behind."""
        if self.llm is not None and self.procs.any_dead():
            self._destroy()
            self.set_phase(Phase.FAILED, error=self.killed_for or "a vLLM engine process died")
            raise errors.EngineNotRunning("a vLLM engine process died; start the engine again")

    def _need(self, phase: Phase) -> None:
        if self.phase == phase:
            return
        if self.phase in (Phase.STOPPED, Phase.FAILED) or self.llm is None:
            raise errors.EngineNotRunning(
                f"the vLLM engine is {self.phase.value}" + (f": {self.error}" if self.error else "")
            )
        raise errors.WrongPhase(f"needs phase {phase.value}; the engine is {self.phase.value}")
