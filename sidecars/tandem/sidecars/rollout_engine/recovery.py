"""How long a rollout took to serve again after its engine failed: the measure of recovery.

Role: `Recovery` on each `RolloutEngine` (`engine.recovery`). The rollout's supervisor calls `down()` when it
finds the engine dead or hung (or FAILED after a reload), before it restarts it; the engine calls `served()`
when a generation completes (`generate`, and the multi-turn and chat loops' `serving` blocks). The seconds from
the first `down()` to the next `served()` are one recovery: detection's aftermath, the engine's start, the
newest version's load, the driver's re-admission and the first generation on the new engine. A second failure
before the first generation keeps the first `down()`: the recovery counts from the first failure. Read by the
engine's status (/health `recoveryS`, `recoveries`), its answers to /v1/generate and /v1/trajectories (the
driver's `rollout_recovery_s`, rollout_client.py) and its Prometheus metrics.
"""

from __future__ import annotations

import threading
import time


class Recovery:
    def __init__(self) -> None:
        self.recoveries = 0  # recoveries completed (a generation served after a failure)
        self.last_s: float | None = None  # seconds of the latest completed recovery
        self._down_since: float | None = None  # monotonic time the engine was found failed; None: serving
        self._lock = threading.Lock()

    @property
    def down_since(self) -> float | None:
        return self._down_since

    def down(self, at: float | None = None) -> None:
        """The engine was found dead, hung or FAILED (the first time counts until it serves again)."""
        with self._lock:
            if self._down_since is None:
                self._down_since = time.monotonic() if at is None else at

    def served(self, at: float | None = None) -> float | None:
        """A generation completed: the seconds since `down()` when this ends a recovery, else None."""
        with self._lock:
            if self._down_since is None:
                return None
            seconds = (time.monotonic() if at is None else at) - self._down_since
            self._down_since = None
            self.recoveries += 1
            self.last_s = seconds
            return seconds
