"""spec.gangScheduling: the Workload API objects a job gets (unit), and on the real control plane
(Kubernetes 1.36, GenericWorkload + GangScheduling on, the real kube-scheduler, kwok nodes) a job
whose hybrid pods cannot all fit has none of them bound, and they bind together once capacity
appears; a job without it on the same capacity gets one pod bound and one pending (the control);
the Workload and PodGroups go with the job. A cluster without the API gets no pods and a status
naming the field. With a Kueue queue too (the Kueue stand-in), the gang waits at Kueue's gate, then,
admitted, still binds all-or-nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from controlplane import ControlPlane, fake_node
from fakes import RecordingKube
from harness import OperatorProcess, get_json, wait_for
from kueue_standin import KueueStandIn
from test_operator_cluster import phase_is
from test_operator_kueue import gated, kueue  # noqa: F401 - kueue: the stand-in fixture
from wrappers import JobWrapper

from tandem.operator.cluster.kube import KubeError
from tandem.operator.manifests import builders, gang
from tandem.operator.policies import job_status
from tandem.operator.runtime import reconcile

W = JobWrapper


def gang_job(name: str = "demo", replicas: int = 2, rollout_only: int = 1) -> W:
    return W(name).small().replicas(replicas).rollout_only(rollout_only).set("gangScheduling", True)


def test_hybrid_pods_join_their_gangs_pod_group_and_rollout_only_pods_do_not() -> None:
    job = gang_job().job()
    for generation in (0, 3):
        pods = builders.build_pods(job, restart_generation=generation)
        groups = [p["spec"].get("schedulingGroup") for p in pods]
        assert groups == [{"podGroupName": f"demo-hybrid-g{generation}"}] * 2 + [None]
    plain = builders.build_pods(gang_job().unset("gangScheduling").job())
    assert all("schedulingGroup" not in p["spec"] for p in plain)


def test_workload_and_pod_group_follow_the_job_controllers_shape() -> None:
    job = gang_job(replicas=3).job()
    job.metadata.namespace = "ns"
    workload = gang.build_workload(job, owner_uid="u-1")
    assert workload["apiVersion"] == "scheduling.k8s.io/v1alpha2" and workload["metadata"]["name"] == "demo"
    assert workload["spec"] == {
        "controllerRef": {"apiGroup": "tandem.dev", "kind": "RLHFJob", "name": "demo"},
        "podGroupTemplates": [{"name": "hybrid", "schedulingPolicy": {"gang": {"minCount": 3}}}],
    }  # minCount: the hybrid pods only; the rollout-only pod is outside the gang
    owner = workload["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("RLHFJob", "u-1", True)
    group = gang.build_pod_group(job, 2, owner_uid="u-1", workload_uid="w-1")
    assert group["metadata"]["name"] == "demo-hybrid-g2"
    assert group["metadata"]["labels"] == {"tandem.dev/job": "demo", "tandem.dev/restart-generation": "2"}
    assert group["spec"]["podGroupTemplateRef"] == {
        "workload": {"workloadName": "demo", "podGroupTemplateName": "hybrid"}}
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 3}}
    owners = {o["kind"]: o for o in group["metadata"]["ownerReferences"]}
    assert owners["RLHFJob"]["controller"] and "controller" not in owners["Workload"]  # the job controls it
    assert gang.creates_gang(job, [0]) and not gang.creates_gang(job, [3])  # a new rollout-only pod: no gang
    listed = [{"metadata": {"name": f"demo-hybrid-g{g}", "labels": {"tandem.dev/restart-generation": str(g)}}}
              for g in (0, 1, 2)]
    assert gang.stale_groups(listed, 2) == ["demo-hybrid-g0", "demo-hybrid-g1"]


class NoWorkloadApi(RecordingKube):
    """An API server without scheduling.k8s.io/v1alpha2 (404 for the resource); records what would
    have been created."""

    async def ensure_scheduling(self, manifest: dict[str, Any]) -> dict[str, Any]:
        raise KubeError(f"create {manifest['kind']}", 404, b'{"message": "the server could not find the '
                        b'requested resource"}')


class NoEtcd:
    async def read_progress(self, *_: Any) -> None:
        return None


def test_without_the_workload_api_no_pod_is_created_and_the_status_names_the_field() -> None:
    kube, memory = NoWorkloadApi(), reconcile.JobMemory()
    ref = reconcile.JobRef("ns", "demo", "uid", 1, "1")
    raw: dict[str, Any] = {}
    plans = []
    for _ in range(2):  # the same status on the next pass, and one Event only
        plan = asyncio.run(reconcile.run(kube=kube, etcd=NoEtcd(), memory=memory, ref=ref,  # type: ignore[arg-type]
                                         spec=gang_job().obj()["spec"], raw_status=raw, indexed_pods=(),
                                         default_etcd=["http://etcd:2379"], logger=logging.getLogger("t")))
        assert plan is not None
        plans.append(plan)
        raw = job_status.dump_status(plan.status)
    assert not [c for c in kube.created if c.startswith("Pod/")]
    st = plans[-1].status
    assert st.phase == "Pending" and "spec.gangScheduling" in st.message and "1.36" in st.message
    warnings = [e.reason for p in plans for e in p.events if e.type == "Warning"]
    assert warnings == [job_status.NO_DURABLE_CHECKPOINTS, gang.UNAVAILABLE_REASON]  # (no checkpointEngine.persist)


# --- on the real control plane ---------------------------------------------------------------------

POOL = "tandem.test/gang-pool"


def pool_node(name: str, pool: str) -> dict[str, Any]:
    node = fake_node(name, gpus=8)
    node["metadata"]["labels"][POOL] = pool
    node["spec"]["taints"] = [{"key": POOL, "value": pool, "effect": "NoSchedule"}]  # other tests stay off
    return node


def on_pool(job: W, pool: str) -> W:
    """Two hybrid pods of 8 GPUs each, allowed only on the pool's nodes (8 GPUs each)."""
    return (job.gpus(8).set("trainer.resources", {"cpu": "100m", "memory": "128Mi"})
            .set("rollout.resources", {"cpu": "100m", "memory": "128Mi"}).set("checkpointEngine.shmSize", "64Mi")
            .set("podTemplate", {"spec": {"nodeSelector": {POOL: pool}, "tolerations": [
                {"key": POOL, "operator": "Equal", "value": pool, "effect": "NoSchedule"}]}}))


