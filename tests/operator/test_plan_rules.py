"""The reconcile decision's table of rules (`plan.RULES`): its order is the one the module documents, and every
rule is reached by some observed state."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from test_operator_plan import observe
from wrappers import T0, JobWrapper, PodWrapper, StatusWrapper, later, pods

from tandem.operator.policies import plan as plan_module
from tandem.operator.policies.plan import Plan, decide
from tandem.spec.progress import Progress
from tandem.spec.status import JobStatus

QUEUED = JobWrapper("demo").replicas(2).rollout_only(1).queue("gpu-team")


def documented() -> list[tuple[str, bool]]:
    """The rules the module docstring lists, in its order, each with whether it is marked (+) (goes on)."""
    doc = plan_module.__doc__ or ""
    table = doc.split("always holds.\n\n", 1)[1].split("\n\n", 1)[0]
    rows = [re.match(r"^  ([a-z_]+)( \(\+\))?\s", line) for line in table.splitlines()]
    return [(m.group(1), bool(m.group(2))) for m in rows if m]


def test_the_table_is_in_the_documented_order() -> None:
    assert [(r.name, r.goes_on) for r in plan_module.RULES] == documented()
    assert not plan_module.RULES[-1].goes_on  # the last rule always holds: every pass ends in a decision


def running() -> JobStatus:
    return StatusWrapper().phase("Running").get()


def invalid_spec() -> Plan:
    return decide(observe(JobWrapper("x" * 60)))


def new_job() -> Plan:  # report, sweep, replace_alone and create_missing go on; waiting decides
    return decide(observe(JobWrapper().replicas(2)))


def finished() -> Plan:
    return decide(observe(JobWrapper(), StatusWrapper().phase("Succeeded").get(), pods("demo", 1)))


def succeeded() -> Plan:
    return decide(observe(JobWrapper(), running(), pods("demo", 1), Progress(phase="done", iteration=200)))


def driver_failed() -> Plan:
    return decide(observe(JobWrapper(), running(), pods("demo", 1), Progress(phase="failed", message="nan loss")))


def suspended() -> Plan:
    return decide(observe(JobWrapper().suspend(), running(), pods("demo", 1)))


def restarting() -> Plan:
    st = StatusWrapper().restarts(1).restart_began(T0).get()
    return decide(observe(JobWrapper().replicas(2).failure_policy(3, 10), st, [], now=later(5)))


def preempted() -> Plan:
    evicted = [PodWrapper("demo", i, replicas=2).running().stopped().state() for i in range(3)]
    return decide(observe(QUEUED, running(), evicted))


def refused() -> Plan:
    return decide(observe(JobWrapper().replicas(2), running(), [PodWrapper("demo", 0, replicas=2).running().state(),
                                                                PodWrapper("demo", 1, replicas=2).refused().state()]))


def pod_failed() -> Plan:
    return decide(observe(JobWrapper().replicas(2).failure_policy(3), running(),
                          [PodWrapper("demo", 0, replicas=2).running().state(),
                           PodWrapper("demo", 1, replicas=2).failed().state()]))


def pool_lost() -> Plan:
    """A pool losing more pods within the hour than `pool_policy.bound` lets it replace (1 x 2 here)."""
    job = JobWrapper().replicas(1).rollout_only(2).set("failurePolicy", {"maxRestarts": 1})

    def pod(i: int, uid: str = "") -> PodWrapper:
        return PodWrapper("demo", i, replicas=1).uid(uid or f"uid-{i}")

    healthy = [pod(i).running().state() for i in range(3)]
    st = StatusWrapper().phase("Running").rollout_only(2).get()
    for i, uid in enumerate(("a", "b")):
        st = decide(observe(job, st, healthy[:2] + [pod(2, uid).failed().state()], now=later(60 * i))).status
        st = decide(observe(job, st.model_copy(deep=True), healthy)).status
    return decide(observe(job, st, healthy[:2] + [pod(2, "c").failed().state()], now=later(120)))


def stuck() -> Plan:
    looping = PodWrapper("demo", 0, replicas=2).running().waiting("CrashLoopBackOff", message="back-off", restarts=5)
    job = JobWrapper().replicas(2).set("failurePolicy", {"maxRestarts": 1, "action": "FailJob"})
    return decide(observe(job, running(), [looping.state(), PodWrapper("demo", 1, replicas=2).running().state()]))


def all_running() -> Plan:
    return decide(observe(JobWrapper().replicas(2), StatusWrapper().phase("Pending").get(), pods("demo", 2)))


def requeued() -> Plan:
    evicted = [PodWrapper("demo", i, replicas=2).running().stopped().state() for i in range(3)]
    st = preempted().status
    held = [PodWrapper("demo", i, replicas=2).generation(1, queued=True).gated().state() for i in range(3)]
    return decide(observe(QUEUED, decide(observe(QUEUED, st, [*evicted, *held])).status, held))


REACHED_BY: dict[str, Callable[[], Plan]] = {
    "invalid_spec": invalid_spec,
    "report": new_job,
    "finished": finished,
    "succeeded": succeeded,
    "driver_failed": driver_failed,
    "suspended": suspended,
    "sweep": new_job,
    "restarting": restarting,
    "preempted": preempted,
    "refused": refused,
    "pod_failed": pod_failed,
    "pool_lost": pool_lost,
    "replace_alone": new_job,
    "stuck": stuck,
    "create_missing": new_job,
    "running": all_running,
    "requeued": requeued,
    "waiting": new_job,
}


def test_every_rule_has_a_state_that_reaches_it() -> None:
    assert sorted(REACHED_BY) == sorted(r.name for r in plan_module.RULES)


@pytest.mark.parametrize("rule", plan_module.RULES, ids=lambda r: r.name)
def test_the_rule_is_reachable(rule: plan_module.Rule) -> None:
    plan = REACHED_BY[rule.name]()
    assert rule.name in plan.rules
    if not rule.goes_on:  # it decided: the pass ended there
        assert plan.rules[-1] == rule.name
    order = [r.name for r in plan_module.RULES]  # what applied, applied in the table's order
    assert plan.rules == sorted(plan.rules, key=order.index)


def test_a_new_job_goes_through_every_rule_that_goes_on() -> None:
    assert new_job().rules == ["report", "sweep", "replace_alone", "create_missing", "waiting"]
    assert invalid_spec().rules == ["invalid_spec"]
