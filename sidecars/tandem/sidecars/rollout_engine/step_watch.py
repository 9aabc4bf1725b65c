"""How long vLLM has been inside one call that should return: the rollout's measure of a hung engine.

Role: a hung accelerator (an Xid error, a stuck NCCL call) or a stopped engine process (SIGSTOP) leaves
vLLM's client blocked in `LLMEngine.step()` (or a reload's `collective_rpc`) with no error: only a clock
tells it apart from work. `StepWatch.wrap(engine)` times every step of vLLM's engine loop, the one
`LLM.generate` and the multi-turn loop (turns.py) both drive; `busy(what)` times other calls into the
engine (weight reloads, prefix-cache resets). `stalled()` is the call now in progress and how long it has run
(0 between calls: an engine waiting for tools or for work is not hung), `steps` how many returned, the
progress a client can watch. A step is milliseconds to seconds, so a call open for failurePolicy.rolloutStallSeconds
is a hung engine. Callers: `engine.RolloutEngine` (wraps at start), the rollout sidecar's
supervisor and /health (`tandem.sidecars.rollout.supervisor`, `api.create_app`).
On CPU, where one step of a loaded machine can take long, the supervisor also counts the engine's processes
computing as progress (`progress`), so only an engine that neither returns nor computes (stopped, deadlocked)
stalls; on GPUs a hung kernel may spin a core, so there only returning calls count.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class StepWatch:
    def __init__(self) -> None:
        self.steps = 0  # calls into the engine that returned (or raised)
        self._open: dict[int, tuple[str, float]] = {}  # thread id -> (what, monotonic start)
        self._lock = threading.Lock()

    def wrap(self, llm_engine: Any) -> None:
        """Time every `step()` of vLLM's `LLMEngine` (an attribute on that one object, so `LLM.generate`'s
        loop and ours go through it)."""
        step = llm_engine.step

        def timed_step(*args: Any, **kwargs: Any) -> Any:
            with self.busy("step"):
                return step(*args, **kwargs)

        llm_engine.step = timed_step

    @contextmanager
    def busy(self, what: str) -> Iterator[None]:
        me = threading.get_ident()
        with self._lock:
            self._open[me] = (what, time.monotonic())
        try:
            yield
        finally:
            with self._lock:
                self._open.pop(me, None)
                self.steps += 1

    def progress(self) -> None:
        """Progress seen outside vLLM's calls returning (its processes computing: the supervisor, on CPU): the
        calls now open count as stalled from now on."""
        now = time.monotonic()
        with self._lock:
            for k, (what, _) in self._open.items():
                self._open[k] = (what, now)

    def stalled(self) -> tuple[str, float] | None:
        """(what, seconds) of the oldest call in progress, or None when none is."""
        with self._lock:
            if not self._open:
                return None
            what, since = min(self._open.values(), key=lambda o: o[1])
        return what, time.monotonic() - since
