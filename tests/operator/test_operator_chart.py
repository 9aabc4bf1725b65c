"""The Helm chart with the real helm binary, and its rendered manifests against the real API server."""

from __future__ import annotations

import pytest
import yaml
from controlplane import ControlPlane
from harness import MANIFESTS, OPERATOR_NS, SERVICE_ACCOUNT, helm, render_chart, render_manifests

pytestmark = pytest.mark.k8s
SA = f"system:serviceaccount:{OPERATOR_NS}:{SERVICE_ACCOUNT}"


def kinds(text: str) -> list[tuple[str, str, str]]:
    docs = [d for d in yaml.safe_load_all(text) if d]
    return [(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]) for d in docs]


def test_kubectl_get_nodes_shows_the_simulated_gpu_nodes(k8s: ControlPlane) -> None:
    out = k8s.kubectl("get", "nodes").stdout
    assert out.count("kwok-node-") == 4 and "Ready" in out
    gpus = k8s.kubectl("get", "node", "kwok-node-0", "-o", "jsonpath={.status.allocatable.nvidia\\.com/gpu}")
    assert gpus.stdout == "8"


def test_helm_lint(k8s: ControlPlane) -> None:
    out = helm(k8s, "lint", "--strict", str(MANIFESTS.parent / "helm" / "tandem"))
    assert "1 chart(s) linted, 0 chart(s) failed" in out


def test_committed_manifests_equal_the_chart_render(k8s: ControlPlane) -> None:
    assert (MANIFESTS / "tandem.yaml").read_text() == render_manifests(k8s), (
        "manifests/tandem.yaml is stale: regenerate with `python tests/operator/render_manifests.py`"
    )


def test_default_render_holds_crd_rbac_deployment_and_etcd(k8s: ControlPlane) -> None:
    objs = kinds(render_chart(k8s))
    assert ("CustomResourceDefinition", "", "rlhfjobs.tandem.dev") in objs
    assert ("ServiceAccount", OPERATOR_NS, SERVICE_ACCOUNT) in objs
    assert ("ClusterRole", "", "tandem-operator") in objs and (
        "ClusterRoleBinding",
        "",
        "tandem-operator",
    ) in objs
    assert ("Deployment", OPERATOR_NS, "tandem-operator") in objs
    assert ("StatefulSet", OPERATOR_NS, "tandem-etcd") in objs and (
        "Service",
        OPERATOR_NS,
        "tandem-etcd",
    ) in objs
    deploy = next(d for d in yaml.safe_load_all(render_chart(k8s)) if d and d["kind"] == "Deployment")
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TANDEM_ETCD_ENDPOINTS"] == f"http://tandem-etcd.{OPERATOR_NS}.svc:2379"
    # two replicas, one leading through the chart's Lease (tests/operator/test_operator_leader.py)
    assert deploy["spec"]["replicas"] == 2 and "--leader-elect" in container["args"]
    assert env["TANDEM_LEADER_LEASE"] == "tandem-operator-leader" and "strategy" not in deploy["spec"]
    assert ("Role", OPERATOR_NS, "tandem-operator-leader") in objs
    template = deploy["spec"]["template"]
    ports = {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}
    assert env["TANDEM_METRICS_PORT"] == "8081" and ports["metrics"] == 8081
    assert template["metadata"]["annotations"]["prometheus.io/port"] == "8081"


def test_leader_election_off_renders_one_replica_recreated(k8s: ControlPlane) -> None:
    docs = [d for d in yaml.safe_load_all(render_chart(k8s, "operator.leaderElection.enabled=false")) if d]
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    assert deploy["spec"]["replicas"] == 1 and deploy["spec"]["strategy"] == {"type": "Recreate"}
    assert "--leader-elect" not in deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not any(d["kind"] == "Role" and d["metadata"]["name"] == "tandem-operator-leader" for d in docs)


def test_metrics_port_zero_renders_no_endpoint(k8s: ControlPlane) -> None:
    deploy = next(d for d in yaml.safe_load_all(render_chart(k8s, "operator.metricsPort=0"))
                  if d and d["kind"] == "Deployment")
    template = deploy["spec"]["template"]
    assert "annotations" not in template["metadata"]
    assert [p["name"] for p in template["spec"]["containers"][0]["ports"]] == ["health"]


