"""The chart's etcd TLS, the operator's etcd credentials and the opt-in NetworkPolicies: rendered by
the real helm, accepted by the real API server (server-side dry run), and selecting the pods the
builders really build."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from controlplane import ControlPlane
from harness import OPERATOR_NS, namespace_doc, render_chart
from wrappers import JobWrapper

from tandem.operator.manifests import builders

pytestmark = pytest.mark.k8s

SECURE = ("etcd.tls.enabled=true", "etcd.persistence.enabled=true", "operator.etcdClient.tlsSecret=op-etcd-tls",
          "operator.etcdClient.authSecret=op-etcd-user", "networkPolicy.enabled=true",
          "operator.watchNamespaces={team-a}")
PER_NAMESPACE = (*SECURE, "networkPolicy.scope=namespace")


def docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def one(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in objs if d["kind"] == kind and d["metadata"]["name"] == name)


def test_etcd_serves_tls_with_client_certificates_on_a_claim(k8s: ControlPlane) -> None:
    objs = docs(render_chart(k8s, *SECURE))
    etcd = one(objs, "StatefulSet", "tandem-etcd")["spec"]
    pod = etcd["template"]["spec"]
    args = pod["containers"][0]["command"]
    assert "--client-cert-auth" in args and "--trusted-ca-file=/etc/etcd/tls/ca.crt" in args
    assert f"--advertise-client-urls=https://tandem-etcd.{OPERATOR_NS}.svc:2379" in args
    assert pod["containers"][0]["readinessProbe"]["httpGet"]["port"] == 2381  # the plain metrics listener
    assert {"name": "tls", "secret": {"secretName": "tandem-etcd-tls"}} in pod["volumes"]
    assert not any(v["name"] == "data" for v in pod["volumes"])  # data lives on the claim
    assert etcd["volumeClaimTemplates"][0]["metadata"]["name"] == "data"

    operator = one(objs, "Deployment", "tandem-operator")["spec"]["template"]["spec"]
    env = {e["name"]: e for e in operator["containers"][0]["env"]}
    assert env["TANDEM_ETCD_ENDPOINTS"]["value"] == f"https://tandem-etcd.{OPERATOR_NS}.svc:2379"
    assert env["TANDEM_ETCD_CA_FILE"]["value"] == "/etc/tandem-etcd/ca.crt"
    assert env["TANDEM_ETCD_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "op-etcd-user", "key": "password"}
    assert {"name": "etcd-client-tls", "secret": {"secretName": "op-etcd-tls"}} in operator["volumes"]

    plain = docs(render_chart(k8s))
    assert not any(d["kind"] == "NetworkPolicy" for d in plain)
    plain_etcd = one(plain, "StatefulSet", "tandem-etcd")["spec"]["template"]["spec"]
    assert "--client-cert-auth" not in plain_etcd["containers"][0]["command"]


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_network_policies_select_the_job_pods_and_the_operator(k8s: ControlPlane) -> None:
    objs = docs(render_chart(k8s, *PER_NAMESPACE))
    etcd_np = one(objs, "NetworkPolicy", "tandem-etcd")
    jobs_np = one(objs, "NetworkPolicy", "tandem-job-pods")
    assert etcd_np["metadata"]["namespace"] == OPERATOR_NS and jobs_np["metadata"]["namespace"] == "team-a"

    job = JobWrapper("demo").meta("namespace", "team-a").replicas(1).rollout_only(1).job()
    pods = builders.build_pods(job, owner_uid="uid-1")
    operator_labels = one(objs, "Deployment", "tandem-operator")["spec"]["template"]["metadata"]["labels"]
    etcd_labels = one(objs, "StatefulSet", "tandem-etcd")["spec"]["template"]["metadata"]["labels"]
    assert _matches(etcd_np["spec"]["podSelector"]["matchLabels"], etcd_labels)
    for pod in pods:  # the job pods are what the job policy guards and what it lets in
        labels = pod["metadata"]["labels"]
        assert _matches(jobs_np["spec"]["podSelector"]["matchLabels"], labels)
        peers = jobs_np["spec"]["ingress"][0]["from"]
        assert _matches(peers[0]["podSelector"]["matchLabels"], labels)
        assert _matches(etcd_np["spec"]["ingress"][0]["from"][1]["podSelector"]["matchLabels"], labels)
    operator_peer = jobs_np["spec"]["ingress"][0]["from"][1]
    assert operator_peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": OPERATOR_NS}
    assert _matches(operator_peer["podSelector"]["matchLabels"], operator_labels)
    assert _matches(etcd_np["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"], operator_labels)
    assert etcd_np["spec"]["ingress"][0]["ports"] == [{"port": 2379, "protocol": "TCP"}]


def test_the_api_server_accepts_the_policies_and_a_job_pod_with_etcd_secrets(k8s: ControlPlane) -> None:
    for ns in (OPERATOR_NS, "team-a"):
        k8s.apply(namespace_doc(ns))
    objs = docs(render_chart(k8s, *PER_NAMESPACE))
    # a session that installed the chart holds a plain etcd StatefulSet, whose spec an apply may not change
    # (only its template): the secure one is checked as a new object, in another namespace
    one(objs, "StatefulSet", "tandem-etcd")["metadata"]["namespace"] = "team-a"
    out = k8s.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(objs)).stdout
    assert "networkpolicy.networking.k8s.io/tandem-etcd created (server dry run)" in out
    assert "networkpolicy.networking.k8s.io/tandem-job-pods created (server dry run)" in out
    assert "statefulset.apps/tandem-etcd created (server dry run)" in out

    job = JobWrapper("demo").meta("namespace", "team-a").replicas(1).job()
    job.spec.checkpoint_engine.etcd.tls_secret = "demo-etcd-tls"
    job.spec.checkpoint_engine.etcd.auth_secret = "demo-etcd-user"
    pods = builders.build_pods(job, owner_uid="uid-1")
    out = k8s.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(pods)).stdout
    assert "pod/demo-0 created (server dry run)" in out
