"""A spare vLLM engine, started ahead and idle, that a failed engine's restart takes instead of a cold start.

Role: `rollout.spareEngine` (CPU rollouts that keep vLLM up). A restart after a crash or a hang pays a cold vLLM
start: two Python processes spawned (vLLM's engine core, then its worker: vLLM-CPU spawns, never forks), each
importing vLLM and torch, before the model is built and the KV cache allocated: ~45 s on two loaded cores for
the toy model, where the weights themselves (dummy, then the pod's shm version) take well under a second. A
spare is that start done in the background while the engine serves (`llm.launch`: an `LLM` with dummy
weights, its processes recorded: only the children that appeared during its start), so a restart only adopts
it (`RolloutEngine.adopt`) and loads the current version. Idle, its engine core and worker wait on vLLM's
queues (vLLM's readers poll once idle: no CPU spent); it holds a second engine's memory (the model's weights
and KV cache), the price of the option.

`SpareEngine.prepare` starts one in a thread (one at a time); `take` waits for it and hands it over (None when it
failed to start or died idle: the caller starts cold); `close` ends it with the sidecar. A spare started while
the pod spawns other children would record them too: the rollout sidecar starts none of its own while vLLM runs.
Caller: the rollout sidecar's supervisor (`tandem.sidecars.rollout.supervisor`) and its entry point.
"""

from __future__ import annotations

import logging
import threading

from tandem.sidecars.rollout_engine.config import EngineConfig
from tandem.sidecars.rollout_engine.llm import Launched, discard, launch

log = logging.getLogger(__name__)


class SpareEngine:
    """At most one spare engine, started in the background and handed over once."""

    def __init__(self, cfg: EngineConfig, model_dir: str) -> None:
        self.cfg, self.model_dir = cfg, model_dir
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._ready: Launched | None = None
        self.error: str | None = None  # why the latest spare could not start
        self.taken = 0  # spares handed over to a restart
        self._closed = False

    @property
    def state(self) -> str:
        """none | starting | ready | failed (for the engine's status)."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return "starting"
            if self._ready is not None:
                return "ready"
            return "failed" if self.error else "none"

    def prepare(self) -> None:
        """Start a spare in a background thread unless one is ready or starting."""
        with self._lock:
            if self._closed or self._ready is not None or (self._thread is not None and self._thread.is_alive()):
                return
            self._thread = threading.Thread(target=self._start, name="vllm-spare", daemon=True)
            self._thread.start()

    def _start(self) -> None:
        try:
            spare = launch(self.cfg, self.model_dir, dummy=True)
        except Exception as e:  # noqa: BLE001 - whatever vLLM raises: a restart then starts cold
            log.warning("the spare vLLM engine did not start (a restart will start one cold): %s", e)
            with self._lock:
                self.error = str(e)
            return
        with self._lock:
            closed = self._closed
            if not closed:
                self._ready, self.error = spare, None
        if closed:  # the sidecar ended meanwhile
            discard(spare, self.cfg.shutdown_timeout_s)
            return
        log.info("spare vLLM engine ready in %.1fs (processes %s)", spare.start_s, sorted(spare.procs.procs))

    def take(self, timeout_s: float | None = None) -> Launched | None:
        """The spare, once its start ended (waiting up to `timeout_s`); None when none started or it died idle."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
        with self._lock:
            spare, self._ready = self._ready, None
        if spare is None:
            return None
        if spare.procs.any_dead() or not spare.procs.procs:
            log.warning("the spare vLLM engine died while idle: starting one cold")
            discard(spare, self.cfg.shutdown_timeout_s)
            return None
        self.taken += 1
        return spare

    def close(self) -> None:
        """End the spare (and one still starting, once it has started)."""
        with self._lock:
            self._closed = True
            spare, self._ready = self._ready, None
        if spare is not None:
            discard(spare, self.cfg.shutdown_timeout_s)
