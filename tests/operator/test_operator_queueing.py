"""Pure tests of Kueue's contract as the operator keeps it: pod marks, Queued, preemption -> Suspended ->
re-admission, stable reasons with observedGeneration, the progress block (percent, rate, ETA) and
the /scale status fields."""

from __future__ import annotations

from typing import Any

import pytest
from test_operator_plan import observe
from wrappers import T0, JobWrapper, PodWrapper, StatusWrapper, pods

from tandem.operator.manifests import builders, kueue
from tandem.operator.policies import eta
from tandem.operator.policies.observe import PodState, pod_state
from tandem.operator.policies.plan import Plan, decide
from tandem.spec.progress import Progress
from tandem.spec.status import JobStatus, ProgressStatus

QUEUED = JobWrapper("demo").replicas(2).rollout_only(1).queue("gpu-team")


def step(job: JobWrapper, st: JobStatus, pod_list: list[PodState], **kw: Any) -> Plan:
    return decide(observe(job, st, pod_list, **kw))


def test_queued_job_pods_form_one_kueue_group_of_every_pod() -> None:
    built = builders.build_pods(QUEUED.job())
    assert len(built) == 3
    for pod in built:
        meta = pod["metadata"]
        assert meta["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-team"
        assert meta["labels"]["kueue.x-k8s.io/pod-group-name"] == "rlhfjob-demo"
        assert meta["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "3"
        assert "schedulingGates" not in pod["spec"]  # Kueue's webhook adds its gate, not the operator
    plain = builders.build_pod(JobWrapper("demo").job(), 0)
    assert not any(k.startswith("kueue.x-k8s.io/") for k in plain["metadata"]["labels"])
    assert "annotations" not in plain["metadata"]


def test_pod_state_reads_kueue_gate_and_stop_condition() -> None:
    pod = builders.build_pod(QUEUED.job(), 0)
    assert pod_state(pod) == PodWrapper("demo", 0, replicas=2).state()
    pod["spec"]["schedulingGates"] = [{"name": "other.example/gate"}, {"name": kueue.ADMISSION_GATE}]
    assert pod_state(pod).gated  # type: ignore[union-attr]
    pod["spec"]["schedulingGates"] = []
    pod["metadata"]["deletionTimestamp"] = "2026-11-22T12:00:00Z"
    pod["status"] = {"phase": "Running", "conditions": [
        {"type": "TerminationTarget", "status": "True", "reason": "WorkloadEvicted", "message": "Preempted by x"}]}
    got = pod_state(pod)
    assert got is not None and not got.gated and got.deleting
    assert got.stopped == "WorkloadEvicted: Preempted by x"


def test_gated_pods_make_the_job_queued_then_running_after_admission() -> None:
    gated = [PodWrapper("demo", i, replicas=2).gated().state() for i in range(3)]
    plan = step(QUEUED, StatusWrapper().phase("Pending").get(), gated)
    st = plan.status
    assert st.phase == "Queued" and plan.create == [] and plan.delete == []
    assert "pod group rlhfjob-demo (queue gpu-team): 3 of 3 pods gated" in st.message
    conds = {c.type: (c.status, c.reason) for c in st.conditions}
    assert conds["Queued"] == ("True", "AwaitingAdmission") and conds["Ready"] == ("False", "AwaitingAdmission")
    assert [(e.type, e.reason) for e in plan.events] == [("Normal", "Queued")]
    admitted = step(QUEUED, st, pods("demo", 3, replicas=2))
    assert admitted.status.phase == "Running" and admitted.status.restarts == 0
    assert {c.type: c.status for c in admitted.status.conditions}["Queued"] == "False"


def test_missing_pods_of_a_queued_job_are_created_so_kueue_sees_the_whole_group() -> None:
    plan = step(QUEUED, StatusWrapper().phase("Queued").get(), [PodWrapper("demo", 0, replicas=2).gated().state()])
    assert plan.create == [1, 2] and plan.status.phase == "Queued"


@pytest.mark.parametrize(
    ("pod_list", "why"),
    [
        ([PodWrapper("demo", i, replicas=2).generation(1, queued=True).running().stopped().state() for i in range(3)],
         "pod demo-0-g1 WorkloadEvicted: Preempted to accommodate a workload"),
        (pods("demo", 2, replicas=2, generation=1, queued=True), "pod demo-2-g1 deleted"),  # gone before a pass saw it
        ([*pods("demo", 2, replicas=2, generation=1, queued=True),
          PodWrapper("demo", 2, replicas=2).generation(1, queued=True).running().deleting().state()],
         "pod demo-2-g1 is being deleted"),
    ],
)
def test_preemption_suspends_without_counting_a_restart(pod_list: list[PodState], why: str) -> None:
    before = StatusWrapper().phase("Running").restarts(1).rollout_only(1).get()
    plan = step(QUEUED.failure_policy(max_restarts=1), before, pod_list)
    st = plan.status
    assert st.phase == "Suspended" and st.restarts == 1 and st.preemptions == 1
    assert plan.restart_generation == 2 and plan.create == []
    assert plan.delete == sorted(p.name for p in pod_list if not p.deleting)
    assert f"preempted by Kueue: {why}" in st.message and "wait for Kueue to admit" in st.message
    assert {c.type: (c.status, c.reason) for c in st.conditions}["Suspended"] == ("True", "Preempted")
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "Preempted"), ("Normal", "Suspended")]


