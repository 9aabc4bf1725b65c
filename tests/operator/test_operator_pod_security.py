"""Pod Security: every pod the operator builds passes the "restricted" profile (unit: the contexts on
every pod and container; control plane: the real PodSecurity admission of kube-apiserver admits a
job's pods in namespaces enforcing restricted and baseline, and the chart's own pods under
restricted), and pods the API server refuses show in the job's status and Events without a hot
retry loop (a hostPath volume under restricted, IPC_LOCK under baseline, an exhausted ResourceQuota).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
import yaml
from controlplane import ControlPlane
from harness import SERVICE_ACCOUNT, OperatorProcess, get_json, namespace_doc, render_chart, wait_for
from test_operator_cluster import create, events_of, phase_is, pods_of, running, small
from wrappers import JobWrapper

from tandem.operator.manifests import builders, pod_security
from tandem.spec.load import SpecError, parse_job

RESTRICTED_POD = pod_security.pod_context()
RESTRICTED_CONTAINER = pod_security.container_context()
IPC_LOCK = {"spec": {"containers": [{"name": "rollout", "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}}]}}


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return pod["spec"].get("initContainers", []) + pod["spec"]["containers"]


@pytest.mark.parametrize("template", [None, {"spec": {"containers": [{"name": "trainer", "env": [
    {"name": "A", "value": "1"}]}]}}], ids=["plain", "with-podTemplate"])
def test_every_pod_and_container_is_restricted(template: dict[str, Any] | None) -> None:
    w = JobWrapper().replicas(2).rollout_only(1)
    job = (w.set("podTemplate", template) if template else w).job()
    pods = builders.build_pods(job)
    assert [p["metadata"]["labels"]["tandem.dev/role"] for p in pods] == ["hybrid", "hybrid", "rollout"]
    for pod in pods:
        assert pod["spec"]["securityContext"] == RESTRICTED_POD
        assert pod["spec"]["automountServiceAccountToken"] is False
        assert [c["securityContext"] for c in containers(pod)] == [RESTRICTED_CONTAINER] * len(containers(pod))
    assert RESTRICTED_POD["runAsUser"] == RESTRICTED_POD["runAsGroup"] == RESTRICTED_POD["fsGroup"] == 10001


def test_images_run_as_the_user_the_pods_ask_for() -> None:
    from harness import ROOT

    for image in ("Dockerfile.megatron", "Dockerfile.vllm", "Dockerfile.operator"):
        text = (ROOT / image).read_text()
        assert "useradd --uid 10001" in text and "USER 10001" in text, image


def test_ipc_lock_is_added_to_the_named_container_only_and_drop_all_stays() -> None:
    pod = builders.build_pods(JobWrapper().set("podTemplate", IPC_LOCK).job())[0]
    by_name = {c["name"]: c["securityContext"] for c in containers(pod)}
    assert by_name["rollout"] == {"allowPrivilegeEscalation": False,
                                  "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]}}
    assert by_name["trainer"] == RESTRICTED_CONTAINER


def test_sidecars_never_read_a_service_account_token() -> None:
    from harness import ROOT

    for root in ("sidecars", "checkpoint_engine"):
        for path in (ROOT / root).rglob("*.py"):
            text = path.read_text()
            assert "serviceaccount" not in text.lower() and "load_incluster_config" not in text, path


@pytest.mark.parametrize(("security", "field"), [
    ({"capabilities": {"add": ["NET_ADMIN"]}}, "securityContext.capabilities.add"),
    ({"privileged": True}, "securityContext.privileged"),
    ({"allowPrivilegeEscalation": True}, "securityContext.allowPrivilegeEscalation"),
])
def test_broader_security_is_refused_offline_naming_the_field(security: dict[str, Any], field: str) -> None:
    doc = JobWrapper().set("podTemplate", {"spec": {"containers": [{"name": "trainer",
                                                                     "securityContext": security}]}}).obj()
    with pytest.raises(SpecError, match=f"spec.podTemplate.spec.containers.0.{field}"):
        parse_job(doc)


# ---- the real PodSecurity admission ----------------------------------------------------------------------


def labelled_namespace(cp: ControlPlane, level: str, prefix: str = "psa") -> str:
    name = f"{prefix}-{level}-{uuid.uuid4().hex[:6]}"
    doc = namespace_doc(name)
    doc["metadata"]["labels"] = {"pod-security.kubernetes.io/enforce": level,
                                 "pod-security.kubernetes.io/enforce-version": "latest"}
    cp.apply(doc)
    wait_for(f"default ServiceAccount in {name}",
             lambda: cp.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0)
    return name


@pytest.fixture
def restricted(installed: ControlPlane) -> Any:
    name = labelled_namespace(installed, "restricted")
    yield name
    installed.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def baseline(installed: ControlPlane) -> Any:
    name = labelled_namespace(installed, "baseline")
    yield name
    installed.kubectl("delete", "namespace", name, "--wait=false", check=False)


def bare_pod(ns: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"bare-{uuid.uuid4().hex[:6]}", "namespace": ns},
            "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec}}


def refused_by_admission(cp: ControlPlane, pod: dict[str, Any]) -> str:
    out = cp.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
    return out.stderr if out.returncode != 0 else ""


@pytest.mark.k8s
def test_pod_security_admission_is_on(installed: ControlPlane, restricted: str, baseline: str) -> None:
    assert 'violates PodSecurity "restricted:latest"' in refused_by_admission(installed, bare_pod(restricted))
    privileged = bare_pod(baseline)
    privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    assert 'violates PodSecurity "baseline:latest"' in refused_by_admission(installed, privileged)


@pytest.mark.k8s
@pytest.mark.parametrize("level", ["restricted", "baseline"])
def test_job_pods_are_admitted(installed: ControlPlane, operator: OperatorProcess, level: str,
                               request: pytest.FixtureRequest) -> None:
    ns = request.getfixturevalue(level)
    name = f"psa-{level}"
    create(installed, ns, small(name, replicas=1, rollout_only=1))
    pods = wait_for("2 running pods", lambda: running(installed, ns, name, 2), 60)
    wait_for("phase Running", lambda: phase_is(installed, ns, name, "Running", reason="PodsRunning"), 30)
    for pod in pods:
        assert pod["spec"]["securityContext"] == RESTRICTED_POD
        assert all(c["securityContext"] == RESTRICTED_CONTAINER for c in containers(pod))
        assert pod["spec"]["automountServiceAccountToken"] is False
        assert not any(v["name"].startswith("kube-api-access") for v in pod["spec"]["volumes"])


@pytest.mark.k8s
def test_chart_pods_pass_restricted(installed: ControlPlane, restricted: str) -> None:
    """The operator Deployment's and the etcd StatefulSet's pod templates, as pods in a namespace enforcing
    restricted: PodSecurity admission runs on a server-side dry run as on a real create."""
    docs = [d for d in yaml.safe_load_all(render_chart(installed)) if d and d["kind"] in ("Deployment", "StatefulSet")]
    assert {d["kind"] for d in docs} == {"Deployment", "StatefulSet"}
    installed.kubectl("create", "serviceaccount", SERVICE_ACCOUNT, "-n", restricted)  # the operator pod names it
    for d in docs:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": d["metadata"]["name"], "namespace": restricted},
               "spec": d["spec"]["template"]["spec"]}
        assert refused_by_admission(installed, pod) == "", d["kind"]


# ---- refusals show in the status, once, and are retried with backoff ---------------------------------------

def pod_refusals(cp: ControlPlane) -> float:
    """POST pods answered 403 so far, from kube-apiserver's own metrics."""
    total = 0.0
    for line in cp._get("/metrics").splitlines():
        if line.startswith("apiserver_request_total{") and 'resource="pods"' in line and 'verb="POST"' in line \
                and 'code="403"' in line and 'subresource=""' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def refused_status(cp: ControlPlane, ns: str, name: str, words: str) -> dict[str, Any] | None:
    st = phase_is(cp, ns, name, "Pending", reason="PodCreateRefused")
    return st if st and words in st["message"] else None


