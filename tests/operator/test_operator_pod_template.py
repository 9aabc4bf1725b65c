"""spec.podTemplate: the merge over what the builders make, its precedence and its refusals (unit
tables), and on the real control plane a job whose pods carry the overrides and are scheduled by
them (a tainted, labelled node; a PriorityClass resolved by admission; a ServiceAccount; a pull
secret; env from a Secret). Malformed overrides refused by the API server are rows of
test_operator_invalid.py's table (one create each, no extra control plane).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from controlplane import ControlPlane
from harness import MANIFESTS, OperatorProcess, get_json, wait_for
from wrappers import JobWrapper

from tandem.operator.manifests import builders, pod_template
from tandem.spec.load import SpecError, load_job, parse_job
from tandem.spec.pod_fields import reserved_env
from tandem.spec.podenv import PodEnv
from tandem.spec.podtemplate import PodTemplate

W = JobWrapper
HF = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"team": "rl"}, "annotations": {"example.com/cost-center": "42"}},
    "spec": {
        "nodeSelector": {"nvidia.com/gpu.product": "H100"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "rl", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 10, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}]}},
        "priorityClassName": "rl-high",
        "serviceAccountName": "rl-runner",
        "imagePullSecrets": [{"name": "registry"}],
        "volumes": [{"name": "certs", "secret": {"secretName": "certs"}}],
        "containers": [
            {"name": "trainer", "env": [HF, {"name": "NCCL_DEBUG", "value": "INFO"}],
             "envFrom": [{"secretRef": {"name": "wandb"}}],
             "volumeMounts": [{"name": "certs", "mountPath": "/certs", "readOnly": True},
                              {"name": "data", "mountPath": "/data/train", "subPath": "train"}]},
            {"name": "rollout", "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]},
        ],
    },
}


def job_with(template: dict[str, Any], *, gpus: int = 8) -> W:
    return W().gpus(gpus).rollout_only(1).volume("data", "/data", claimName="data").set("podTemplate", template)


def containers(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]}


def test_every_pod_carries_the_overrides_and_keeps_its_own() -> None:
    job = job_with(TEMPLATE).job()
    plain = builders.build_pods(job_with(TEMPLATE).unset("podTemplate").job())
    for pod, before in zip(builders.build_pods(job), plain, strict=True):
        meta, spec = pod["metadata"], pod["spec"]
        assert meta["labels"] == {"team": "rl", **before["metadata"]["labels"]}
        assert meta["annotations"] == {"example.com/cost-center": "42"}
        assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}
        assert spec["tolerations"] == before["spec"]["tolerations"] + [
            {"key": "dedicated", "value": "rl", "effect": "NoSchedule"}]  # the GPU toleration first, kept
        assert spec["affinity"] == TEMPLATE["spec"]["affinity"]
        assert (spec["priorityClassName"], spec["serviceAccountName"]) == ("rl-high", "rl-runner")
        assert spec["imagePullSecrets"] == [{"name": "registry"}]
        assert [v["name"] for v in spec["volumes"]] == [v["name"] for v in before["spec"]["volumes"]] + ["certs"]
        assert spec["volumes"][-1] == {"name": "certs", "secret": {"secretName": "certs"}}  # (the job document's
        # ConfigMap is named by its content, the template included)
        for name, c in containers(pod).items():
            own = containers(before)[name]
            assert c["env"][: len(own["env"])] == own["env"]  # the contract untouched, first
            assert c["resources"] == own["resources"]
            assert c["volumeMounts"][: len(own["volumeMounts"])] == own["volumeMounts"]
        rollout = containers(pod)["rollout"]
        assert rollout["env"][-1] == {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}
        own = containers(before)["rollout"]["volumeMounts"]  # the template adds no mount to the rollout
        assert "envFrom" not in rollout and rollout["volumeMounts"] == own
    trainer = containers(builders.build_pod(job, 0))["trainer"]
    assert trainer["env"][-2:] == [HF, {"name": "NCCL_DEBUG", "value": "INFO"}]
    assert trainer["envFrom"] == [{"secretRef": {"name": "wandb"}}]
    assert trainer["volumeMounts"][-2:] == [  # a spec.volumes entry named by its own name -> vol-<name>
        {"name": "certs", "mountPath": "/certs", "readOnly": True},
        {"name": "vol-data", "mountPath": "/data/train", "subPath": "train"},
    ]
    assert "trainer" not in containers(builders.build_pod(job, 1))  # the rollout-only pod


def test_no_template_and_an_empty_one_change_nothing() -> None:
    def pods(w: W) -> list[dict[str, Any]]:  # but the name of the job document, which holds the template
        out = builders.build_pods(w.job())
        for pod in out:
            next(v for v in pod["spec"]["volumes"] if v["name"] == "job-spec")["configMap"]["name"] = "document"
        return out

    assert pods(W().set("podTemplate", {})) == pods(W())


def test_the_reserved_env_covers_the_whole_pod_env_contract() -> None:
    assert all(reserved_env(v) for v in PodEnv.variables())
    written = {e["name"] for c in containers(builders.build_pod(W().gpus(8).job(), 0)).values() for e in c["env"]}
    assert all(reserved_env(v) for v in written), sorted(v for v in written if not reserved_env(v))


def env(name: str) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "trainer", "env": [{"name": name, "value": "x"}]}]}}


def mount(name: str, path: str) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "rollout", "volumeMounts": [{"name": name, "mountPath": path}]}]}}


C0 = "spec.podTemplate.spec.containers.0"
REFUSED: list[tuple[str, Callable[[], W], str]] = [
    ("contract-variable", lambda: W().set("podTemplate", env("TANDEM_ETCD_ENDPOINTS")), f"{C0}.env.0.name"),
    ("rendezvous", lambda: W().set("podTemplate", env("MASTER_ADDR")), f"{C0}.env.0.name"),
    ("gpu-sharing", lambda: W().set("podTemplate", env("NVIDIA_VISIBLE_DEVICES")), f"{C0}.env.0.name"),
    ("gpu-resources", lambda: W().set("podTemplate", {"spec": {"containers": [
        {"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}), f"{C0}.resources.limits"),
    ("memory-resources", lambda: W().set("podTemplate", {"spec": {"containers": [
        {"name": "rollout", "resources": {"limits": {"memory": 1}}}]}}), f"{C0}.resources.limits"),
    ("kubernetes-io-resources", lambda: W().set("podTemplate", {"spec": {"containers": [
        {"name": "rollout", "resources": {"limits": {"hugepages.kubernetes.io/x": 1}}}]}}), f"{C0}.resources.limits"),
    ("resource-requests", lambda: W().set("podTemplate", {"spec": {"containers": [
        {"name": "rollout", "resources": {"requests": {"rdma/hca": 1}}}]}}), f"{C0}.resources.requests"),
    ("image", lambda: W().set("podTemplate", {"spec": {"containers": [{"name": "rollout", "image": "x"}]}}),
     f"{C0}.image"),
    ("unknown-container", lambda: W().set("podTemplate", {"spec": {"containers": [{"name": "sidecar"}]}}),
     f"{C0}.name"),
    ("shm-mount", lambda: W().set("podTemplate", mount("data", "/dev/shm")), f"{C0}.volumeMounts.0.mountPath"),
    ("job-spec-mount", lambda: W().set("podTemplate", mount("data", "/etc/tandem/x")),
     f"{C0}.volumeMounts.0.mountPath"),
    ("mount-of-nothing", lambda: W().set("podTemplate", mount("nope", "/x")), "spec.podTemplate.spec.containers"),
    ("mount-over-a-volume", lambda: W().volume("data", "/data", claimName="d").set(
        "podTemplate", mount("data", "/data")), "spec.podTemplate.spec.containers"),
    ("shm-volume", lambda: W().set("podTemplate", {"spec": {"volumes": [{"name": "shm", "emptyDir": {}}]}}),
     "spec.podTemplate.spec.volumes.0.name"),
    ("volume-two-sources", lambda: W().set("podTemplate", {"spec": {"volumes": [
        {"name": "x", "emptyDir": {}, "secret": {"secretName": "s"}}]}}), "spec.podTemplate.spec.volumes.0.secret"),
    ("operator-label", lambda: W().set("podTemplate", {"metadata": {"labels": {"tandem.dev/job": "other"}}}),
     "spec.podTemplate.metadata.labels"),
    ("kueue-label-on-pods", lambda: W().set("podTemplate", {"metadata": {"labels": {
        "kueue.x-k8s.io/queue-name": "gpu"}}}), "spec.podTemplate.metadata.labels"),
    ("label-key-syntax", lambda: W().set("podTemplate", {"metadata": {"labels": {"a b": "x"}}}),
     "spec.podTemplate.metadata.labels"),
    ("toleration-effect", lambda: W().set("podTemplate", {"spec": {"tolerations": [
        {"key": "k", "effect": "NeverSchedule"}]}}), "spec.podTemplate.spec.tolerations.0.effect"),
    ("toleration-exists-value", lambda: W().set("podTemplate", {"spec": {"tolerations": [
        {"key": "k", "operator": "Exists", "value": "v"}]}}), "spec.podTemplate.spec.tolerations.0.value"),
    ("env-value-and-from", lambda: W().set("podTemplate", {"spec": {"containers": [{"name": "trainer", "env": [
        {**HF, "value": "x"}]}]}}), f"{C0}.env.0.valueFrom"),
    ("env-twice", lambda: W().set("podTemplate", {"spec": {"containers": [{"name": "trainer", "env": [
        {"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}]}}), f"{C0}.env"),
]


@pytest.mark.parametrize(("case", "build", "field"), REFUSED, ids=[c[0] for c in REFUSED])
def test_overrides_that_would_break_the_pod_are_refused_naming_the_field(
    case: str, build: Callable[[], W], field: str
) -> None:
    with pytest.raises(SpecError) as err:
        parse_job(build().obj(), case)
    assert field in err.value.fields, str(err.value)


def test_the_merge_itself_refuses_to_replace_what_the_operator_set() -> None:
    """Past the spec's rules (a template built without validation), the merge still names the field."""
    pod = builders.build_pod(W().job(), 0)
    unchecked = PodTemplate.model_validate({"spec": {"containers": [{"name": "trainer", "env": [
        {"name": "HOME", "value": "/x"}]}]}})
    unchecked.spec.containers[0].env[0].name = "TANDEM_ROLE"  # assignment is not validated
    with pytest.raises(pod_template.PodTemplateConflict, match=r"containers\[0\]\.env\[0\]\.name: TANDEM_ROLE"):
        pod_template.merge(pod, unchecked, set())
    labels = PodTemplate.model_validate({})
    labels.metadata.labels["tandem.dev/role"] = "rollout"
    with pytest.raises(pod_template.PodTemplateConflict, match="metadata.labels: tandem.dev/role"):
        pod_template.merge(builders.build_pod(W().job(), 0), labels, set())


