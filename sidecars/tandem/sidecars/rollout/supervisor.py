"""The rollout sidecar's supervisor: its vLLM engine dies, hangs or fails a reload, and it serves again.

Role: a thread beside the rollout's HTTP server that looks at the engine every second:
- **died** (an engine process gone: OOM kill, Xid error, kill -9): while idle, the engine is marked FAILED;
  during a call, the rest of its processes are killed and the call, which vLLM's client would leave
  waiting forever, is failed (`RolloutEngine.release_waiters`), so the engine goes FAILED;
- **hung** (a call into vLLM open past its deadline without progress: `StepWatch.open_call`; the deadline
  follows the durations of that kind of call seen so far, capped by failurePolicy.rolloutStallSeconds,
  stall_deadline.py; on CPU its processes computing count as progress, so a slow step on a loaded machine is
  not a hang, a stopped or deadlocked engine is): its processes are killed (`RolloutEngine.kill`), so the hung
  call fails and frees the engine;
- **FAILED** (any of those, or a reload that failed half-way): it says so (a warning naming the cause,
  /health 503 so the pod is not ready, `ready: false` in its etcd endpoint so the driver admits it no
  more), starts a new engine (with rollout.spareEngine it adopts the spare started ahead instead of a cold
  start, and starts the next spare once it serves: spare.py), loads the newest version (from the pod's shared
  memory, else pulled from a holder by the engine's version source: `RolloutEngine.update`,
  `puller.TransportPuller`) and serves again (`ready: true`; the driver re-admits it at the version it
  trains, `RolloutClient.join`).
A restart that fails is tried again after a backoff; after MAX_FAILED_RESTARTS in a row the supervisor gives
up and the sidecar exits with one line naming the cause: the kubelet (native sidecar, restartPolicy
Always) or `tandem run` starts the container again, and the operator replaces a rollout-only pod. An engine
stopped on purpose (betweenRollouts: terminate) is left alone. The moment an engine is found dead, hung or
FAILED starts its recovery (`engine.recovery.down`), which its first generation after the restart ends
(recovery.py): /health's `recoveryS`. Caller: `tandem.sidecars.rollout.__main__`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tandem.checkpoint_engine.service.engine_status import Phase
from tandem.sidecars.rollout_engine.engine import RolloutEngine

log = logging.getLogger(__name__)
POLL_S = 1.0
MAX_FAILED_RESTARTS = 5  # in a row; then the sidecar exits and its container or pod is replaced
BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)
SPARE_WAIT_S = 600.0  # a spare still starting when the engine fails: its start is further along than a new one


class GaveUp(RuntimeError):
    """The engine could not be started again MAX_FAILED_RESTARTS times in a row."""


@dataclass
class EngineSupervisor:
    engine: RolloutEngine
    model_dir: str
    stall_s: float
    ready: Callable[[bool], None] = field(default=lambda _: None)  # the endpoint's readiness in etcd
    has_version: Callable[[], bool] = field(default=lambda: True)  # a version is registered to load
    stopping: threading.Event = field(default_factory=threading.Event)  # set: the sidecar shuts down
    cpu_progress: bool = True  # count the engine's processes computing as progress (CPU engines; not on GPUs)
    failed_restarts: int = 0
    gave_up: str | None = None
    _sign: float = 0.0

    def __post_init__(self) -> None:
        self.engine.watch.ceiling_s = self.stall_s  # the user's cap on every deadline (and /health's)

    def _computed(self) -> bool:
        """True when vLLM's processes showed any sign of life since the last look: CPU time or context
        switches (a slow step on a loaded machine computes; one waiting on a disk busy with other work
        switches). A stopped or deadlocked engine does neither."""
        sign = 0.0
        for p in self.engine.procs.alive():
            try:
                t, c = p.cpu_times(), p.num_ctx_switches()
                sign += t.user + t.system + c.voluntary + c.involuntary
            except Exception:  # noqa: BLE001, S112 - gone meanwhile
                continue
        alive = sign != self._sign
        self._sign = sign
        return alive

    def check(self) -> None:
        """One look at the engine: kill a hung one, restart a FAILED one. Raises GaveUp."""
        engine = self.engine
        if self.cpu_progress and self._computed():
            engine.watch.progress()
        call = engine.watch.open_call()
        if call is not None and call.stalled_s > call.deadline.seconds and engine.killed_for is None:
            engine.recovery.down()
            engine.kill(f"vLLM hung: its {call.what} made no progress for {call.stalled_s:.0f}s "
                        f"(deadline {call.deadline.seconds:.0f}s: {call.deadline.describe(self.stall_s)})")
        if call is not None and engine.procs.any_dead():  # died under a call: it would wait forever
            engine.recovery.down()
            if engine.killed_for is None:
                engine.kill(f"a vLLM process died during its {call.what}")  # the rest of it, at once
            if engine.procs.any_dead() and not engine.procs.alive():
                engine.release_waiters()
        engine.check_alive()
        if engine.phase == Phase.FAILED:
            engine.recovery.down()  # found dead idle, or a reload failed half-way (kept if found earlier)
            self.restart()

    def restart(self) -> None:
        if self.stopping.is_set():  # the sidecar is shutting down: nothing to serve
            return
        engine = self.engine
        cause = engine.error or "unknown"
        log.warning("vLLM engine failed (%s): restarting it (restart %d)", cause, engine.restarts + 1)
        engine.recovering = True
        self.ready(False)
        t = time.monotonic()
        spare = engine.spare.take(timeout_s=SPARE_WAIT_S) if engine.spare is not None else None
        try:
            if spare is not None:  # started ahead (rollout.spareEngine): no cold start
                engine.adopt(spare)
            else:
                engine.start(self.model_dir, dummy=True)
            if self.has_version():
                engine.update(None)
        except Exception as e:  # noqa: BLE001 - typed errors and whatever vLLM raises: the engine stays FAILED
            if self.stopping.is_set():
                return
            self._failed(cause, e)
            return
        engine.restarts += 1
        self.failed_restarts = 0
        engine.recovering = False
        self.ready(True)
        log.warning("vLLM engine restarted in %.1fs at version %s (restart %d, %s; it had failed: %s)",
                    time.monotonic() - t, engine.version, engine.restarts,
                    "the spare taken" if spare is not None else "a cold start", cause)
        if engine.spare is not None:
            engine.spare.prepare()  # the next spare, started while this engine serves

    def _failed(self, cause: str, e: BaseException) -> None:
        self.failed_restarts += 1
        if self.engine.phase != Phase.FAILED:  # started, then the load failed: start again from scratch
            try:
                self.engine.terminate()
            except Exception as stop_error:  # noqa: BLE001
                log.warning("terminating the engine after a failed restart: %s", stop_error)
            self.engine.mark_failed(f"restart failed: {e}")
        if self.failed_restarts >= MAX_FAILED_RESTARTS:
            self.gave_up = (f"vLLM engine could not be restarted ({self.failed_restarts} tries; last: {e}; "
                            f"it had failed: {cause})")
            raise GaveUp(self.gave_up)
        pause = BACKOFF_S[min(self.failed_restarts, len(BACKOFF_S)) - 1]
        log.warning("restarting the vLLM engine failed (%s); trying again in %.0fs", e, pause)
        time.sleep(pause)

    def run(self, stop: threading.Event, on_give_up: Callable[[str], None]) -> threading.Thread:
        """A daemon thread checking every POLL_S until `stop`; `on_give_up(reason)` when it gives up."""

        self.stopping = stop

        def loop() -> None:
            while not stop.wait(POLL_S):
                try:
                    self.check()
                except GaveUp as e:
                    on_give_up(str(e))
                    return
                except Exception as e:  # noqa: BLE001 - a supervisor that dies would leave a dead engine behind
                    log.exception("engine supervisor: %s", e)

        thread = threading.Thread(target=loop, name="engine-supervisor", daemon=True)
        thread.start()
        return thread
