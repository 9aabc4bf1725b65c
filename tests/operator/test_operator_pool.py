"""Table tests of the rollout-only pool policy through the pure reconcile decision: a lost rollout-only
pod is replaced alone (counted once, an Event, the job still Running), a hybrid pod's failure still
restarts the gang but keeps the running rollout-only pods (relabelled into the new generation), a
refusal still fails the job, a crash-looping pool is a stuck verdict, Kueue-queued jobs keep the gang
behaviour, and a job without durable copies says at creation what a restart costs. A pool pod lost before
the status says Running counts too, even one no pass saw (the pass remembers the pods it created, and asks
the API when one of them is missing from the pod index).
On the real control plane: a rollout-only pod marked Failed as the kubelet would, then one deleted, each
come back alone (restarts 0, the other pods keep their UIDs, an Event, the counter), and a hybrid pod's
failure restarts the gang: a new hybrid pod, the rollout-only pods kept (same UIDs, the new generation)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import datetime
from typing import Any

import pytest
from controlplane import ControlPlane
from fakes import RecordingKube
from harness import OperatorProcess, wait_for
from test_operator_cluster import create, events_of, fail_pod, phase_is, pods_of, running, small
from test_operator_plan import observe
from wrappers import T0, JobWrapper, PodWrapper, StatusWrapper, later

from tandem.operator.cluster.kube import KubeError
from tandem.operator.policies import job_status, pool_policy
from tandem.operator.policies.observe import PodState
from tandem.operator.policies.plan import Plan, decide
from tandem.operator.runtime import reconcile
from tandem.spec.status import JobStatus


def pool_job(max_restarts: int = 3, action: str = "RestartJob") -> JobWrapper:
    """One hybrid pod (demo-0) and a rollout-only pool of two (demo-1, demo-2)."""
    return JobWrapper().replicas(1).rollout_only(2).set("failurePolicy", {"maxRestarts": max_restarts,
                                                                          "action": action})


def pod(i: int, uid: str = "") -> PodWrapper:
    return PodWrapper("demo", i, replicas=1).uid(uid or f"uid-{i}")


def healthy() -> list[PodState]:
    return [pod(i).running().state() for i in range(3)]


def running_status() -> JobStatus:
    return StatusWrapper().phase("Running").rollout_only(2).get()


def step(pod_list: list[PodState], st: JobStatus | None = None, *, job: JobWrapper | None = None,
         now: datetime = T0, created: dict[str, int] | None = None) -> Plan:
    obs = observe(job or pool_job(), st if st is not None else running_status(), pod_list, now=now)
    return decide(replace(obs, created=created) if created else obs)


def events(plan: Plan, reason: str = pool_policy.REPLACED) -> list[str]:
    return [e.message for e in plan.events if e.reason == reason and e.type == "Warning"]


@pytest.mark.parametrize(("lost", "cause", "delete", "create"), [
    (pod(2).failed("OOMKilled"), "failed (OOMKilled)", ["demo-2"], []),
    (pod(2).failed("Evicted"), "evicted", ["demo-2"], []),  # the kubelet's eviction (node pressure)
    (pod(2).running().deleting(), "is being deleted", [], []),  # a drain, a reclaimed spot node
    (None, "disappeared", [], [2]),  # gone before a pass saw it go
])
def test_a_lost_rollout_only_pod_is_replaced_alone(
    lost: PodWrapper | None, cause: str, delete: list[str], create: list[int]
) -> None:
    pod_list = healthy()[:2] + ([lost.state()] if lost else [])
    plan = step(pod_list)
    st = plan.status
    assert plan.delete == delete and plan.create == create  # demo-0 and demo-1 untouched
    assert st.restarts == 0 and st.rollout_replacements == 1 and plan.restart_generation == 0
    assert events(plan) == [f"rollout-only pod demo-2 {cause}: replacing it alone, no gang restart "
                            "(1 replaced so far)"]
    assert st.phase == "Running" and st.reason == pool_policy.SHORT
    assert st.message == "1 hybrid pods running; rollout-only pool 1/2 (replacing demo-2)"
    assert st.rollout_pool is not None and [(r.pod, r.generation) for r in st.rollout_pool.replacing] == [("demo-2", 0)]
    assert not any(e.reason == "Restarting" for e in plan.events)


def test_each_lost_pod_is_counted_once_across_passes_until_its_replacement_runs() -> None:
    failed = pod(2).failed("Evicted")
    first = step(healthy()[:2] + [failed.state()])
    assert first.status.rollout_replacements == 1 and first.delete == ["demo-2"]
    passes = [
        (healthy()[:2] + [failed.state()], ["demo-2"], []),  # a pod index that lags: deleted again, not counted
        (healthy()[:2] + [pod(2).failed("Evicted").deleting().state()], [], []),  # going
        (healthy()[:2], [], [2]),  # gone: its name is free, so it is created again, same generation
        (healthy()[:2] + [pod(2, "uid-2b").phase("Pending").state()], [], []),  # the replacement
    ]
    st = first.status
    for pod_list, delete, make in passes:
        plan = step(pod_list, st)
        assert (plan.delete, plan.create, events(plan)) == (delete, make, [])
        assert plan.status.rollout_replacements == 1 and plan.status.restarts == 0
        assert plan.status.phase == "Running"
        st = plan.status
    assert pool_policy.replacing(st.rollout_pool) == []  # the replacement exists: the record is closed
    back = step(healthy()[:2] + [pod(2, "uid-2b").running().state()], st)
    assert (back.status.reason, back.status.message) == ("PodsRunning", "3 pods running")
    again = step(healthy()[:2] + [pod(2, "uid-2b").failed().state()], back.status, now=later(60))
    assert again.status.rollout_replacements == 2 and events(again)  # the replacement's own loss counts


def test_a_missing_pod_is_counted_once_even_while_its_create_is_refused() -> None:
    first = step(healthy()[:2])
    assert first.create == [2] and first.status.rollout_replacements == 1
    second = step(healthy()[:2], first.status.model_copy(update={"rollout_only_replicas": 2}))  # still known
    assert second.create == [2] and second.status.rollout_replacements == 1 and events(second) == []


def test_a_pool_pod_failing_before_the_job_runs_is_replaced_alone_too() -> None:
    pod_list = [pod(0).running().state(), pod(1).phase("Pending").state(), pod(2).failed().state()]
    plan = step(pod_list, StatusWrapper().phase("Pending").get())
    assert plan.status.phase == "Pending" and plan.status.restarts == 0 and plan.delete == ["demo-2"]
    assert plan.status.rollout_replacements == 1


@pytest.mark.parametrize(("created", "counted"), [
    ({"demo-0": 0, "demo-1": 0, "demo-2": 0}, 1),  # this operator created demo-2: it existed, it is gone
    ({"demo-0": 0, "demo-1": 0}, 0),  # never created, never seen: only missing
    ({"demo-0": 0, "demo-1": 0, "demo-2": 1}, 0),  # created in another gang generation
])
def test_a_pool_pod_that_ran_and_went_before_any_pass_saw_it_is_counted(
    created: dict[str, int], counted: int
) -> None:
    """The spot-pool race: the pods ran and the rollout-only one was evicted between two passes, while the
    status still said Pending with no pool seen (rolloutOnlyReplicas 0: the pod index lagged the creates)."""
    seen_nothing = StatusWrapper().phase("Pending").rollout_only(0).get()
    plan = step(healthy()[:2], seen_nothing, created=created)
    assert plan.create == [2] and plan.delete == [] and plan.status.restarts == 0
    assert plan.status.rollout_replacements == counted and plan.status.phase == "Pending"
    if counted:
        assert events(plan) == ["rollout-only pod demo-2 disappeared: replacing it alone, no gang restart "
                                "(1 replaced so far)"]
        back = step(healthy()[:2] + [pod(2, "uid-2b").running().state()], plan.status, created=created)
        assert (back.status.phase, back.status.message, back.status.rollout_replacements) == (
            "Running", "3 pods running", 1)
        assert pool_policy.replacing(back.status.rollout_pool) == [] and events(back) == []
    else:
        assert events(plan) == [] and plan.status.rollout_pool is None


def test_a_known_pool_pod_evicted_before_the_status_says_running_is_counted() -> None:
    """The Eviction API (a drain, a reclaimed spot node) deletes the pod: a loss whatever the job's phase,
    as the kubelet's eviction (phase Failed, reason Evicted) is."""
    pending = StatusWrapper().phase("Pending").rollout_only(2).get()  # the last pass saw the pool, not yet all running
    plan = step(healthy()[:2] + [pod(2).running().deleting().state()], pending)
    assert plan.status.rollout_replacements == 1 and plan.delete == [] and plan.create == []
    assert events(plan) == ["rollout-only pod demo-2 is being deleted: replacing it alone, no gang restart "
                            "(1 replaced so far)"]
    gone = step(healthy()[:2], plan.status.model_copy(update={"rollout_only_replicas": 1}))
    assert gone.create == [2] and gone.status.rollout_replacements == 1 and events(gone) == []  # counted once