def test_watch_namespaces_renders_roles_only_there(k8s: ControlPlane) -> None:
    objs = kinds(
        render_chart(
            k8s,
            "operator.watchNamespaces={team-a,team-b}",
            "etcd.enabled=false",
            "operator.etcdEndpoints={http://etcd.example:2379}",
        )
    )
    assert ("Role", "team-a", "tandem-operator") in objs and (
        "RoleBinding",
        "team-b",
        "tandem-operator",
    ) in objs
    assert ("ClusterRole", "", "tandem-operator") not in objs
    assert not [o for o in objs if o[2] == "tandem-etcd"]


def test_scheduling_values_reach_the_operator_and_etcd_pods(k8s: ControlPlane) -> None:
    text = render_chart(k8s, "priorityClassName=infra-critical", "nodeSelector.pool=infra",
                        "tolerations[0].key=dedicated", "tolerations[0].operator=Exists",
                        "imagePullSecrets[0].name=registry-creds")
    pods = {d["kind"]: d["spec"]["template"]["spec"] for d in yaml.safe_load_all(text)
            if d and d["kind"] in ("Deployment", "StatefulSet")}
    assert set(pods) == {"Deployment", "StatefulSet"}
    for spec in pods.values():
        assert spec["priorityClassName"] == "infra-critical" and spec["nodeSelector"] == {"pool": "infra"}
        assert spec["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
        assert spec["imagePullSecrets"] == [{"name": "registry-creds"}]
    default = {d["kind"]: d["spec"]["template"]["spec"] for d in yaml.safe_load_all(render_chart(k8s))
               if d and d["kind"] in ("Deployment", "StatefulSet")}
    assert not any("priorityClassName" in s or "nodeSelector" in s for s in default.values())


def test_render_refuses_no_etcd_at_all(k8s: ControlPlane) -> None:
    with pytest.raises(AssertionError, match="set operator.etcdEndpoints or etcd.enabled=true"):
        render_chart(k8s, "etcd.enabled=false")


def test_rendered_manifests_pass_server_side_dry_run(k8s: ControlPlane) -> None:
    text = render_chart(k8s, "operator.watchNamespaces={default}")
    k8s.apply(
        yaml.safe_load(
            yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NS}})
        )
    )
    out = k8s.kubectl("apply", "--dry-run=server", "-f", "-", input=text).stdout
    assert "role.rbac.authorization.k8s.io/tandem-operator created (server dry run)" in out
    assert "deployment.apps/tandem-operator created (server dry run)" in out or "configured" in out


@pytest.mark.parametrize(
    ("verb", "resource", "allowed"),
    [
        ("create", "pods", True),
        ("delete", "pods", True),
        ("watch", "pods", True),
        ("patch", "pods", True),  # labels: a rollout-only pod kept through a gang restart joins its generation
        ("update", "pods", False),
        ("patch", "rlhfjobs.tandem.dev", True),
        ("patch", "rlhfjobs.tandem.dev/status", True),
        ("create", "secrets", True),
        ("create", "configmaps", True),
        # the job document is an immutable ConfigMap named by its content: no ConfigMap anywhere is changed
        ("patch", "configmaps", False),
        ("update", "configmaps", False),
        ("get", "configmaps", False),
        ("create", "events", True),
        ("list", "customresourcedefinitions", True),
        ("get", "secrets", False),
        ("list", "secrets", False),
        ("delete", "services", False),
        ("delete", "rlhfjobs.tandem.dev", False),
        ("create", "deployments", False),
        # pod templates name ServiceAccounts, PriorityClasses and Secrets the API server resolves at pod
        # admission: the operator needs none of them
        ("create", "serviceaccounts", False),
        ("get", "serviceaccounts", False),
        ("get", "priorityclasses.scheduling.k8s.io", False),
        ("update", "nodes", False),
        # spec.gangScheduling: create the Workload and PodGroups, delete an earlier gang's PodGroup
        ("create", "workloads.scheduling.k8s.io", True),
        ("create", "podgroups.scheduling.k8s.io", True),
        ("delete", "podgroups.scheduling.k8s.io", True),
        ("delete", "workloads.scheduling.k8s.io", False),
        ("update", "podgroups.scheduling.k8s.io", False),
        # each job's PodDisruptionBudget over its hybrid pods: created, deleted when the job opts out
        ("create", "poddisruptionbudgets.policy", True),
        ("delete", "poddisruptionbudgets.policy", True),
        ("update", "poddisruptionbudgets.policy", False),
    ],
)
def test_operator_rbac_is_least_privilege(
    installed: ControlPlane, verb: str, resource: str, allowed: bool
) -> None:
    out = installed.kubectl("auth", "can-i", verb, resource, "--as", SA, "-n", "default", check=False)
    assert out.stdout.strip() == ("yes" if allowed else "no"), out.stderr
