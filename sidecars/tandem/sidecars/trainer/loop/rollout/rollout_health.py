"""What makes a rollout unhealthy, as the driver's client sees it: typed errors and a progress watch.

Role: `RolloutClient` (rollout_client.py) drops an unhealthy rollout from its pool and re-sends what it had
not finished; any other error fails the call. Unhealthy is:
- `RolloutGone`: not reachable (connection refused or reset twice, a timeout): its pod was deleted or died;
- `RolloutHung`: a request open while the rollout makes no progress (`Watch`);
- `RolloutUnhealthy` itself: it answered that it cannot serve (5xx: its engine died or is restarting; 409:
  busy or in the wrong phase), or could not load or start what the driver asked (any error on a control
  call: /update, /start, /sleep, /wake_up, /terminate);
- `RolloutStale`: it answered with a weight version other than the one asked for.
A 4xx on /v1/generate or /v1/trajectories is an error in the request (a prompt too long, bad options) and
fails the call: every rollout would answer the same.

`Watch.watched` runs a request in a worker thread and, while it is open, reads the rollout's unauthenticated
GET /health every few seconds: its `stalledS` (how long its call into vLLM has gone without progress,
`StepWatch`) and `stallDeadlineS` (how long that call may: the rollout's deadline at the job's pace, a multiple
of the recent calls' p99 of that kind with a floor, the rollout engine's stall_deadline.py). A request is
abandoned (`RolloutHung`) when `stalledS` passes that deadline, never above failurePolicy.rolloutStallSeconds
(the driver's own ceiling, also the deadline of a rollout that reports none), or when /health has not answered
for the ceiling (the whole sidecar stopped or partitioned: nothing reports a pace then). So the deadline follows
progress: a long generation that keeps stepping is never cut, a hung one is dropped once it has gone without
progress for many of its recent steps' time. /health is read every quarter of the deadline (0.5-5 s). Caller:
rollout_client.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import httpx

from tandem.sidecars.rollout_engine.contract import Health

CONTROL = ("/update", "/start", "/dummy_start", "/sleep", "/wake_up", "/terminate")


class _QuietProbes(logging.Filter):
    """httpx logs every request at INFO: the /health probes of a long request would fill the trainer's log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "/health" not in record.getMessage()


logging.getLogger("httpx").addFilter(_QuietProbes())


class RolloutError(RuntimeError):
    """A rollout call failed in a way another rollout would not fix; the iteration fails."""


class RolloutUnhealthy(RolloutError):
    """This rollout cannot serve now: dropped from the pool, its work re-sent."""


class RolloutGone(RolloutUnhealthy):
    """The rollout could not be reached (connection refused or reset, timed out)."""


class RolloutHung(RolloutUnhealthy):
    """A request stayed open while the rollout made no progress."""


class RolloutStale(RolloutUnhealthy):
    """The rollout answered with another weight version than the one asked for."""


def classify(url: str, path: str, status: int, text: str) -> RolloutError:
    """The typed error of an HTTP error answer (see the module docstring)."""
    message = f"{url}: HTTP {status}: {text}"
    if status >= 500 or status == 409 or path in CONTROL:
        return RolloutUnhealthy(message)
    return RolloutError(message)


def deadline_of(health: Health | Mapping[str, Any], ceiling_s: float) -> tuple[float, str]:
    """(seconds, how it was derived) the open call of a rollout whose /health body is `health` may go without
    progress: the rollout's `stallDeadlineS`, capped at `ceiling_s` (failurePolicy.rolloutStallSeconds)."""
    h = health if isinstance(health, Health) else Health.model_validate(health)
    reported = h.stall_deadline_s
    if reported is not None and 0 < reported < ceiling_s:
        return float(reported), str(h.stall_deadline or "the rollout's")
    return ceiling_s, f"failurePolicy.rolloutStallSeconds {ceiling_s:.0f}"


class Watch:
    def __init__(self, stall_s: float, poll_s: float | None = None) -> None:
        self.stall_s = stall_s
        self.poll_s = poll_s if poll_s is not None else max(0.5, min(5.0, stall_s / 4))
        self._probe_http = httpx.Client(timeout=max(1.0, min(10.0, stall_s / 2)))
        # abandoned requests keep their thread until the rollout answers (or the HTTP timeout): room for many
        self._pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="rollout-call")

    def health(self, address: str) -> Health | None:
        """The rollout's /health body (200 or 503), or None when it does not answer (or not with one)."""
        try:
            r = self._probe_http.get(f"http://{address}/health")
            return Health.model_validate(r.json())
        except (httpx.HTTPError, ValueError):  # pydantic's ValidationError is a ValueError
            return None

    def watched(self, address: str, send: Callable[[], httpx.Response]) -> httpx.Response:
        """`send()`'s response; RolloutHung when the rollout stops making progress first."""
        fut = self._pool.submit(send)
        answered = time.monotonic()
        poll = self.poll_s
        while True:
            try:
                return fut.result(timeout=poll)
            except FutureTimeout:
                pass
            h = self.health(address)
            now = time.monotonic()
            if h is not None:
                answered = now
                stalled = h.stalled_s
                limit, why = deadline_of(h, self.stall_s)
                poll = max(0.5, min(self.poll_s, limit / 4))
                if stalled > limit:
                    raise RolloutHung(f"no progress for {stalled:.0f}s (its engine is hung; deadline {limit:.0f}s: "
                                      f"{why})")
            elif now - answered > self.stall_s:
                raise RolloutHung(f"its sidecar has not answered /health for {now - answered:.0f}s "
                                  f"(failurePolicy.rolloutStallSeconds {self.stall_s:.0f})")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._probe_http.close()