def pods(cp: ControlPlane, ns: str, name: str) -> list[dict[str, Any]]:
    return (get_json(cp, "pods", "-n", ns, "-l", f"tandem.dev/job={name}") or {}).get("items", [])


def unschedulable(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False"
               for c in pod.get("status", {}).get("conditions") or [])


def all_tried(cp: ControlPlane, ns: str, name: str) -> list[dict[str, Any]] | None:
    """Both pods, once the scheduler has tried them and given up for now (none fits as a gang)."""
    items = pods(cp, ns, name)
    return items if len(items) == 2 and all(unschedulable(p) for p in items) else None


def all_bound(cp: ControlPlane, ns: str, name: str) -> list[dict[str, Any]] | None:
    items = pods(cp, ns, name)
    return items if len(items) == 2 and all(p["spec"].get("nodeName") for p in items) else None


@pytest.fixture
def pool(installed: ControlPlane, ns: str) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for node in names:
        installed.kubectl("delete", "node", node, "--wait=false", check=False)


@pytest.mark.k8s
def test_a_gang_that_cannot_fit_binds_no_pod_then_binds_together(
    installed: ControlPlane, operator: OperatorProcess, ns: str, pool: list[str]
) -> None:
    cp = installed
    pool.append(f"gang-{ns}-a")
    cp.apply(pool_node(pool[0], ns))

    # the control: without gangScheduling the one node takes one pod, the other waits
    plain = on_pool(W("plain", ns).replicas(2), ns).obj()
    cp.kubectl("create", "-f", "-", input=json.dumps(plain))

    def one_bound() -> list[dict[str, Any]] | None:
        items = pods(cp, ns, "plain")
        bound = [p for p in items if p["spec"].get("nodeName")]
        return items if len(items) == 2 and len(bound) == 1 and any(unschedulable(p) for p in items) else None

    wait_for("one plain pod bound, one unschedulable", one_bound, 120)
    cp.kubectl("delete", "rlhfjob", "plain", "-n", ns, "--timeout=60s")
    wait_for("plain pods gone", lambda: not pods(cp, ns, "plain"), 120)

    name = "gang"
    doc = on_pool(W(name, ns).replicas(2).set("gangScheduling", True), ns).obj()
    cp.kubectl("create", "-f", "-", input=json.dumps(doc))
    group = wait_for("the gang's PodGroup", lambda: get_json(cp, "podgroups.scheduling.k8s.io", f"{name}-hybrid-g0",
                                                             "-n", ns), 60)
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 2}}
    workload = get_json(cp, "workloads.scheduling.k8s.io", name, "-n", ns)
    assert workload["spec"]["controllerRef"] == {"apiGroup": "tandem.dev", "kind": "RLHFJob", "name": name}

    items = wait_for("both gang pods tried and unschedulable", lambda: all_tried(cp, ns, name), 120)
    assert [p["spec"]["schedulingGroup"] for p in items] == [{"podGroupName": f"{name}-hybrid-g0"}] * 2
    assert not [p["metadata"]["name"] for p in items if p["spec"].get("nodeName")]  # none bound, not even one
    st = get_json(cp, "rlhfjob", name, "-n", ns)["status"]
    assert st["phase"] == "Pending" and "waiting for 2 of 2 pods" in st["message"]

    pool.append(f"gang-{ns}-b")
    cp.apply(pool_node(pool[1], ns))  # capacity appears: both bind, one per node

    items = wait_for("both gang pods bound", lambda: all_bound(cp, ns, name), 180)
    assert sorted(p["spec"]["nodeName"] for p in items) == sorted(pool)
    wait_for("Running", lambda: phase_is(cp, ns, name, "Running"), 60)

    cp.kubectl("delete", "rlhfjob", name, "-n", ns, "--timeout=60s")  # the objects go with the job
    wait_for("PodGroup collected", lambda: get_json(cp, "podgroups.scheduling.k8s.io", f"{name}-hybrid-g0",
                                                    "-n", ns) is None, 120)
    wait_for("Workload collected", lambda: get_json(cp, "workloads.scheduling.k8s.io", name, "-n", ns) is None, 120)