def test_a_hybrid_pods_failure_restarts_the_gang_and_keeps_its_running_pool() -> None:
    """The running rollout-only pods hold the newest version: relabelled into the next generation, not deleted."""
    pod_list = [pod(0).failed().state(), pod(1).running().state(), pod(2).running().state()]
    plan = step(pod_list)
    assert plan.status.phase == "Restarting" and plan.status.restarts == 1
    assert plan.delete == ["demo-0"] and plan.adopt == ["demo-1", "demo-2"] and plan.restart_generation == 1
    assert plan.status.rollout_replacements == 0 and events(plan) == []
    assert "pod demo-0 failed (Error)" in plan.status.message
    assert "the kept rollout-only pods (demo-1, demo-2)" in plan.status.message
    # the next pass: the kept pods are generation 1's, only the hybrid pod is created again
    kept = [pod(0).failed().deleting().state()] + [replace(p, generation=1) for p in pod_list[1:]]
    after = step(kept, plan.status, now=later(30))
    assert after.delete == [] and after.create == [0], (after.delete, after.create)
    created = step([replace(p, generation=1) for p in [pod(0).phase("Pending").state(), *pod_list[1:]]],
                   after.status, now=later(31))
    assert created.delete == [] and created.create == [] and created.status.restarts == 1


