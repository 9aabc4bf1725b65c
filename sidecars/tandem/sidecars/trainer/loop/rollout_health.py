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
GET /health every few seconds: its `stalledS` (how long its call into vLLM has been open, `StepWatch`). A
request is abandoned (`RolloutHung`) when that passes failurePolicy.rolloutStallSeconds, or when /health has
not answered for as long (the whole sidecar stopped or partitioned). So the deadline follows progress: a long
generation that keeps stepping is never cut, a hung one is dropped in about stallSeconds. Caller:
rollout_client.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import httpx

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


class Watch:
    def __init__(self, stall_s: float, poll_s: float | None = None) -> None:
        self.stall_s = stall_s
        self.poll_s = poll_s if poll_s is not None else max(0.5, min(5.0, stall_s / 4))
        self._probe_http = httpx.Client(timeout=max(1.0, min(10.0, stall_s / 2)))
        # abandoned requests keep their thread until the rollout answers (or the HTTP timeout): room for many
        self._pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="rollout-call")

    def health(self, address: str) -> dict[str, Any] | None:
        """The rollout's /health body (200 or 503), or None when it does not answer."""
        try:
            r = self._probe_http.get(f"http://{address}/health")
            out: dict[str, Any] = r.json()
            return out
        except (httpx.HTTPError, ValueError):
            return None

    def watched(self, address: str, send: Callable[[], httpx.Response]) -> httpx.Response:
        """`send()`'s response; RolloutHung when the rollout stops making progress first."""
        fut = self._pool.submit(send)
        answered = time.monotonic()
        while True:
            try:
                return fut.result(timeout=self.poll_s)
            except FutureTimeout:
                pass
            h = self.health(address)
            now = time.monotonic()
            if h is not None:
                answered = now
                stalled = float(h.get("stalledS") or 0.0)
                if stalled > self.stall_s:
                    raise RolloutHung(f"no progress for {stalled:.0f}s (its engine is hung; failurePolicy."
                                      f"rolloutStallSeconds {self.stall_s:.0f})")
            elif now - answered > self.stall_s:
                raise RolloutHung(f"its sidecar has not answered /health for {now - answered:.0f}s "
                                  f"(failurePolicy.rolloutStallSeconds {self.stall_s:.0f})")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._probe_http.close()
