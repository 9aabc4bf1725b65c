"""Table-driven tests of the stuck-gang policy (`tandem.operator.policies.stuck_policy`): what a pod's status
says (`observe.pod_state`), which issues and verdicts follow from failurePolicy and the clock, and
what the reconcile decision makes of them (condition ContainersWaiting, status.reason, Events, gang
restart or failure with every pod deleted). The same on the real control plane: test_operator_stuck.py.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from test_operator_plan import observe
from wrappers import T0, JobWrapper, PodWrapper, StatusWrapper, later

from tandem.operator.policies import job_status, stuck_policy
from tandem.operator.policies.observe import ContainerIssue, PodState, pod_state
from tandem.operator.policies.plan import decide
from tandem.spec.load import SpecError, parse_job
from tandem.spec.models import FailurePolicy

POLICY = FailurePolicy(max_container_restarts=3, waiting_timeout_seconds=60, scheduling_timeout_seconds=120)


def raw_pod(**status: Any) -> dict[str, Any]:
    labels = {"tandem.dev/job": "demo", "tandem.dev/index": "0", "tandem.dev/role": "hybrid",
              "tandem.dev/restart-generation": "0"}
    return {"metadata": {"name": "demo-0", "labels": labels}, "status": status}


def waiting(name: str, reason: str, message: str = "", restarts: int = 0) -> dict[str, Any]:
    return {"name": name, "restartCount": restarts, "state": {"waiting": {"reason": reason, "message": message}}}


@pytest.mark.parametrize(
    ("status_", "issues", "unschedulable"),
    [
        ({"phase": "Running", "containerStatuses": [{"name": "trainer", "restartCount": 0,
                                                     "state": {"running": {}}}]}, (), ""),
        ({"phase": "Pending", "initContainerStatuses": [waiting("rollout", "ImagePullBackOff", "no such image")]},
         (ContainerIssue("rollout", "ImagePullBackOff", "no such image", 0),), ""),
        ({"phase": "Running", "containerStatuses": [waiting("trainer", "CrashLoopBackOff", "back-off 40s", 4)]},
         (ContainerIssue("trainer", "CrashLoopBackOff", "back-off 40s", 4),), ""),
        ({"phase": "Pending", "containerStatuses": [waiting("trainer", "ContainerCreating")]}, (), ""),
        ({"phase": "Running", "containerStatuses": [{"name": "trainer", "restartCount": 2, "state": {"running": {}}}]},
         (ContainerIssue("trainer", "", "", 2),), ""),
        ({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                              "message": "0/4 nodes", "lastTransitionTime": "2026-11-22T12:00:00Z"}]},
         (), "0/4 nodes"),
        ({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                              "reason": "SchedulingGated"}]}, (), ""),
    ],
    ids=["running", "image-pull-sidecar", "crash-loop", "creating", "restarted", "unschedulable", "gated"],
)
def test_pod_state_keeps_stuck_containers_and_unschedulable(
    status_: dict[str, Any], issues: tuple[ContainerIssue, ...], unschedulable: str
) -> None:
    state = pod_state(raw_pod(**status_))
    assert state is not None and state.issues == issues and state.unschedulable == unschedulable


def gang(*pods: PodWrapper) -> list[PodState]:
    return [p.state() for p in pods]


P0, P1 = (lambda: PodWrapper("demo", 0, replicas=2)), (lambda: PodWrapper("demo", 1, replicas=2))


@pytest.mark.parametrize(
    ("pod_list", "since", "now", "reason"),
    [
        (gang(P0().running(), P1().running()), None, later(999), None),
        (gang(P0().running(), P1().running().waiting("CrashLoopBackOff", restarts=2)), None, T0, None),
        (gang(P0().running(), P1().running().waiting("CrashLoopBackOff", restarts=3)), None, T0,
         "ContainerRestartLimit"),
        (gang(P0().running().waiting("", "trainer", restarts=3), P1().running()), None, T0, "ContainerRestartLimit"),
        (gang(P0().waiting("ImagePullBackOff"), P1().running()), T0, later(59), None),
        (gang(P0().waiting("ImagePullBackOff"), P1().running()), T0, later(60), "WaitingTimeout"),
        (gang(P0().waiting("ErrImagePull"), P1().running()), None, later(600), None),  # condition not set yet
        (gang(P0().waiting("CreateContainerConfigError", "trainer"), P1().running()), T0, later(61), "WaitingTimeout"),
        (gang(P0().waiting("InvalidImageName"), P1().running()), T0, later(61), "WaitingTimeout"),
        (gang(P0().running().waiting("CrashLoopBackOff", restarts=1), P1().running()), T0, later(61), None),
        (gang(P0().running(), P1().unschedulable(T0)), None, later(119), None),
        (gang(P0().running(), P1().unschedulable(T0)), None, later(120), "SchedulingTimeout"),
        (gang(P0().running(), P1().unschedulable(T0).deleting()), None, later(999), None),
        (gang(P0().running(), P1().unschedulable(T0).generation(1)), None, later(999), None),  # an older gang's
    ],
    ids=["healthy", "crash-under-limit", "crash-at-limit", "restarted-at-limit", "image-under-timeout",
         "image-at-timeout", "image-no-since", "config-error", "invalid-image", "crash-not-a-wait",
         "unschedulable-under", "unschedulable-at", "unschedulable-deleting", "other-generation"],
)
def test_verdicts(pod_list: list[PodState], since: datetime | None, now: datetime, reason: str | None) -> None:
    got = stuck_policy.verdict(pod_list, 0, POLICY, waiting_since=since, now=now)
    assert (got.reason if got else None) == reason


def test_timeouts_of_zero_wait_forever() -> None:
    never = FailurePolicy(waiting_timeout_seconds=0, scheduling_timeout_seconds=0)
    pod_list = gang(P0().waiting("ImagePullBackOff"), P1().unschedulable(T0))
    assert stuck_policy.verdict(pod_list, 0, never, waiting_since=T0, now=later(86_400 * 30)) is None


@pytest.mark.parametrize(
    ("action", "restarts", "limit", "decision"),
    [("RestartJob", 0, 3, "restart"), ("RestartJob", 3, 3, "fail"), ("FailJob", 0, 3, "fail")],
)
def test_on_verdict(action: str, restarts: int, limit: int, decision: str) -> None:
    assert stuck_policy.on_verdict(action, restarts, limit) == decision


def test_issue_message_is_bounded_and_names_pod_and_container() -> None:
    issue = stuck_policy.Issue("demo-0", "rollout", "ImagePullBackOff", "x" * 1000)
    text = issue.describe()
    assert text.startswith("pod demo-0 container rollout ImagePullBackOff: x") and len(text) < 400


@pytest.mark.parametrize(
    ("field", "value"),
    [("maxContainerRestarts", 0), ("waitingTimeoutSeconds", -1), ("schedulingTimeoutSeconds", 86_401),
     ("action", "Ignore")],
)
def test_failure_policy_is_validated_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(SpecError, match=f"spec.failurePolicy.{field}"):
        parse_job(JobWrapper().set(f"failurePolicy.{field}", value).obj())


# ---- what the reconcile decision makes of it -------------------------------------------------------------

def two(policy: dict[str, Any] | None = None) -> JobWrapper:
    return JobWrapper().replicas(2).set("failurePolicy", {"maxRestarts": 1, **(policy or {})})


def test_a_waiting_sidecar_shows_in_reason_message_condition_and_one_event() -> None:
    pod_list = gang(P0().waiting("ErrImagePull", message="pull access denied"), P1().running())
    plan = decide(observe(two(), StatusWrapper().phase("Pending").get(), pod_list))
    st = plan.status
    assert st.phase == "Pending" and st.reason == "ErrImagePull"
    assert st.message.endswith("pod demo-0 container rollout ErrImagePull: pull access denied")
    cond = job_status.condition(st, job_status.CONTAINERS_WAITING)
    assert cond is not None and (cond.status, cond.reason) == ("True", "ErrImagePull")
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "ErrImagePull")]
    # the kubelet alternates ErrImagePull and ImagePullBackOff: one state, no new Event, the clock keeps running
    pod_list = gang(P0().waiting("ImagePullBackOff", message="Back-off pulling"), P1().running())
    again = decide(observe(two(), st, pod_list, now=later(30)))
    assert again.status.reason == "ImagePullBackOff" and again.events == []
    assert job_status.waiting_since(again.status) == T0
    # it pulls at last: the condition goes False, the reason is the phase's own
    healed = decide(observe(two(), again.status, gang(P0().running(), P1().running()), now=later(40)))
    assert healed.status.phase == "Running" and healed.status.reason == "PodsRunning"
    assert job_status.waiting_since(healed.status) is None


def test_waiting_past_the_timeout_restarts_the_gang_and_deletes_every_pod() -> None:
    pod_list = gang(P0().waiting("ImagePullBackOff", message="no such image"), P1().running())
    first = decide(observe(two({"waitingTimeoutSeconds": 60}), StatusWrapper().phase("Pending").get(), pod_list))
    plan = decide(observe(two({"waitingTimeoutSeconds": 60}), first.status, pod_list, now=later(60)))
    assert plan.status.phase == "Restarting" and plan.status.restarts == 1
    assert plan.status.reason == "WaitingTimeout" and plan.delete == ["demo-0", "demo-1"] and plan.create == []
    assert "failurePolicy.waitingTimeoutSeconds" in plan.status.message
    # the next gang waits as well: maxRestarts (1) is spent, the job fails and keeps no pod
    nxt = [p.generation(1) for p in (P0().waiting("ImagePullBackOff"), P1().running())]
    st = plan.status.model_copy(deep=True)
    st.phase = "Pending"
    second = decide(observe(two({"waitingTimeoutSeconds": 60}), st, [p.state() for p in nxt], now=later(100)))
    final = decide(observe(two({"waitingTimeoutSeconds": 60}), second.status, [p.state() for p in nxt],
                           now=later(200)))
    assert final.status.phase == "Failed" and final.status.reason == "WaitingTimeout"
    assert "maxRestarts (1) reached" in final.status.message and final.delete == ["demo-0", "demo-1"]


def test_crash_loop_with_action_failjob_fails_at_once() -> None:
    pod_list = gang(P0().running().waiting("CrashLoopBackOff", message="back-off 5m0s", restarts=5), P1().running())
    plan = decide(observe(two({"action": "FailJob"}), StatusWrapper().phase("Running").get(), pod_list))
    assert plan.status.phase == "Failed" and plan.status.reason == "ContainerRestartLimit"
    assert plan.status.restarts == 0 and plan.delete == ["demo-0", "demo-1"]
    assert "restarted 5 times (failurePolicy.maxContainerRestarts 5)" in plan.status.message
    assert "failurePolicy.action FailJob" in plan.status.message


def test_unschedulable_pod_shows_then_times_out() -> None:
    pod_list = gang(P0().running(), P1().unschedulable(T0, "0/4 nodes are available: Insufficient nvidia.com/gpu"))
    plan = decide(observe(two(), StatusWrapper().phase("Pending").get(), pod_list, now=later(10)))
    assert plan.status.reason == "Unschedulable" and "Insufficient nvidia.com/gpu" in plan.status.message
    assert job_status.condition(plan.status, job_status.CONTAINERS_WAITING) is None  # no container waits
    late = decide(observe(two(), plan.status, pod_list, now=later(600)))
    assert late.status.phase == "Restarting" and late.status.reason == "SchedulingTimeout"
    assert late.delete == ["demo-0", "demo-1"]