@pytest.mark.k8s
def test_hostpath_under_restricted_is_refused_and_shows(
    installed: ControlPlane, operator: OperatorProcess, restricted: str
) -> None:
    name = "hostpath"
    create(installed, restricted, small(name).volume("data", "/data", hostPath="/srv/data"))
    hostpath = 'restricted volume type "hostPath"'
    st = wait_for("PodCreateRefused", lambda: refused_status(installed, restricted, name, hostpath), 60)
    assert st["message"].startswith(f'pods "{name}-0" is forbidden: violates PodSecurity "restricted:latest"')
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"], ready["message"]) == ("False", "PodCreateRefused", st["message"])
    assert pods_of(installed, restricted, name) == []
    # no hot loop: the operator passes twice a second, but asks again only after the backoff (5 s, then 10 s)
    before, seen = pod_refusals(installed), time.monotonic()
    wait_for("the next create attempt", lambda: pod_refusals(installed) > before, 60)
    gap = time.monotonic() - seen
    assert gap >= 3, f"retried {gap:.1f}s after a refusal seen at most ~2 s after it happened"
    assert pod_refusals(installed) - before == 1
    assert events_of(installed, restricted, name).count(("Warning", "PodCreateRefused")) == 1
    # the namespace is relabelled privileged: the next retry creates the pod
    installed.kubectl("label", "namespace", restricted, "pod-security.kubernetes.io/enforce=privileged",
                      "--overwrite")
    wait_for("pod created after the backoff", lambda: running(installed, restricted, name, 1), 90)
    wait_for("Running", lambda: phase_is(installed, restricted, name, "Running", reason="PodsRunning"), 30)