RDMA = {"spec": {"containers": [
    {"name": n, "resources": {"limits": {"rdma/hca_shared_devices_a": 1}},
     "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}} for n in ("trainer", "rollout")]}}


def test_rdma_adds_its_device_resource_and_ipc_lock_beside_the_operators_own() -> None:
    """What an RDMA device plugin's cluster needs (docs/gpu-clusters.md, "GPUs, drivers, RDMA and parallelism"):
    its resource on both containers (the trainer publishes, the rollout receives), requests equal to limits, and
    IPC_LOCK."""
    job = W().gpus(8).set("podTemplate", RDMA).set("checkpointEngine.transport", "rdma").job()
    pod = builders.build_pod(job, 0)
    for name, c in containers(pod).items():
        res = c["resources"]
        assert res["limits"]["rdma/hca_shared_devices_a"] == res["requests"]["rdma/hca_shared_devices_a"] == "1"
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}, name
    assert containers(pod)["trainer"]["resources"]["limits"]["nvidia.com/gpu"] == "8"  # the operator's, kept
    assert "cpu" in containers(pod)["rollout"]["resources"]["limits"]
    unchecked = PodTemplate.model_validate(RDMA)
    unchecked.spec.containers[0].resources.limits["nvidia.com/gpu"] = 1  # type: ignore[union-attr]
    with pytest.raises(pod_template.PodTemplateConflict, match=r"containers\[0\]\.resources\.limits: nvidia.com/gpu"):
        pod_template.merge(builders.build_pod(W().gpus(8).job(), 0), unchecked, set())


@pytest.mark.k8s
def test_pods_carry_the_overrides_and_are_placed_by_them(
    installed: ControlPlane, operator: OperatorProcess, ns: str
) -> None:
    cp, node, name = installed, "kwok-node-3", "placed"
    cp.apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": f"rl-{ns}"},
              "value": 1000})
    cp.apply([{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "rl-runner", "namespace": ns}},
              {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf-token", "namespace": ns},
               "stringData": {"token": "hf_secret"}}])
    cp.kubectl("label", "node", node, "tandem.test/gpu=h100")
    cp.kubectl("taint", "node", node, "dedicated=rl:NoSchedule")
    try:
        template = {
            "metadata": {"labels": {"team": "rl"}},
            "spec": {"nodeSelector": {"tandem.test/gpu": "h100"},
                     "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "rl", "effect": "NoSchedule"}],
                     "priorityClassName": f"rl-{ns}", "serviceAccountName": "rl-runner",
                     "imagePullSecrets": [{"name": "registry"}],
                     "containers": [{"name": "trainer", "env": [HF]}]},
        }
        doc = W(name, ns).small().replicas(2).set("podTemplate", template).obj()
        cp.kubectl("create", "-f", "-", input=json.dumps(doc))

        def bound() -> list[dict[str, Any]] | None:
            items = (get_json(cp, "pods", "-n", ns, "-l", f"tandem.dev/job={name}") or {}).get("items", [])
            return items if len(items) == 2 and all(p["spec"].get("nodeName") for p in items) else None

        for pod in wait_for("both pods bound", bound, 120):
            spec = pod["spec"]
            assert spec["nodeName"] == node  # the only node the selector and the toleration allow
            assert pod["metadata"]["labels"]["team"] == "rl"
            assert spec["priority"] == 1000 and spec["priorityClassName"] == f"rl-{ns}"  # resolved at admission
            assert spec["serviceAccountName"] == "rl-runner" and spec["imagePullSecrets"] == [{"name": "registry"}]
            trainer = next(c for c in spec["containers"] if c["name"] == "trainer")
            assert HF in trainer["env"] and trainer["env"][0]["name"].startswith("TANDEM_")
        out = cp.kubectl("patch", "rlhfjob", name, "-n", ns, "--type=merge", "-p",
                         json.dumps({"spec": {"podTemplate": {"spec": {"nodeSelector": {"tandem.test/gpu": "a100"}}}}}),
                         check=False)
        assert out.returncode != 0 and "podTemplate is immutable" in out.stderr, out.stderr
    finally:
        cp.kubectl("taint", "node", node, "dedicated=rl:NoSchedule-", check=False)
        cp.kubectl("label", "node", node, "tandem.test/gpu-", check=False)
        cp.kubectl("delete", "priorityclass", f"rl-{ns}", "--wait=false", check=False)