def test_a_gang_restart_keeps_only_running_pool_pods_and_a_queued_job_none() -> None:
    pod_list = [pod(0).failed().state(), pod(1).phase("Pending").state(), pod(2).running().state()]
    plan = step(pod_list)
    assert plan.delete == ["demo-0", "demo-1"] and plan.adopt == ["demo-2"]
    queued = step([pod(0).failed().state(), pod(1).running().state(), pod(2).running().state()],
                  job=pool_job().queue("gpu-team"))
    assert queued.delete == ["demo-0", "demo-1", "demo-2"] and queued.adopt == []  # Kueue: the group goes whole
    assert "starts over from the initial model" in queued.status.message


def test_a_refusing_rollout_only_pod_still_fails_the_job() -> None:
    pod_list = healthy()[:2] + [pod(2).refused("rollout: spec.model.path: /m/config.json: missing").state()]
    plan = step(pod_list)
    assert plan.status.phase == "Failed" and plan.status.reason == "StartRefused"
    assert plan.status.rollout_replacements == 0 and events(plan) == []


@pytest.mark.parametrize(("action", "phase", "restarts"), [("RestartJob", "Restarting", 1), ("FailJob", "Failed", 0)])
def test_a_crash_looping_pool_is_a_stuck_verdict(action: str, phase: str, restarts: int) -> None:
    job = pool_job(max_restarts=1, action=action)  # bound: max(1, 1) x 2 = 2 replacements an hour
    st = running_status()
    for i, uid in enumerate(("a", "b")):
        plan = step(healthy()[:2] + [pod(2, uid).failed().state()], st, job=job, now=later(60 * i))
        assert plan.status.phase == "Running" and plan.status.rollout_replacements == i + 1
        st = step(healthy(), plan.status.model_copy(deep=True), job=job).status  # replaced: record closed
    third = step(healthy()[:2] + [pod(2, "c").failed().state()], st, job=job, now=later(120))
    assert third.status.phase == phase and third.status.reason == pool_policy.LIMIT
    assert third.status.restarts == restarts and third.status.rollout_pool is None
    assert "3 rollout-only pods lost within 60 minutes, more than max(1, failurePolicy.maxRestarts) x " \
           "rolloutOnlyReplicas = 2; the last: rollout-only pod demo-2 failed (Error)" in third.status.message
    later_loss = step(healthy()[:2] + [pod(2, "c").failed().state()], st, job=job, now=later(3600))
    assert later_loss.status.phase == "Running" and later_loss.status.rollout_replacements == 3  # a new hour


