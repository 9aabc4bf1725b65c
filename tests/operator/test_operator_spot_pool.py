"""Rollout-only pools on preemptible nodes: spec.podTemplate.rolloutOnly schedules the rollout-only pods
apart (unit: what each pod gets; the spec's rules), and the hybrid pods' PodDisruptionBudget (unit: the
builder, the reconcile pass creating it or, opted out, deleting it; control plane: the rollout-only
pods land on a tainted "spot" node, the Eviction API is refused for a hybrid pod and accepted for a
rollout-only one, which is replaced alone; opted out, a drain may take the hybrid pod, and the gang
restarts)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

import pytest
from controlplane import ControlPlane
from fakes import NoProgress, RecordingKube
from harness import OperatorProcess, get_json, wait_for
from test_operator_cluster import create, events_of, phase_is, running, small
from test_operator_pool import replaced, uids
from wrappers import JobWrapper

from tandem.operator.manifests import builders, disruption
from tandem.operator.runtime import reconcile
from tandem.spec.load import SpecError, parse_job

SPOT_TAINT = {"key": "tandem.test/spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
TEMPLATE = {
    "metadata": {"labels": {"team": "rl"}},
    "spec": {"nodeSelector": {"tandem.test/gpu": "h100"}, "priorityClassName": "rl-high",
             "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]},
    "rolloutOnly": {
        "metadata": {"labels": {"pool": "spot"}},
        "spec": {"nodeSelector": {"tandem.test/pool": "spot"}, "tolerations": [SPOT_TAINT],
                 "priorityClassName": "rl-preemptible"},
    },
}


def test_rollout_only_pods_get_their_own_scheduling_over_the_template() -> None:
    job = JobWrapper().replicas(1).rollout_only(1).set("podTemplate", TEMPLATE).job()
    hybrid, pool = builders.build_pods(job)
    assert hybrid["spec"]["nodeSelector"] == {"tandem.test/gpu": "h100"}
    assert hybrid["spec"]["priorityClassName"] == "rl-high" and "pool" not in hybrid["metadata"]["labels"]
    assert SPOT_TAINT not in hybrid["spec"]["tolerations"]
    assert pool["spec"]["nodeSelector"] == {"tandem.test/gpu": "h100", "tandem.test/pool": "spot"}
    assert pool["spec"]["priorityClassName"] == "rl-preemptible"
    assert pool["metadata"]["labels"]["pool"] == "spot" and pool["metadata"]["labels"]["team"] == "rl"
    keys = [t["key"] for t in pool["spec"]["tolerations"]]
    assert keys == ["nvidia.com/gpu", "dedicated", "tandem.test/spot"]  # the operator's, the template's, its own
    alone = JobWrapper().replicas(1).rollout_only(1).set("podTemplate", {"rolloutOnly": TEMPLATE["rolloutOnly"]})
    hybrid, pool = builders.build_pods(alone.job())
    assert "nodeSelector" not in hybrid["spec"] and pool["spec"]["nodeSelector"] == {"tandem.test/pool": "spot"}


@pytest.mark.parametrize(("override", "says"), [
    ({"metadata": {"labels": {"tandem.dev/role": "x"}}}, "metadata.labels: keys tandem.dev/*"),
    ({"spec": {"tolerations": [{"operator": "Equal", "value": "x"}]}}, "spec.tolerations.0.key: an empty key"),
    ({"spec": {"serviceAccountName": "other"}}, "spec.serviceAccountName: unknown field"),  # scheduling only
])
def test_rollout_only_overrides_are_checked_like_the_template(override: dict[str, Any], says: str) -> None:
    doc = JobWrapper().rollout_only(1).set("podTemplate", {"rolloutOnly": override}).obj()
    with pytest.raises(SpecError, match=f"spec.podTemplate.rolloutOnly.{re.escape(says)}"):
        parse_job(doc)


def test_the_budget_covers_the_hybrid_pods_only_and_blocks_their_eviction() -> None:
    job = JobWrapper("demo").replicas(2).rollout_only(1).job()
    pdb = disruption.build_pod_disruption_budget(job, owner_uid="uid-1")
    assert pdb["metadata"]["name"] == "demo-hybrid" and pdb["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert pdb["spec"]["minAvailable"] == 2 and pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert "maxUnavailable" not in pdb["spec"]  # counted through the RLHFJob's /scale: the pool, not the gang
    selector = pdb["spec"]["selector"]["matchLabels"]
    for generation in (0, 3):
        covered = [all(p["metadata"]["labels"].get(k) == v for k, v in selector.items())
                   for p in builders.build_pods(job, restart_generation=generation)]
        assert covered == [True, True, False]  # every gang's hybrid pods; never the rollout-only pool


def one_pass(kube: RecordingKube, spec: dict[str, Any], memory: reconcile.JobMemory, generation: int) -> None:
    asyncio.run(reconcile.run(
        kube=kube, etcd=NoProgress(), memory=memory,  # type: ignore[arg-type]
        ref=reconcile.JobRef("ns", "demo", "uid", generation, "1"), spec=spec, raw_status={}, indexed_pods=(),
        default_etcd=["http://etcd:2379"], logger=logging.getLogger("t")))


def test_the_budget_is_created_with_the_jobs_objects_and_deleted_when_the_job_opts_out() -> None:
    kube, memory = RecordingKube(), reconcile.JobMemory()
    one_pass(kube, JobWrapper("demo").small().obj()["spec"], memory, generation=1)
    assert "PodDisruptionBudget/demo-hybrid" in kube.created and not kube.deleted
    one_pass(kube, JobWrapper("demo").small().set("podDisruptionBudget", False).obj()["spec"], memory, generation=2)
    assert kube.deleted == ["PodDisruptionBudget/demo-hybrid"]


def evict(cp: ControlPlane, ns: str, pod: str) -> Any:
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": ns}}
    return cp.kubectl("create", "--raw", f"/api/v1/namespaces/{ns}/pods/{pod}/eviction", "-f", "-",
                      input=json.dumps(body), check=False)


@pytest.mark.k8s
def test_a_spot_pool_is_evicted_and_replaced_alone_while_the_budget_keeps_the_trainer(
    installed: ControlPlane, operator: OperatorProcess, ns: str
) -> None:
    cp, node, name = installed, "kwok-node-1", "spot"
    cp.kubectl("label", "node", node, "tandem.test/pool=spot")
    cp.kubectl("taint", "node", node, "tandem.test/spot=true:NoSchedule")
    try:
        pool = {"rolloutOnly": {"spec": {"nodeSelector": {"tandem.test/pool": "spot"}, "tolerations": [SPOT_TAINT]}}}
        uid = create(cp, ns, small(name, replicas=1, rollout_only=1).set("podTemplate", pool))["metadata"]["uid"]
        pods = {p["metadata"]["name"]: p for p in wait_for("2 running", lambda: running(cp, ns, name, 2), 60)}
        assert pods[f"{name}-1"]["spec"]["nodeName"] == node and pods[f"{name}-0"]["spec"]["nodeName"] != node
        # the controller manager's disruption controller fills the status in; on a loaded machine (a fresh one
        # still building beside the suite) that took over a minute once
        pdb = wait_for("the budget counts the trainer pod", lambda: (b := get_json(
            cp, "pdb", f"{name}-hybrid", "-n", ns)) and (b.get("status") or {}).get("currentHealthy") == 1 and b, 240)
        assert pdb["metadata"]["ownerReferences"][0]["uid"] == uid
        assert (pdb["status"]["desiredHealthy"], pdb["status"]["disruptionsAllowed"]) == (1, 0)
        before = uids(cp, ns, name)

        refused = evict(cp, ns, f"{name}-0")  # a drain's eviction of the trainer pod waits
        assert refused.returncode != 0 and "disruption budget" in refused.stderr, refused.stderr
        assert evict(cp, ns, f"{name}-1").returncode == 0  # the spot pod goes: replaced alone, on a spot node
        wait_for("the pool pod replaced", lambda: replaced(cp, ns, name, before, f"{name}-1"), 60)
        # counted though the eviction may come before any pass saw the pods run (the status still Pending)
        wait_for("Running, one replacement", lambda: phase_is(cp, ns, name, "Running", rolloutReplacements=1,
                                                              restarts=0, message="2 pods running"), 30)
        assert uids(cp, ns, name)[f"{name}-0"] == before[f"{name}-0"]
        assert get_json(cp, "pod", f"{name}-1", "-n", ns)["spec"]["nodeName"] == node

        cp.kubectl("patch", "rlhfjob", name, "-n", ns, "--type=merge", "-p", '{"spec":{"podDisruptionBudget":false}}')
        wait_for("the budget deleted", lambda: get_json(cp, "pdb", f"{name}-hybrid", "-n", ns) is None, 30)
        assert evict(cp, ns, f"{name}-0").returncode == 0  # opted out: the drain takes the trainer
        wait_for("a gang restart", lambda: phase_is(cp, ns, name, "Running", restarts=1, rolloutReplacements=1)
                 and running(cp, ns, name, 2, generation=1), 60)
        assert ("Warning", "RolloutReplaced") in events_of(cp, ns, name)
    finally:
        cp.kubectl("taint", "node", node, "tandem.test/spot=true:NoSchedule-", check=False)
        cp.kubectl("label", "node", node, "tandem.test/pool-", check=False)