@pytest.mark.k8s
def test_an_rdma_job_is_placed_only_on_a_node_that_advertises_the_device(
    installed: ControlPlane, operator: OperatorProcess, ns: str
) -> None:
    cp, node, name, res = installed, "kwok-node-2", "rdma", "rdma/hca_shared_devices_a"
    patch = {"status": {"capacity": {res: "4"}, "allocatable": {res: "4"}}}
    cp.kubectl("patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps(patch))
    try:
        doc = W(name, ns).small().replicas(1).rollout_only(1).set("podTemplate", RDMA).obj()
        cp.kubectl("create", "-f", "-", input=json.dumps(doc))

        def bound() -> list[dict[str, Any]] | None:
            items = (get_json(cp, "pods", "-n", ns, "-l", f"tandem.dev/job={name}") or {}).get("items", [])
            return items if len(items) == 2 and all(p["spec"].get("nodeName") for p in items) else None

        for pod in wait_for("both pods bound", bound, 120):
            assert pod["spec"]["nodeName"] == node  # the only node with the device plugin's resource
            for c in containers(pod).values():
                assert c["resources"]["requests"][res] == "1"
    finally:
        gone = {"status": {"capacity": {res: None}, "allocatable": {res: None}}}
        cp.kubectl("patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps(gone), check=False)


def test_the_gpu_cluster_sample_builds_pods_for_its_cluster() -> None:
    """manifests/samples/gpu-cluster.yaml (validated with `tandem validate` in tests/cli, accepted by the
    API server in test_operator_volumes): what its pods end up with."""
    job = load_job(MANIFESTS / "samples" / "gpu-cluster.yaml")
    for pod in builders.build_pods(job):
        spec = pod["spec"]
        assert {"key": "dedicated", "value": "rl", "effect": "NoSchedule"} in spec["tolerations"]
        assert spec["tolerations"][0]["key"] == "nvidia.com/gpu"
        assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
        assert (spec["priorityClassName"], spec["imagePullSecrets"]) == ("rl-high", [{"name": "registry-creds"}])
        for c in containers(pod).values():
            assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}} in c["env"]
        assert containers(pod)["trainer"]["resources"]["limits"]["nvidia.com/gpu"] == "8"
