"""The rollout/trainer agreement in the job's status: mismatchKl, ess and stalenessMean from the driver's
progress record, and condition MismatchGuard (algorithm.mismatchGuard warned or paused) with its Event.
Pure: the operator's decision on observed state, no cluster."""

from __future__ import annotations

from test_operator_plan import observe
from wrappers import JobWrapper, StatusWrapper, pods

from tandem.operator.policies.plan import decide
from tandem.spec.progress import Progress
from tandem.spec.status import Condition

WARN = "algorithm.mismatchGuard: mismatch_kl 0.04 > 0.01 in 3 consecutive iterations (iterations 2-4); action warn"


def guard_condition(conditions: list[Condition]) -> Condition | None:
    return next((c for c in conditions if c.type == "MismatchGuard"), None)


def test_the_iterations_agreement_is_copied_into_the_status() -> None:
    record = Progress(phase="train", iteration=5, mismatch_kl=0.0012, ess=0.97, staleness_mean=0.5)
    got = decide(observe(JobWrapper(), StatusWrapper().phase("Running").get(), pods("demo", 1), record)).status
    assert (got.mismatch_kl, got.ess, got.staleness_mean) == (0.0012, 0.97, 0.5)
    assert guard_condition(got.conditions) is None  # the guard never fired: no condition at all
    dumped = got.model_dump(by_alias=True)
    assert dumped["mismatchKl"] == 0.0012 and dumped["stalenessMean"] == 0.5


def test_a_warning_then_a_pause_then_quiet_again() -> None:
    running = StatusWrapper().phase("Running").get()
    warned = decide(observe(JobWrapper(), running, pods("demo", 1), Progress(phase="rollout", iteration=5, guard=WARN)))
    cond = guard_condition(warned.status.conditions)
    assert cond is not None and (cond.status, cond.reason, cond.message) == ("True", "MismatchHigh", WARN)
    assert [(e.type, e.reason, e.message) for e in warned.events if e.reason == "MismatchHigh"] == [
        ("Warning", "MismatchHigh", WARN)]
    again = decide(observe(JobWrapper(), warned.status, pods("demo", 1),
                           Progress(phase="train", iteration=6, guard=WARN)))
    assert not [e for e in again.events if e.reason.startswith("Mismatch")]  # one Event while it lasts
    why = "paused: " + WARN.replace("warn", "pause") + "; the update was not published"
    paused = decide(observe(JobWrapper(), again.status, pods("demo", 1),
                            Progress(phase="paused", iteration=7, guard=WARN, message=why)))
    cond = guard_condition(paused.status.conditions)
    assert cond is not None and (cond.status, cond.reason, cond.message) == ("True", "MismatchPaused", why)
    assert [e.reason for e in paused.events if e.reason.startswith("Mismatch")] == ["MismatchPaused"]
    assert paused.status.phase == "Running"  # the pods stay (held by the paused driver) until spec.suspend
    quiet = decide(observe(JobWrapper(), paused.status, pods("demo", 1), Progress(phase="train", iteration=8)))
    cond = guard_condition(quiet.status.conditions)
    assert cond is not None and (cond.status, cond.reason) == ("False", "MismatchWithinThreshold")