def test_the_record_of_another_generation_is_dropped() -> None:
    st = step(healthy()[:2] + [pod(2).failed().state()]).status
    st.restarts = 1  # a gang restart happened since
    pod_list = [pod(i, f"g1-{i}").running().generation(1).state() for i in range(3)]
    plan = step(pod_list, st)
    assert pool_policy.replacing(plan.status.rollout_pool) == [] and plan.status.message == "3 pods running"


def test_an_unschedulable_pool_pod_of_a_running_job_does_not_restart_the_gang() -> None:
    stuck = pod(2).unschedulable(since=T0, message="0/4 nodes: untolerated taint spot")
    pod_list = healthy()[:2] + [stuck.state()]
    running = step(pod_list, now=later(3600))  # long past schedulingTimeoutSeconds (600)
    assert running.status.phase == "Running" and running.status.restarts == 0
    assert "rollout-only pool 1/2" in running.status.message and "Unschedulable" in running.status.message
    pending = step(pod_list, StatusWrapper().phase("Pending").get(), now=later(3600))  # the gang never started
    assert pending.status.phase == "Restarting" and pending.status.reason == "SchedulingTimeout"


def test_a_queued_jobs_pool_keeps_the_gang_behaviour() -> None:
    job = pool_job().queue("gpu-team")
    plan = step(healthy()[:2] + [pod(2).failed("Evicted").state()], job=job)
    assert plan.status.phase == "Restarting" and plan.status.restarts == 1 and events(plan) == []


@pytest.mark.parametrize("persist", [False, True])
def test_a_job_says_at_creation_whether_a_gang_restart_can_resume(persist: bool) -> None:
    job = JobWrapper().volume("ckpt", "/ckpt", claimName="ckpt")
    plan = decide(observe(job.persist("/ckpt/t") if persist else job))
    cond = job_status.condition(plan.status, job_status.DURABLE_CHECKPOINTS)
    assert cond is not None and cond.status == ("True" if persist else "False")
    warned = events(plan, job_status.NO_DURABLE_CHECKPOINTS)
    if persist:
        assert warned == [] and "/ckpt/t" in cond.message
    else:
        assert cond.reason == job_status.NO_DURABLE_CHECKPOINTS and warned == [cond.message]
        assert "starts training over from the initial model at iteration 0" in cond.message
        again = decide(observe(job, plan.status, now=later(5)))
        assert events(again, job_status.NO_DURABLE_CHECKPOINTS) == []  # once, at creation


class ListingKube(RecordingKube):
    """An API server that already holds `existing` (a create of one answers 409) and lists `pods`."""

    def __init__(self, existing: tuple[str, ...] = (), pods: tuple[PodState, ...] = ()) -> None:
        super().__init__()
        self.existing, self.pods, self.lists = existing, list(pods), 0

    async def create(self, manifest: dict[str, Any]) -> bool:
        await super().create(manifest)
        return manifest["metadata"]["name"] not in self.existing

    async def list_job_pods(self, namespace: str, job: str) -> list[Any]:
        self.lists += 1
        return self.pods


