"""The driver's side of a hang and a recovery (rollout_health.Watch, rollout_client.FaultCounts).

`Watch` drops a request whose rollout reports, on /health, a call gone without progress past the deadline the
rollout reports (`stallDeadlineS`), under the driver's own ceiling (failurePolicy.rolloutStallSeconds); a
rollout that reports none is judged by the ceiling. A real HTTP server on loopback stands for the sidecar (as in
tests/trainer/test_rollout_client.py). `FaultCounts` turns the engine figures of generation answers into the
iteration's `rollout_restarts` and `rollout_recovery_s`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from http_stand_in import JsonHandler, serve
from tandem.sidecars.trainer.loop.rollout.rollout_client import FaultCounts
from tandem.sidecars.trainer.loop.rollout.rollout_health import RolloutHung, Watch, deadline_of


class Sidecar:
    """/health answering `body`; POST /v1/generate held until `release` is set."""

    def __init__(self) -> None:
        self.body: dict[str, Any] = {"ok": True, "stalledS": 0.0}
        self.release = threading.Event()
        outer = self

        class Handler(JsonHandler):
            def do_GET(self) -> None:  # noqa: N802
                self.answer(outer.body)

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.release.wait(60)
                self.answer({"version": 1})

        self.server, self.address = serve(Handler)


@pytest.fixture
def sidecar() -> Iterator[Sidecar]:
    s = Sidecar()
    yield s
    s.release.set()
    s.server.shutdown()
    s.server.server_close()


def send(sidecar: Sidecar) -> Any:
    return lambda: httpx.post(f"http://{sidecar.address}/v1/generate", json={}, timeout=60)


def test_the_rollouts_deadline_drops_a_hung_call_long_before_the_ceiling(sidecar: Sidecar) -> None:
    sidecar.body = {"ok": True, "busy": "step", "stalledS": 7.2, "stallDeadlineS": 6.0,
                    "stallDeadline": "20x the p99 step of 0.30s; failurePolicy.rolloutStallSeconds 120 caps it"}
    watch = Watch(stall_s=120.0, poll_s=0.2)
    t = time.monotonic()
    try:
        with pytest.raises(RolloutHung) as hung:
            watch.watched(sidecar.address, send(sidecar))
    finally:
        watch.close()
    assert time.monotonic() - t < 30  # one look at /health, not 120 s
    assert str(hung.value) == ("no progress for 7s (its engine is hung; deadline 6s: 20x the p99 step of 0.30s; "
                               "failurePolicy.rolloutStallSeconds 120 caps it)")


def test_a_call_within_the_reported_deadline_is_waited_for(sidecar: Sidecar) -> None:
    sidecar.body = {"ok": True, "busy": "step", "stalledS": 4.0, "stallDeadlineS": 6.0, "stallDeadline": "x"}
    watch = Watch(stall_s=120.0, poll_s=0.2)
    looked = threading.Event()
    probe = watch.health

    def health(address: str) -> dict[str, Any] | None:
        out = probe(address)
        looked.set()
        return out

    watch.health = health  # type: ignore[method-assign]
    threading.Thread(target=lambda: looked.wait(30) and sidecar.release.set(), daemon=True).start()
    try:
        assert watch.watched(sidecar.address, send(sidecar)).json() == {"version": 1}
    finally:
        watch.close()
    assert looked.is_set()  # it read /health while the call was open, and let it run


def test_the_drivers_ceiling_caps_the_reported_deadline() -> None:
    assert deadline_of({"stallDeadlineS": 6.0, "stallDeadline": "20x"}, 120.0) == (6.0, "20x")
    assert deadline_of({"stallDeadlineS": 300.0}, 120.0) == (120.0, "failurePolicy.rolloutStallSeconds 120")
    assert deadline_of({"stalledS": 3.0}, 60.0) == (60.0, "failurePolicy.rolloutStallSeconds 60")  # none reported


def test_restarts_and_the_iterations_longest_recovery() -> None:
    faults = FaultCounts()
    faults.seen("a", {"restarts": 0, "recoveries": 0, "recovery_s": None})
    faults.seen("b", {"restarts": 2, "recoveries": 1, "recovery_s": 80.0})  # before this driver knew it
    faults.seen("c", {"version": 3})  # a rollout that does not report them
    first = faults.take()
    assert first["rollout_restarts"] == 2 and "rollout_recovery_s" not in first
    faults.seen("a", {"restarts": 1, "recoveries": 1, "recovery_s": 41.5})  # back from a restart: its first answer
    faults.seen("b", {"restarts": 3, "recoveries": 2, "recovery_s": 55.25})
    faults.seen("a", {"restarts": 1, "recoveries": 1, "recovery_s": 41.5})  # the same recovery, again: once
    second = faults.take()
    assert second["rollout_restarts"] == 4 and second["rollout_recovery_s"] == 55.25
    third = faults.take()
    assert third["rollout_restarts"] == 4  # restarts: so far
    assert "rollout_recovery_s" not in third  # recovery: this iteration's