def test_preempted_job_recreates_its_gang_once_then_resumes_after_readmission() -> None:
    evicted = [PodWrapper("demo", i, replicas=2).running().stopped().state() for i in range(3)]
    st = step(QUEUED, StatusWrapper().phase("Running").get(), evicted).status
    assert st.preemptions == 1

    # the old pods still terminate (Kueue's finalizer may keep them until it sees replacements): the
    # replacements of generation 1 have names of their own and are created now, once
    created = step(QUEUED, st, evicted)
    assert created.status.preemptions == 1 and created.create == [0, 1, 2] and created.restart_generation == 1
    assert created.status.phase == "Suspended" and created.events == []
    names = [builders.build_pod(QUEUED.job(), i, restart_generation=1)["metadata"]["name"] for i in range(3)]
    assert names == ["demo-0-g1", "demo-1-g1", "demo-2-g1"]

    held = [PodWrapper("demo", i, replicas=2).generation(1, queued=True).gated().state() for i in range(3)]
    again = step(QUEUED, created.status, [*evicted, *held])  # no second preemption, no second create
    assert again.status.preemptions == 1 and again.create == [] and again.events == []
    waiting = step(QUEUED, again.status, held)  # Kueue holds them: still Suspended, and Queued
    conds = {c.type: (c.status, c.reason) for c in waiting.status.conditions}
    assert waiting.status.phase == "Suspended" and waiting.create == []
    assert conds["Queued"] == ("True", "AwaitingAdmission") and conds["Suspended"] == ("True", "Preempted")

    resumed = step(QUEUED, waiting.status, pods("demo", 3, generation=1, replicas=2, queued=True))
    st = resumed.status
    assert st.phase == "Running" and st.restarts == 0 and st.preemptions == 1
    assert {c.type: c.status for c in st.conditions}["Suspended"] == "False"
    assert [(e.type, e.reason) for e in resumed.events] == [("Normal", "Running")]
    env = {e["name"]: e.get("value") for e in builders.build_pod(QUEUED.job(), 0, restart_generation=1)
           ["spec"]["containers"][0]["env"]}
    assert env["TANDEM_RESUME"] == "1" and env["TANDEM_RESTART_GENERATION"] == "1"


def test_failed_pod_of_a_queued_job_is_a_gang_restart_not_a_preemption() -> None:
    pod_list = [PodWrapper("demo", 0, replicas=2).running().state(),
                PodWrapper("demo", 1, replicas=2).failed("OOMKilled").state(),
                PodWrapper("demo", 2, replicas=2).running().state()]
    st = step(QUEUED, StatusWrapper().phase("Running").get(), pod_list).status
    assert st.phase == "Restarting" and st.restarts == 1 and st.preemptions == 0


def test_vanished_pod_of_an_unqueued_job_is_a_failure_or_a_replacement_not_a_preemption() -> None:
    job = JobWrapper("demo").replicas(2).rollout_only(1)
    running = StatusWrapper().phase("Running").rollout_only(1).get()
    hybrid_gone = [PodWrapper("demo", i, replicas=2).running().state() for i in (0, 2)]
    st = step(job, running, hybrid_gone).status
    assert st.phase == "Restarting" and st.preemptions == 0  # a hybrid pod: the gang restarts
    pool = step(job, running, pods("demo", 2, replicas=2))  # a rollout-only pod: replaced alone
    assert pool.status.phase == "Running" and pool.create == [2]
    assert (pool.status.preemptions, pool.status.restarts, pool.status.rollout_replacements) == (0, 0, 1)


def test_conditions_carry_observed_generation_and_stable_reasons() -> None:
    obs = observe(JobWrapper("demo"), StatusWrapper().phase("Running").get(), pods("demo", 1))
    obs = type(obs)(**{**obs.__dict__, "generation": 7})
    st = decide(obs).status
    assert st.observed_generation == 7 and all(c.observed_generation == 7 for c in st.conditions)
    done = Progress(phase="done", iteration=10, iterations=10)
    st = step(JobWrapper("demo"), st, pods("demo", 1), progress=done).status
    assert {c.type: c.reason for c in st.conditions}["Complete"] == "DriverDone"


def test_rollout_only_status_fields_for_scale() -> None:
    st = step(JobWrapper("demo").replicas(1).rollout_only(2), StatusWrapper().phase("Running").get(),
              pods("demo", 3, replicas=1)).status
    assert st.rollout_only_replicas == 2
    assert st.rollout_only_selector == "tandem.dev/job=demo,tandem.dev/role=rollout"


def record(iteration: int, at: float, phase: str = "train", total: int = 100) -> Progress:
    return Progress(phase=phase, iteration=iteration, iterations=total, updated_at=at)  # type: ignore[arg-type]