@pytest.mark.k8s
def test_ipc_lock_needs_a_privileged_namespace(installed: ControlPlane, operator: OperatorProcess,
                                               baseline: str) -> None:
    name = "rdma"
    create(installed, baseline, small(name).set("podTemplate", IPC_LOCK))
    st = wait_for("PodCreateRefused", lambda: refused_status(installed, baseline, name, "IPC_LOCK"), 60)
    assert 'violates PodSecurity "baseline:latest"' in st["message"]


@pytest.mark.k8s
def test_exhausted_quota_is_refused_and_shows(installed: ControlPlane, operator: OperatorProcess, ns: str) -> None:
    installed.apply({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "pods", "namespace": ns},
                     "spec": {"hard": {"count/pods": "1"}}})
    wait_for("quota status", lambda: (get_json(installed, "resourcequota", "pods", "-n", ns) or {})
             .get("status", {}).get("hard"), 30)
    name = "quota"
    create(installed, ns, small(name, replicas=1, rollout_only=1))
    st = wait_for("PodCreateRefused", lambda: refused_status(installed, ns, name, "exceeded quota"), 60)
    assert "count/pods=1" in st["message"] or "count/pods" in st["message"]
    assert len(pods_of(installed, ns, name)) == 1
    # the operator posts its Event after the status patch that shows the refusal: it may be listed a moment later
    wait_for("the PodCreateRefused Event",
             lambda: ("Warning", "PodCreateRefused") in events_of(installed, ns, name), 30)
    installed.kubectl("patch", "resourcequota", "pods", "-n", ns, "--type=merge",
                      "-p", json.dumps({"spec": {"hard": {"count/pods": "4"}}}))
    wait_for("both pods after the quota grew", lambda: running(installed, ns, name, 2), 90)
    wait_for("Running", lambda: phase_is(installed, ns, name, "Running", reason="PodsRunning"), 30)
