"""How long vLLM has been inside one call that should return: the rollout's measure of a hung engine.

Role: a hung accelerator (an Xid error, a stuck NCCL call) or a stopped engine process (SIGSTOP) leaves
vLLM's client blocked in `LLMEngine.step()` (or a reload's `collective_rpc`) with no error: only a clock
tells it apart from work. `StepWatch.wrap(engine)` times every step of vLLM's engine loop, the one
`LLM.generate` and the multi-turn loop (turns.py) both drive; `busy(what)` times other calls into the
engine (weight reloads, prefix-cache resets). `stalled()` is the call now in progress and how long it has run
(0 between calls: an engine waiting for tools or for work is not hung), `steps` how many returned, the
progress a client can watch. Every call that returns has its duration recorded by kind (the last
`stall_deadline.WINDOW`; not the first `stall_deadline.warm_calls` of a kind after each engine start, which pay
one-time costs: kernels built for new shapes, memory first touched), and `deadline(what)` is how long an open
call of that kind may go without progress (`stall_deadline.deadline`: a multiple of the recent calls' p99, at
least a floor, at most `ceiling_s`, failurePolicy.rolloutStallSeconds, which the supervisor sets); `open_call()`
is the open call, its age and its deadline. Callers: `engine.RolloutEngine` (wraps at start; its status and
/health report the deadline as `stallDeadlineS`), the rollout sidecar's supervisor
(`tandem.sidecars.rollout.supervisor`, which kills at it).
On CPU, where one step of a loaded machine can take long, the supervisor also counts the engine's processes
computing as progress (`progress`), so only an engine that neither returns nor computes (stopped, deadlocked)
stalls; on GPUs a hung kernel may spin a core, so there only returning calls count. A call's recorded duration
is its whole time (progress does not shorten it); a call that raised (a killed hang) is not recorded.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from tandem.sidecars.rollout_engine.stall_deadline import WINDOW, Deadline, deadline, warm_calls


class OpenCall(NamedTuple):
    what: str  # step, reload, add adapter
    stalled_s: float  # seconds since it opened or, on CPU, since the engine last showed progress
    deadline: Deadline  # how long it may go without progress


class StepWatch:
    def __init__(self, ceiling_s: float = 120.0) -> None:
        self.steps = 0  # calls into the engine that returned (or raised)
        self.ceiling_s = ceiling_s  # failurePolicy.rolloutStallSeconds: no deadline above it
        self._open: dict[int, tuple[str, float, float]] = {}  # thread id -> (what, start, last progress)
        self._seen: dict[str, deque[float]] = {}  # what -> durations of the last calls that returned
        self._fresh: dict[str, int] = {}  # what -> calls that returned since the engine (re)started
        self._lock = threading.Lock()

    def wrap(self, llm_engine: Any) -> None:
        """Time every `step()` of vLLM's `LLMEngine` (an attribute on that one object, so `LLM.generate`'s
        loop and ours go through it). Called at every start: the new engine's first calls are warm-up."""
        with self._lock:
            self._fresh.clear()
        step = llm_engine.step

        def timed_step(*args: Any, **kwargs: Any) -> Any:
            with self.busy("step"):
                return step(*args, **kwargs)

        llm_engine.step = timed_step

    @contextmanager
    def busy(self, what: str) -> Iterator[None]:
        me = threading.get_ident()
        now = time.monotonic()
        with self._lock:
            self._open[me] = (what, now, now)
        returned = False
        try:
            yield
            returned = True
        finally:
            with self._lock:
                opened = self._open.pop(me, None)
                self.steps += 1
                if returned and opened is not None:
                    n = self._fresh[what] = self._fresh.get(what, 0) + 1
                    if n > warm_calls(what):  # the first calls after a start pay one-time costs: not the pace
                        self._seen.setdefault(what, deque(maxlen=WINDOW)).append(time.monotonic() - opened[1])

    def progress(self) -> None:
        """Progress seen outside vLLM's calls returning (its processes computing: the supervisor, on CPU): the
        calls now open count as stalled from now on."""
        now = time.monotonic()
        with self._lock:
            for k, (what, start, _) in self._open.items():
                self._open[k] = (what, start, now)

    def durations(self, what: str) -> list[float]:
        """The recorded durations of the last calls of kind `what` that returned, oldest first."""
        with self._lock:
            return list(self._seen.get(what, ()))

    def deadline(self, what: str) -> Deadline:
        """How long an open call of kind `what` may go without progress now (`stall_deadline.deadline`; the
        ceiling while the engine's first calls of that kind since its start have not all returned)."""
        with self._lock:
            fresh = self._fresh.get(what, 0)
            seen = list(self._seen.get(what, ()))
        return deadline(what, seen, self.ceiling_s, warm=fresh > warm_calls(what))

    def open_call(self) -> OpenCall | None:
        """The call in progress nearest its deadline (or furthest past it), how long it has gone without
        progress, and that deadline; None when none is open."""
        with self._lock:
            opened = [(what, since) for what, _, since in self._open.values()]
        now = time.monotonic()
        calls = [OpenCall(what, now - since, self.deadline(what)) for what, since in opened]
        return max(calls, key=lambda c: c.stalled_s / c.deadline.seconds, default=None)

    def stalled(self) -> tuple[str, float] | None:
        """(what, seconds without progress) of the open call `open_call` names, or None when none is."""
        call = self.open_call()
        return None if call is None else (call.what, call.stalled_s)