def test_progress_block_rate_and_eta_from_the_driver_clock() -> None:
    assert eta.progress_block(None, None, 0) is None
    first = eta.progress_block(None, record(10, 1000.0), 0)
    assert first is not None and first.percent == 10.0 and first.iterations_per_second is None
    assert (first.rate_since_iteration, first.rate_since_time) == (10, 1000.0)
    later = eta.progress_block(first, record(30, 1040.0), 0)  # 20 iterations in 40 s
    assert later is not None and later.iterations_per_second == 0.5 and later.eta_seconds == 140
    assert later.eta == "2m20s" and later.percent == 30.0
    assert eta.progress_block(later, None, 0) == later  # no record this pass: keep what was there


def test_progress_block_skips_startup_and_resamples_on_a_new_gang() -> None:
    starting = eta.progress_block(None, record(0, 1000.0, phase="starting"), 0)
    assert starting is not None and starting.rate_since_time == 0.0
    sampled = eta.progress_block(starting, record(0, 1300.0, phase="rollout"), 0)  # model load took 300 s
    assert sampled is not None and sampled.rate_since_time == 1300.0
    moving = eta.progress_block(sampled, record(10, 1400.0), 0)
    assert moving is not None and moving.iterations_per_second == 0.1 and moving.eta_seconds == 900
    restarted = eta.progress_block(moving, record(10, 5000.0, phase="rollout"), 1)  # gang restart: new sample
    assert restarted is not None and restarted.iterations_per_second is None and restarted.rate_since_time == 5000.0
    back = eta.progress_block(restarted, record(5, 5100.0), 1)  # resumed from an older copy
    assert back is not None and back.rate_since_iteration == 5 and back.iterations_per_second is None
    done = eta.progress_block(moving, record(100, 2000.0, phase="done"), 0)
    assert done is not None and done.percent == 100.0 and done.eta == "0s" and done.iterations_per_second == 0.1


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (59, "59s"), (60, "1m00s"), (3599, "59m59s"),
                                               (3900, "1h05m"), (86400 + 3 * 3600, "1d03h")])
def test_human_eta(seconds: int, text: str) -> None:
    assert eta.human(seconds) == text


def test_progress_block_in_status() -> None:
    st = step(JobWrapper("demo"), StatusWrapper().phase("Running").get(), pods("demo", 1),
              progress=record(25, 1000.0)).status
    assert st.progress == ProgressStatus(percent=25.0, rate_since_iteration=25, rate_since_time=1000.0)


def test_scaling_up_the_rollout_only_pool_adds_pods_without_a_gang_restart() -> None:
    job = JobWrapper("demo").replicas(1).rollout_only(3)
    before = StatusWrapper().phase("Running").rollout_only(1).get()
    plan = step(job, before, pods("demo", 2, replicas=1))
    st = plan.status
    assert plan.create == [2, 3] and plan.delete == [] and plan.restart_generation == 0
    assert st.phase == "Running" and st.restarts == 0 and plan.events == []
    assert st.message == "1 hybrid pods running; rollout-only pool 1/3"
    grown = step(job, st, [*pods("demo", 2, replicas=1), PodWrapper("demo", 2).running().state(),
                           PodWrapper("demo", 3).state()])
    assert grown.status.phase == "Running" and grown.create == [] and grown.status.rollout_only_replicas == 3
    assert grown.status.message.endswith("pool 2/3")
    failed_new = step(job, grown.status, [*pods("demo", 3, replicas=1), PodWrapper("demo", 3).failed().state()])
    st = failed_new.status  # a rollout-only pod that failed, new or not, is replaced alone
    assert st.phase == "Running" and failed_new.delete == ["demo-3"]
    assert (st.restarts, st.rollout_replacements) == (0, 1)


def test_scaling_down_deletes_the_highest_pods_and_keeps_training() -> None:
    job = JobWrapper("demo").replicas(1).rollout_only(1)
    plan = step(job, StatusWrapper().phase("Running").rollout_only(3).get(), pods("demo", 4, replicas=1))
    assert plan.delete == ["demo-2", "demo-3"] and plan.create == []
    assert plan.status.phase == "Running" and plan.status.restarts == 0
    leaving = [*pods("demo", 2, replicas=1), PodWrapper("demo", 2).running().deleting().state()]
    after = step(job, plan.status, leaving)
    assert after.status.phase == "Running" and after.delete == [] and after.status.rollout_only_replicas == 1


def test_a_queued_gang_restart_waits_for_old_containers_not_for_kueues_finalizer() -> None:
    st = StatusWrapper().restarts(1).restart_began(T0).get()
    job = QUEUED.failure_policy(max_restarts=3, backoff_seconds=0)
    ended = [PodWrapper("demo", i, replicas=2).failed().deleting().state() for i in range(3)]  # kept by a finalizer
    plan = step(job, st, ended)
    assert plan.create == [0, 1, 2] and plan.restart_generation == 1 and plan.status.phase == "Pending"
    still = [*ended[:2], PodWrapper("demo", 2, replicas=2).running().deleting().state()]  # containers still up
    assert step(job, st, still).create == []
