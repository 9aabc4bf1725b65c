"""The per-job NetworkPolicy (`networkPolicy.scope: job`, the chart's default when policies are on):
what the chart renders for it (operator env, the one extra RBAC rule, no namespace-wide policy), the
policy selecting exactly one job's pods (another job's pods in the same namespace are neither guarded
by it nor let in), and the operator creating it on the real control plane with the RBAC that chart
grants, owned by the job."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane import ControlPlane
from harness import OperatorProcess, get_json, render_chart, wait_for
from test_chart_security import SECURE, _matches, docs, one
from wrappers import JobWrapper

from tandem.operator.manifests import builders
from tandem.operator.manifests.netpol_builder import build_network_policy
from tandem.operator.runtime.env_settings import ConfigError, OperatorConfig

PROMETHEUS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}


def test_a_jobs_policy_guards_and_admits_its_own_pods_only() -> None:
    job = JobWrapper("demo").meta("namespace", "team-a").replicas(2).rollout_only(1).job()
    other = JobWrapper("other").meta("namespace", "team-a").replicas(1).job()
    np = build_network_policy(job, owner_uid="uid-1", extra_from=[PROMETHEUS])
    spec = np["spec"]
    assert np["metadata"]["ownerReferences"][0]["uid"] == "uid-1" and spec["policyTypes"] == ["Ingress"]
    peers = spec["ingress"][0]["from"]
    assert peers[1] == PROMETHEUS and "ports" not in spec["ingress"][0]  # collectives pick random ports
    for pod in builders.build_pods(job, owner_uid="uid-1"):
        assert _matches(spec["podSelector"]["matchLabels"], pod["metadata"]["labels"])
        assert _matches(peers[0]["podSelector"]["matchLabels"], pod["metadata"]["labels"])
    for pod in builders.build_pods(other, owner_uid="uid-2"):
        assert not _matches(spec["podSelector"]["matchLabels"], pod["metadata"]["labels"])
        assert not _matches(peers[0]["podSelector"]["matchLabels"], pod["metadata"]["labels"])


def test_the_scraper_gets_the_metrics_ports_and_nothing_else() -> None:
    """monitoring.scraper: a rule of its own, on the named ports the builders give the /metrics servers."""
    job = JobWrapper("demo").replicas(2).rollout_only(1).job()
    ingress = build_network_policy(job, extra_from=[], scrape_from=[PROMETHEUS])["spec"]["ingress"]
    assert len(ingress) == 2 and ingress[1]["from"] == [PROMETHEUS]
    ports = [p["port"] for p in ingress[1]["ports"]]
    served = {p["name"] for pod in builders.build_pods(job) for c in pod["spec"]["containers"]
              + pod["spec"].get("initContainers", []) for p in c.get("ports", [])}
    assert ports == ["ce-trainer", "ce-rollout"] and set(ports) <= served
    assert PROMETHEUS not in ingress[0]["from"]  # not on the collectives' or the shard server's ports
    assert len(build_network_policy(job)["spec"]["ingress"]) == 1  # monitoring off: no rule
    env = {"TANDEM_NETWORK_POLICY_SCRAPE_FROM": json.dumps([PROMETHEUS])}
    assert OperatorConfig.from_env(env).network_policy_scrape_from == (PROMETHEUS,)


def test_operator_settings_of_the_policy() -> None:
    env = {"TANDEM_JOB_NETWORK_POLICY": "true", "TANDEM_NETWORK_POLICY_EXTRA_FROM": json.dumps([PROMETHEUS])}
    config = OperatorConfig.from_env(env)
    assert config.job_network_policy and config.network_policy_extra_from == (PROMETHEUS,)
    assert not OperatorConfig.from_env({}).job_network_policy
    with pytest.raises(ConfigError, match="TANDEM_NETWORK_POLICY_EXTRA_FROM: must be a JSON list"):
        OperatorConfig.from_env({"TANDEM_NETWORK_POLICY_EXTRA_FROM": '{"podSelector": {}}'})
    with pytest.raises(ConfigError, match="TANDEM_JOB_NETWORK_POLICY='yes'"):
        OperatorConfig.from_env({"TANDEM_JOB_NETWORK_POLICY": "yes"})


def rendered(cp: ControlPlane) -> list[dict[str, Any]]:
    return docs(render_chart(cp, *SECURE, "networkPolicy.extraFrom[0].namespaceSelector.matchLabels"
                                          ".kubernetes\\.io/metadata\\.name=monitoring"))


@pytest.mark.k8s
def test_the_chart_hands_the_operator_the_policy_and_only_the_rule_it_needs(k8s: ControlPlane) -> None:
    objs = rendered(k8s)
    assert not any(d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "tandem-job-pods" for d in objs)
    env = {e["name"]: e.get("value") for e in
           one(objs, "Deployment", "tandem-operator")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["TANDEM_JOB_NETWORK_POLICY"] == "true"
    assert json.loads(env["TANDEM_NETWORK_POLICY_EXTRA_FROM"] or "") == [PROMETHEUS]
    rules = one(objs, "Role", "tandem-operator")["rules"]
    assert [r for r in rules if r["apiGroups"] == ["networking.k8s.io"]] == [
        {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["create"]}]
    plain = docs(render_chart(k8s))  # policies off: no rule, no env
    plain_rules = one(plain, "ClusterRole", "tandem-operator")["rules"]
    assert not any(r["apiGroups"] == ["networking.k8s.io"] for r in plain_rules)


@pytest.fixture
def policy_operator(k8s: ControlPlane, operator: OperatorProcess, operator_kubeconfig: Path, etcd_server: Any,
                    tmp_path: Path) -> Iterator[OperatorProcess]:
    """The session's operator replaced by one with the chart's policy settings and its RBAC (the
    cluster-wide role as the chart renders it with policies on), restored afterwards."""
    objs = docs(render_chart(k8s, "networkPolicy.enabled=true"))
    role = one(objs, "ClusterRole", "tandem-operator")
    env = {e["name"]: e["value"] for e in
           one(objs, "Deployment", "tandem-operator")["spec"]["template"]["spec"]["containers"][0]["env"]
           if e["name"] in ("TANDEM_JOB_NETWORK_POLICY", "TANDEM_NETWORK_POLICY_EXTRA_FROM")}
    k8s.kubectl("apply", "-f", "-", input=yaml.safe_dump(role))
    operator.stop()
    proc = OperatorProcess(operator_kubeconfig, etcd_server.endpoint, tmp_path / "op.log", env_extra=env).start()
    try:
        yield proc
    finally:
        proc.stop()
        print(f"operator log tail:\n{proc.tail(30)}")
        plain = one(docs(render_chart(k8s)), "ClusterRole", "tandem-operator")
        k8s.kubectl("apply", "-f", "-", input=yaml.safe_dump(plain))
        operator.start()


@pytest.mark.k8s
def test_the_operator_creates_each_jobs_policy_with_the_charts_rbac(
    k8s: ControlPlane, policy_operator: OperatorProcess, ns: str
) -> None:
    doc = JobWrapper("guarded", ns).small().replicas(1).obj()
    k8s.kubectl("create", "-f", "-", input=json.dumps(doc))
    uid = get_json(k8s, "rlhfjob", "guarded", "-n", ns)["metadata"]["uid"]
    np = wait_for("the job's NetworkPolicy", lambda: get_json(k8s, "networkpolicy", "guarded-pods", "-n", ns), 60)
    assert np["metadata"]["ownerReferences"][0]["uid"] == uid
    assert np["spec"]["podSelector"] == {"matchLabels": {"tandem.dev/job": "guarded"}}
    pod = wait_for("the job's pod", lambda: get_json(k8s, "pod", "guarded-0", "-n", ns), 60)
    assert _matches(np["spec"]["podSelector"]["matchLabels"], pod["metadata"]["labels"])