@pytest.mark.k8s
def test_a_gang_restart_gets_a_new_pod_group_and_the_old_one_goes(
    installed: ControlPlane, operator: OperatorProcess, ns: str
) -> None:
    cp, name = installed, "regang"
    doc = gang_job(name, replicas=2, rollout_only=1).failure_policy(max_restarts=2, backoff_seconds=0).obj()
    doc["metadata"]["namespace"] = ns
    cp.kubectl("create", "-f", "-", input=json.dumps(doc))

    def running(generation: int) -> list[dict[str, Any]] | None:
        items = [p for p in pods(cp, ns, name) if not p["metadata"].get("deletionTimestamp")]
        ok = len(items) == 3 and all(p["status"].get("phase") == "Running" and
                                     p["metadata"]["labels"]["tandem.dev/restart-generation"] == str(generation)
                                     for p in items)
        return items if ok else None

    items = wait_for("gang 0 running", lambda: running(0), 120)
    assert sorted(str((p["spec"].get("schedulingGroup") or {}).get("podGroupName")) for p in items) == [
        "None", f"{name}-hybrid-g0", f"{name}-hybrid-g0"]  # the rollout-only pod is outside the gang
    cp.kubectl("patch", "pod", f"{name}-1", "-n", ns, "--subresource=status", "--type=merge", "-p",
               json.dumps({"status": {"phase": "Failed", "reason": "Evicted", "message": "test"}}))
    items = wait_for("gang 1 running", lambda: running(1), 120)
    assert {str((p["spec"].get("schedulingGroup") or {}).get("podGroupName")) for p in items} == {
        "None", f"{name}-hybrid-g1"}
    wait_for("gang 0's PodGroup deleted", lambda: get_json(cp, "podgroups.scheduling.k8s.io", f"{name}-hybrid-g0",
                                                           "-n", ns) is None, 120)
    assert get_json(cp, "podgroups.scheduling.k8s.io", f"{name}-hybrid-g1", "-n", ns) is not None


@pytest.mark.k8s
def test_a_queued_gang_waits_for_kueue_then_binds_all_or_nothing(
    installed: ControlPlane, operator: OperatorProcess, ns: str, pool: list[str], kueue: KueueStandIn  # noqa: F811
) -> None:
    """Both at once, as a platform team runs them: Kueue decides when the job may start (its gate),
    the scheduler then places the gang all-or-nothing (the PodGroup) once there is room."""
    cp, name = installed, "qgang"
    group = f"rlhfjob-{name}"  # Kueue's pod group (kueue.x-k8s.io/pod-group-name)
    pool.append(f"qgang-{ns}-a")
    cp.apply(pool_node(pool[0], ns))
    doc = on_pool(W(name, ns).replicas(2).set("gangScheduling", True).queue("gpu-team"), ns).obj()
    cp.kubectl("create", "-f", "-", input=json.dumps(doc))

    items = wait_for("both pods held at Kueue's gate", lambda: gated(cp, ns, name, 2, 0), 60)
    assert [p["spec"]["schedulingGroup"] for p in items] == [{"podGroupName": f"{name}-hybrid-g0"}] * 2
    assert {p["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] for p in items} == {group}
    assert get_json(cp, "podgroups.scheduling.k8s.io", f"{name}-hybrid-g0", "-n", ns) is not None
    wait_for("Queued", lambda: phase_is(cp, ns, name, "Queued"), 60)

    assert kueue.admit(ns, group) == [f"{name}-0", f"{name}-1"]  # admitted: room for one pod only

    items = wait_for("both admitted pods tried and unschedulable", lambda: all_tried(cp, ns, name), 120)
    assert not [p["metadata"]["name"] for p in items if p["spec"].get("nodeName")]  # none bound, not even one

    st = wait_for("Pending once admitted, waiting for room", lambda: phase_is(cp, ns, name, "Pending"), 60)
    assert st["restarts"] == 0 and st.get("preemptions", 0) == 0 and "waiting for 2 of 2 pods" in st["message"]

    pool.append(f"qgang-{ns}-b")
    cp.apply(pool_node(pool[1], ns))

    items = wait_for("both gang pods bound", lambda: all_bound(cp, ns, name), 180)
    assert sorted(p["spec"]["nodeName"] for p in items) == sorted(pool)
    wait_for("Running", lambda: phase_is(cp, ns, name, "Running"), 60)
