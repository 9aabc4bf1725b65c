"""Leader election's decisions (`tandem.operator.policies.lease_policy`), case by case: who creates, renews,
takes or waits, judged on this replica's own clock, and what each write puts in the Lease."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from tandem.operator.policies.lease_policy import Action, Observed, Record, decide, lease_spec, released

ME, OTHER = "op-a_1", "op-b_2"


def lease(holder: str, renew: str = "2026-01-01T00:00:00.000000Z", rv: str = "7", duration: int = 15,
          transitions: int = 3) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": rv},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration, "renewTime": renew,
                     "leaseTransitions": transitions}}


def seen(*reads: tuple[dict[str, Any] | None, float]) -> Observed:
    obs = Observed()
    for body, at in reads:
        obs.see(Record.of(body), at)
    return obs


@pytest.mark.parametrize(("reads", "now", "want"), [
    ([(None, 0.0)], 0.0, Action.CREATE),
    ([(lease(ME), 0.0)], 100.0, Action.RENEW),  # ours, however old
    ([(lease(""), 0.0)], 0.0, Action.TAKE),  # released on a clean stop: no waiting
    ([(lease(OTHER), 0.0)], 14.9, Action.WAIT),
    ([(lease(OTHER), 0.0)], 15.0, Action.TAKE),  # unchanged for a whole lease duration
    # the holder renewed at 10 s (new renewTime and resourceVersion): its 15 s count from then
    ([(lease(OTHER), 0.0), (lease(OTHER, renew="2026-01-01T00:00:10.000000Z", rv="8"), 10.0)], 20.0, Action.WAIT),
    ([(lease(OTHER), 0.0), (lease(OTHER, renew="2026-01-01T00:00:10.000000Z", rv="8"), 10.0)], 25.0, Action.TAKE),
    # the same record read again does not restart the count
    ([(lease(OTHER), 0.0), (lease(OTHER), 10.0)], 15.0, Action.TAKE),
    # a renewTime far in the future (a skewed clock) buys nothing: only changes seen here count
    ([(lease(OTHER, renew="2099-01-01T00:00:00.000000Z"), 0.0)], 15.0, Action.TAKE),
    ([(lease(OTHER, duration=0), 0.0)], 0.5, Action.WAIT),  # a zero duration still waits a second
])
def test_decide(reads: list[tuple[dict[str, Any] | None, float]], now: float, want: Action) -> None:
    assert decide(seen(*reads), ME, now) is want


NOW = datetime(2026, 11, 25, 12, 0, 0, 123456, tzinfo=UTC)


def test_what_each_write_puts_in_the_lease() -> None:
    theirs = Record.of(lease(OTHER, transitions=3))
    assert theirs is not None and theirs.resource_version == "7"
    created = lease_spec(Action.CREATE, None, ME, 15, NOW)
    assert created == {"holderIdentity": ME, "leaseDurationSeconds": 15, "acquireTime": "2026-11-25T12:00:00.123456Z",
                       "renewTime": "2026-11-25T12:00:00.123456Z", "leaseTransitions": 0}
    taken = lease_spec(Action.TAKE, theirs, ME, 15, NOW)
    assert taken["holderIdentity"] == ME and taken["leaseTransitions"] == 4 and "acquireTime" in taken
    mine = Record.of(lease(ME, transitions=4))
    renewed = lease_spec(Action.RENEW, mine, ME, 15, NOW)
    assert renewed["leaseTransitions"] == 4 and "acquireTime" not in renewed  # acquireTime stays as it was
    assert mine is not None
    gone = released(mine, NOW)
    assert gone["holderIdentity"] == "" and gone["leaseDurationSeconds"] == 1 and gone["leaseTransitions"] == 4
