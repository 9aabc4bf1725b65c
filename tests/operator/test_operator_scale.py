"""`kubectl scale` on an RLHFJob sizes its rollout-only pool, on the real control plane: pods created and
deleted in the running gang, the trainer pod untouched, no restart, a new (immutable) job document for the
pods started after the scale."""

from __future__ import annotations

import json

import pytest
import yaml
from controlplane import ControlPlane
from harness import OperatorProcess, get_json, wait_for
from test_operator_cluster import create, job_documents, phase_is, pods_of, running, small

pytestmark = pytest.mark.k8s


def test_scale_subresource_resizes_the_rollout_only_pool_without_a_restart(
    k8s: ControlPlane, operator: OperatorProcess, ns: str
) -> None:
    name = "scaled"
    # the operator runs with the chart's RBAC (its ServiceAccount's token), which changes no ConfigMap
    can = k8s.kubectl("auth", "can-i", "patch", "configmaps", "-n", ns, kubeconfig=operator.kubeconfig, check=False)
    assert can.stdout.strip() == "no"
    create(k8s, ns, small(name, replicas=1, rollout_only=1))
    wait_for("2 running", lambda: running(k8s, ns, name, 2), 60)
    wait_for("Running", lambda: phase_is(k8s, ns, name, "Running", rolloutOnlyReplicas=1), 30)
    trainer_uid = get_json(k8s, "pod", f"{name}-0", "-n", ns)["metadata"]["uid"]

    k8s.kubectl("scale", f"rlhfjob/{name}", "-n", ns, "--replicas=3")
    pods = wait_for("4 running", lambda: running(k8s, ns, name, 4), 60)
    assert sorted(p["metadata"]["name"] for p in pods) == [f"{name}-{i}" for i in range(4)]
    assert {p["metadata"]["labels"]["tandem.dev/role"] for p in pods[1:]} == {"rollout"}
    st = wait_for("status follows", lambda: phase_is(k8s, ns, name, "Running", rolloutOnlyReplicas=3), 30)
    assert st["restarts"] == 0
    assert get_json(k8s, "pod", f"{name}-0", "-n", ns)["metadata"]["uid"] == trainer_uid
    scale = json.loads(k8s.kubectl("get", f"rlhfjob/{name}", "-n", ns, "--subresource=scale", "-o", "json").stdout)
    assert scale["spec"]["replicas"] == 3 and scale["status"]["replicas"] == 3
    assert scale["status"]["selector"] == f"tandem.dev/job={name},tandem.dev/role=rollout"

    def document_pool(pod: str) -> int:  # the job document `pod` mounts (immutable, one per distinct document)
        volumes = get_json(k8s, "pod", pod, "-n", ns)["spec"]["volumes"]
        document = next(v for v in volumes if v["name"] == "job-spec")["configMap"]["name"]
        text = get_json(k8s, "configmap", document, "-n", ns)["data"]["job.yaml"]
        return int(yaml.safe_load(text)["spec"]["rolloutOnlyReplicas"])

    assert document_pool(f"{name}-3") == 3 and document_pool(f"{name}-0") == 1  # the trainer keeps its own

    k8s.kubectl("scale", f"rlhfjob/{name}", "-n", ns, "--replicas=0")
    wait_for("pool gone", lambda: [p["metadata"]["name"] for p in pods_of(k8s, ns, name)] == [f"{name}-0"], 60)
    st = wait_for("Running, no restart", lambda: phase_is(k8s, ns, name, "Running", rolloutOnlyReplicas=0), 30)
    assert st["restarts"] == 0 and st["message"] == "1 pods running"
    assert get_json(k8s, "pod", f"{name}-0", "-n", ns)["metadata"]["uid"] == trainer_uid
    def pools() -> list[int]:
        return sorted(int(yaml.safe_load(c["data"]["job.yaml"])["spec"]["rolloutOnlyReplicas"])
                      for c in job_documents(k8s, ns, name))

    wait_for("a job document for the scale down", lambda: pools() == [0, 1, 3], 30)
