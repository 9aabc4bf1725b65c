"""spec.gpuAllocation: dra on the real control plane (Kubernetes 1.36: resource.k8s.io/v1 GA, the DRA
scheduler plugin and the resource-claim controller on by default): a kwok node publishes a ResourceSlice
of two devices of a test driver, selected by a DeviceClass; a job asking that class for 2 GPUs per pod
gets its ResourceClaimTemplate (owned by the job), its pod a ResourceClaim made from it that the real
kube-scheduler allocates on that node's devices, and the pod is bound there; both containers reference
the one claim and nothing requests nvidia.com/gpu. The node is tainted, so other tests stay off it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from controlplane import ControlPlane, fake_node
from harness import OperatorProcess, get_json, wait_for
from wrappers import JobWrapper

pytestmark = pytest.mark.k8s

DRIVER = "gpu.tandem-test.dev"
CLASS = "gpu.tandem-test.dev"
TAINT = "tandem.dev/dra-test"


@pytest.fixture
def dra_node(installed: ControlPlane) -> Iterator[str]:
    cp, name = installed, "kwok-dra-0"
    assert "resource.k8s.io/v1" in cp.kubectl("api-versions").stdout.split(), "resource.k8s.io/v1 not served"
    node = fake_node(name, gpus=0)
    node["spec"]["taints"] = [{"key": TAINT, "value": "yes", "effect": "NoSchedule"}]
    device_class = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": CLASS},
                    "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]}}
    slice_ = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{name}-gpus"},
              "spec": {"driver": DRIVER, "nodeName": name,
                       "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                       "devices": [{"name": "gpu-0"}, {"name": "gpu-1"}]}}
    cp.apply([node, device_class, slice_])
    yield name
    cp.kubectl("delete", "resourceslice", f"{name}-gpus", "--wait=false", check=False)
    cp.kubectl("delete", "deviceclass", CLASS, "--wait=false", check=False)
    cp.kubectl("delete", "node", name, "--wait=false", check=False)


def test_dra_job_gets_one_claim_allocated_by_the_scheduler_and_its_pod_bound(
    installed: ControlPlane, operator: OperatorProcess, ns: str, dra_node: str
) -> None:
    cp, name = installed, "dra"
    doc = (JobWrapper(name, ns).small().gpus(2).set("gpuAllocation", "dra").set("gpuDeviceClassName", CLASS)
           .set("podTemplate", {"spec": {"tolerations": [{"key": TAINT, "operator": "Equal", "value": "yes",
                                                          "effect": "NoSchedule"}]}}).obj())
    cp.kubectl("create", "-f", "-", input=json.dumps(doc))

    template = wait_for("the job's ResourceClaimTemplate",
                        lambda: get_json(cp, "resourceclaimtemplates.resource.k8s.io", f"{name}-gpus", "-n", ns), 60)
    job_uid = get_json(cp, "rlhfjob", name, "-n", ns)["metadata"]["uid"]
    assert [o["uid"] for o in template["metadata"]["ownerReferences"]] == [job_uid]
    assert template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == CLASS

    def bound() -> dict[str, Any] | None:
        pods = (get_json(cp, "pods", "-n", ns, "-l", f"tandem.dev/job={name}") or {}).get("items", [])
        return pods[0] if len(pods) == 1 and pods[0]["spec"].get("nodeName") else None

    pod = wait_for("the pod bound", bound, 180)
    assert pod["spec"]["nodeName"] == dra_node
    containers = [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]
    assert {c["name"]: c["resources"].get("claims") for c in containers if c["name"] in ("trainer", "rollout")} == {
        "trainer": [{"name": "gpus"}], "rollout": [{"name": "gpus"}]}
    assert not any("nvidia.com/gpu" in c["resources"].get("requests", {}) for c in containers)
    [status] = pod["status"]["resourceClaimStatuses"]
    claim = get_json(cp, "resourceclaims.resource.k8s.io", status["resourceClaimName"], "-n", ns)
    results = claim["status"]["allocation"]["devices"]["results"]
    assert sorted(r["device"] for r in results) == ["gpu-0", "gpu-1"]
    assert {(r["driver"], r["pool"]) for r in results} == {(DRIVER, dra_node)}
    assert [c["uid"] for c in claim["status"]["reservedFor"]] == [pod["metadata"]["uid"]]

    cp.kubectl("delete", "rlhfjob", name, "-n", ns, "--timeout=60s")  # the template goes with the job
    wait_for("template collected", lambda: get_json(cp, "resourceclaimtemplates.resource.k8s.io", f"{name}-gpus",
                                                    "-n", ns) is None, 120)