def test_the_operator_remembers_the_pods_it_created_until_it_deletes_them() -> None:
    ref, memory = reconcile.JobRef("ns", "demo", "uid", 1, "1"), reconcile.JobMemory()
    reconcile.parse(memory, ref, pool_job().obj()["spec"])
    kube = ListingKube(existing=("demo-0",))
    first = step([], JobStatus())
    assert first.create == [0, 1, 2]
    asyncio.run(reconcile.carry_out(kube, ref, memory, first, "etcd:2379"))  # type: ignore[arg-type]
    assert memory.created == {"demo-1": 0, "demo-2": 0}  # demo-0 existed: not made by this create
    failed = step(healthy()[:2] + [pod(2).failed().state()])
    assert failed.delete == ["demo-2"]
    asyncio.run(reconcile.carry_out(kube, ref, memory, failed, "etcd:2379"))  # type: ignore[arg-type]
    assert memory.created == {"demo-1": 0}  # deleted by the operator itself: its absence is no news


@pytest.mark.parametrize(("phase", "created", "index", "lists"), [
    ("Pending", {"demo-2": 0}, 2, 1),  # created, not in the index: ask the API before calling it gone
    ("Pending", {"demo-2": 0}, 3, 0),
    ("Pending", {"demo-2": 1}, 2, 0),  # another generation's
    ("Pending", {}, 2, 0),  # not created yet: the index is the view
    ("Running", {}, 2, 1),
])
def test_a_pass_asks_the_api_when_a_pod_it_created_is_missing_from_the_index(
    phase: str, created: dict[str, int], index: int, lists: int
) -> None:
    ref, memory = reconcile.JobRef("ns", "demo", "uid", 1, "1"), reconcile.JobMemory()
    reconcile.parse(memory, ref, pool_job().obj()["spec"])
    kube, indexed = ListingKube(pods=tuple(healthy())), healthy()[:index]
    pods = asyncio.run(reconcile.observe_pods(kube, ref, indexed, memory.job,  # type: ignore[arg-type]
                                              StatusWrapper().phase(phase).get(), created))
    assert kube.lists == lists and pods == (healthy() if lists else indexed)


# ---- the real control plane ------------------------------------------------------------------------------

@pytest.mark.k8s
def test_lost_rollout_only_pods_are_replaced_alone_and_a_hybrid_failure_restarts_the_gang(
    k8s: ControlPlane, operator: OperatorProcess, ns: str
) -> None:
    name = "pool"
    create(k8s, ns, small(name, replicas=1, rollout_only=2))
    wait_for("3 running", lambda: running(k8s, ns, name, 3), 60)
    wait_for("Running", lambda: phase_is(k8s, ns, name, "Running"), 30)
    first = uids(k8s, ns, name)

    fail_pod(k8s, ns, f"{name}-1")  # the kubelet evicted it: phase Failed, reason Evicted
    after = wait_for("the failed pod replaced", lambda: replaced(k8s, ns, name, first, f"{name}-1"), 60)
    st = wait_for("Running, one replacement", lambda: phase_is(k8s, ns, name, "Running", rolloutReplacements=1,
                                                               message="3 pods running"), 30)
    assert st["restarts"] == 0 and st["reason"] == "PodsRunning"
    assert [after[f"{name}-{i}"] for i in (0, 2)] == [first[f"{name}-{i}"] for i in (0, 2)]  # the others untouched
    assert ("Warning", "RolloutReplaced") in wait_for("the Event", lambda: events_of(k8s, ns, name), 30)

    k8s.kubectl("delete", "pod", f"{name}-2", "-n", ns, "--wait=false")  # deleted: recreated alone
    again = wait_for("the deleted pod recreated", lambda: replaced(k8s, ns, name, after, f"{name}-2"), 60)
    wait_for("Running, two replacements", lambda: phase_is(k8s, ns, name, "Running", rolloutReplacements=2,
                                                           restarts=0), 30)
    assert again[f"{name}-0"] == first[f"{name}-0"]
    assert all(p["metadata"]["labels"]["tandem.dev/restart-generation"] == "0" for p in pods_of(k8s, ns, name))

    fail_pod(k8s, ns, f"{name}-0")  # a trainer pod: the gang restarts; the running pool is kept
    wait_for("gen 1 running", lambda: running(k8s, ns, name, 3, generation=1), 60)
    wait_for("Running after the restart", lambda: phase_is(k8s, ns, name, "Running", restarts=1,
                                                           rolloutReplacements=2), 30)
    final = uids(k8s, ns, name)
    assert final[f"{name}-0"] != again[f"{name}-0"]  # a new hybrid pod
    assert [final[f"{name}-{i}"] for i in (1, 2)] == [again[f"{name}-{i}"] for i in (1, 2)]  # the pool kept


def uids(cp: ControlPlane, ns: str, name: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods_of(cp, ns, name)}


def replaced(cp: ControlPlane, ns: str, name: str, before: dict[str, str], pod: str) -> dict[str, str] | None:
    """The pods' UIDs once `pod` runs again under another UID and every pod runs."""
    now = uids(cp, ns, name)
    return now if now.get(pod) not in (None, before[pod]) and running(cp, ns, name, len(before)) else None


class NoPatchKube(RecordingKube):
    """An API server whose RBAC (an older chart's) forbids patching pods."""

    async def label_pod(self, namespace: str, name: str, labels: dict[str, str]) -> bool:
        raise KubeError(f"label Pod {namespace}/{name}", 403, b'{"message": "forbidden"}')


@pytest.mark.parametrize("kube", [RecordingKube(), NoPatchKube()])
def test_kept_pods_are_relabelled_and_a_refused_relabel_is_a_plain_gang_restart(
    kube: RecordingKube, caplog: pytest.LogCaptureFixture
) -> None:
    plan = step([pod(0).failed().state(), pod(1).running().state(), pod(2).running().state()])
    ref = reconcile.JobRef("ns", "demo", "uid", 1, "1")
    asyncio.run(reconcile.carry_out(kube, ref, reconcile.JobMemory(), plan, "etcd:2379"))  # type: ignore[arg-type]
    assert kube.deleted == ["demo-0"]
    if isinstance(kube, NoPatchKube):  # logged; the next pass sees them in the old generation and deletes them
        assert kube.labelled == [] and "could not keep pod ns/demo-1 through the gang restart" in caplog.text
    else:
        assert kube.labelled == [(n, {"tandem.dev/restart-generation": "1"}) for n in ("demo-1", "demo-2")]


def test_a_cleared_pool_record_is_removed_from_the_stored_status() -> None:
    """A status field the new status no longer has (the pool record, once its hour passed) is written as a
    null, which is how a merge patch removes it; without it the stored record stayed, never matched the new
    status, and every pass patched the job again."""
    from tandem.operator.runtime import reconcile
    from tandem.spec.status import JobStatus

    kube = RecordingKube()
    ref = reconcile.JobRef(namespace="ns", name="job", uid="u", generation=1, resource_version="7")
    stored = {"phase": "Running", "rolloutPool": {"replacing": [], "windowStart": "2026-01-01T00:00:00Z",
                                                  "windowReplacements": 1}}
    new = JobStatus(phase="Running")
    written = asyncio.run(reconcile.write_status(kube, ref, reconcile.JobMemory(), new, stored, "7"))
    assert written is not None and "rolloutPool" not in written[0]
    [(version, patch)] = kube.status_writes
    assert version == "7" and "rolloutPool" in patch and patch["rolloutPool"] is None
    assert patch["phase"] == "Running"
    # the next pass, given what the server then stores, writes nothing
    again = asyncio.run(reconcile.write_status(kube, ref, reconcile.JobMemory(), new, written[0], "8"))
    assert again == (written[0], "8") and len(kube.status_writes) == 1
