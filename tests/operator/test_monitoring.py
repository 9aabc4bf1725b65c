"""The chart's monitors and Grafana dashboard against what the code really serves.

Every PromQL expression of the dashboard (panels and template variables) is read into its selectors and
grouping labels (`promql_refs`) and checked against the exposition of the real Prometheus registries the code
builds: the driver's (the loop's `LoopMetrics` fed an iteration's row and an evaluation, with its engine's
collector, as `checkpoint_engine.service.api.create_app` serves them on port ce-trainer), a rollout's (its engine's
collector, on ce-rollout) and the operator's (`tandem.operator.runtime.job_metrics` after a reconcile pass and a
failed one), plus the labels the monitors add (Prometheus's target labels and the monitors' relabelings). The
monitors' selectors, ports and relabelings are checked against the pods the operator's builders
really make and the chart's operator Deployment. Then the monitors pass the real API server's validation
with the Prometheus Operator's CRDs installed (fetched by scripts/fetch-monitoring-crds.sh).
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane import BIN_DIR, ControlPlane
from harness import CHART, OPERATOR_NS, RELEASE
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from promql_refs import legend_labels, literal_alternatives, refs
from wrappers import JobWrapper

from tandem.checkpoint_engine.service.engine_status import EngineStatus, Phase
from tandem.checkpoint_engine.service.metrics import engine_registry
from tandem.operator.manifests import builders
from tandem.operator.policies.plan import Plan
from tandem.operator.runtime import job_metrics as operator_metrics
from tandem.sidecars.trainer.observe.prom import LoopMetrics
from tandem.spec.status import JobStatus

MONITORING = ("monitoring.enabled=true", "monitoring.dashboard.enabled=true")
# what Prometheus (through the Prometheus Operator's generated config) puts on every scraped series
POD_TARGET_LABELS = {"namespace", "pod", "container", "endpoint", "instance", "job"}
SERVICE_TARGET_LABELS = POD_TARGET_LABELS | {"service"}
# served by the kubelet's cAdvisor, not by Tandem (the kube-prometheus-stack scrapes it): its labels
EXTERNAL = {"container_memory_working_set_bytes": {"namespace", "pod", "container", "id", "image", "name"}}
ROW = {"iteration": 2, "reward_mean": 0.4, "kl": 0.01, "switch_share": 0.2, "mismatch_mean": 1e-3, "mismatch_kl": 2e-4,
       "mismatch_ess": 0.99, "is_ess": 0.98, "staleness_mean": 0.5, "is_token_clipped_frac": 0.01,
       "mismatch_guard": {"streak": 1}, "seconds": {"rollout": 2.0, "train": 1.0, "sync": 0.3}, "total_seconds": 3.5,
       "completions": 64, "staleness_hist": {"0": 60, "1": 4}, "carried_share": 0.1, "wasted_tokens": 5,
       "dropped_completions": 1, "completion_tokens": 900, "rollouts": 2, "rollouts_dropped": 1, "prompts_resent": 3,
       "memory": {"phases": {"train": {"peak_rss_mib": 900.0}}}}
EVAL = {"iteration": 3, "pass_at_1": 0.5, "pass_at_k": 0.8}


def render(*values: str) -> list[dict[str, Any]]:
    helm = BIN_DIR / "helm"
    if not helm.exists():
        pytest.skip(f"helm missing ({helm}): run scripts/build-k8s.sh")
    sets = [a for v in values for a in ("--set", v)]
    out = subprocess.run([str(helm), "template", RELEASE, str(CHART), "--namespace", OPERATOR_NS, *sets],
                         capture_output=True, text=True, timeout=120, check=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@dataclass
class Served:
    """Sample names of one /metrics endpoint → their label names, and the label values seen."""

    labels: dict[str, set[str]] = field(default_factory=dict)
    values: dict[tuple[str, str], set[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, registry: CollectorRegistry) -> Served:
        got = cls()
        collectors = dict(registry._names_to_collectors)  # label names of families without samples yet
        for family in text_string_to_metric_families(generate_latest(registry).decode()):
            own = set(getattr(collectors.get(family.name), "_labelnames", ()))
            suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}.get(family.type, ("",))
            for suffix in suffixes:
                got.labels.setdefault(family.name + suffix, set()).update(own | ({"le"} if suffix == "_bucket" else
                                                                                 set()))
            for s in family.samples:
                got.labels.setdefault(s.name, set()).update(s.labels)
                for k, v in s.labels.items():
                    got.values.setdefault((s.name, k), set()).add(v)
        return got


class Core:
    def __init__(self, role: str) -> None:
        self.role = role

    def status(self) -> EngineStatus:
        return EngineStatus(role=self.role, phase=Phase.IDLE, version=3, timings={"update_s": 0.4}, restarts=1)


def endpoints() -> dict[str, Served]:
    """Port name → what is served there, from the real registries."""
    return {port: Served.of(registry) for port, registry in registries().items()}


def families() -> dict[str, set[str]]:
    """Port name → the metric families its registry exposes (with or without samples yet): what a live
    endpoint must serve too (tests/operator/test_operator_gang_resume.py scrapes a running job's)."""
    return {port: {f.name for f in text_string_to_metric_families(generate_latest(registry).decode())}
            for port, registry in registries().items()}


def registries() -> dict[str, CollectorRegistry]:
    """Port name → the registry served there, built as the code builds it."""
    loop = LoopMetrics()
    loop.observe(ROW)
    loop.observe_eval(EVAL)
    driver = engine_registry(Core("trainer"), loop.registry)  # as checkpoint_engine.service.api.create_app does
    st = JobStatus(phase="Running", iteration=3, reward_mean=0.4, last_sync_seconds=1.2)
    operator_metrics.record("team-a", "demo", Plan(status=st))
    try:
        with operator_metrics.observe_pass():
            raise RuntimeError("a failed pass")
    except RuntimeError:
        pass
    return {"ce-trainer": driver, "ce-rollout": engine_registry(Core("rollout")), "metrics": operator_metrics.REGISTRY}


@dataclass
class Scrape:
    """One monitor endpoint: what its port serves and the labels (and known values) the scrape adds."""

    served: Served
    labels: set[str]
    values: dict[str, set[str]]


def job_pods() -> list[dict[str, Any]]:
    job = JobWrapper("demo").meta("namespace", "team-a").replicas(2).rollout_only(1).set(
        "rewards", [{"type": "codeExec"}]).job()  # a sandbox container in each hybrid pod too
    return builders.build_pods(job)


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return list(pod["spec"].get("initContainers", [])) + list(pod["spec"]["containers"])


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def scrapes(objs: list[dict[str, Any]]) -> list[Scrape]:
    served, pods, out = endpoints(), job_pods(), []
    for mon in (o for o in objs if o["kind"] == "PodMonitor"):
        for ep in mon["spec"]["podMetricsEndpoints"]:
            chosen = [p for p in pods if selects(mon["spec"]["selector"], p["metadata"]["labels"])]
            relabeled = {r["targetLabel"]: r["sourceLabels"][0] for r in ep.get("relabelings", [])}
            values: dict[str, set[str]] = {"container": {c["name"] for p in chosen for c in containers(p)
                                                         if any(q["name"] == ep["port"] for q in c.get("ports", []))}}
            for target, source in relabeled.items():
                values[target] = {v for p in chosen for k, v in p["metadata"]["labels"].items()
                                  if source == "__meta_kubernetes_pod_label_" + re.sub(r"[^A-Za-z0-9_]", "_", k)}
            out.append(Scrape(served[ep["port"]], POD_TARGET_LABELS | set(relabeled), values))
    for mon in (o for o in objs if o["kind"] == "ServiceMonitor"):
        service = next(o for o in objs if o["kind"] == "Service" and selects(mon["spec"]["selector"],
                                                                               o["metadata"]["labels"]))
        for ep in mon["spec"]["endpoints"]:
            port = next(p for p in service["spec"]["ports"] if p["name"] == ep["port"])
            out.append(Scrape(served[port["targetPort"]], SERVICE_TARGET_LABELS, {}))
    return out


def problems(expr: str, seen: list[Scrape], legend: str = "") -> list[str]:
    """What `expr` asks for that no endpoint serves: names, labels, label values, grouping and legend labels."""
    found, known = [], set()
    every_container = {c["name"] for p in job_pods() for c in containers(p)}
    for sel in refs(expr).selectors:
        values: dict[str, set[str]] = {}
        if sel.metric == "up":  # Prometheus's own, one per target
            labels = set().union(*(s.labels for s in seen))
            for s in seen:
                for k, v in s.values.items():
                    values.setdefault(k, set()).update(v)
        elif sel.metric in EXTERNAL:
            labels, values = EXTERNAL[sel.metric], {"container": every_container}
        else:
            serving = [s for s in seen if sel.metric in s.served.labels]
            if not serving:
                found.append(f"{sel.metric}: served by no monitored endpoint")
                continue
            labels = set().union(*(s.served.labels[sel.metric] | s.labels for s in serving))
            for s in serving:
                for k, v in s.values.items():
                    values.setdefault(k, set()).update(v)
                for (name, k), v in s.served.values.items():
                    if name == sel.metric:
                        values.setdefault(k, set()).update(v)
        for label, op, value in sel.matchers:
            if label not in labels:
                found.append(f"{sel.metric}: no label {label} (has {sorted(labels)})")
            elif op == "=" and values.get(label) and value not in values[label]:
                found.append(f"{sel.metric}: {label}={value!r} never served (only {sorted(values[label])})")
            elif op == "=~" and "$" not in value and values.get(label) and (alts := literal_alternatives(value)):
                found += [f"{sel.metric}: {label}=~ {a!r} never served" for a in alts if a not in values[label]]
        known |= labels
    found += [f"{expr}: grouping label {g} on none of its series" for g in refs(expr).grouping - known]
    found += [f"legend {legend!r}: label {g} on none of its series" for g in legend_labels(legend) - known]
    return found


def dashboard(objs: list[dict[str, Any]]) -> dict[str, Any]:
    cm = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard"))
    return dict(json.loads(cm["data"]["tandem.json"]))


def test_every_query_of_the_dashboard_is_served() -> None:
    objs = render(*MONITORING)
    seen, board = scrapes(objs), dashboard(objs)
    found, targets, metrics = [], 0, set()
    for panel in board["panels"]:
        for t in panel["targets"]:
            targets += 1
            metrics |= {s.metric for s in refs(t["expr"]).selectors}
            found += [f"panel {panel['title']!r}: {p}" for p in problems(t["expr"], seen, t.get("legendFormat", ""))]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert {"namespace", "job"} <= set(variables)
    for name in ("namespace", "job"):
        m = re.fullmatch(r"label_values\((.*), *(\w+)\)", variables[name]["query"]["query"])
        assert m is not None, variables[name]
        found += [f"variable {name}: {p}" for p in problems(f"sum by ({m[2]}) ({m[1]})", seen)]
    assert not found, "\n".join(found)
    ours = metrics - {"up"} - set(EXTERNAL)
    print(f"{len(board['panels'])} panels, {targets} queries, {len(metrics)} metrics ({len(ours)} served by Tandem) "
          f"on {len(seen)} monitored endpoints: all served")
    assert len(board["panels"]) >= 10 and len(ours) >= 20


def test_the_checker_catches_a_wrong_name_label_or_value() -> None:
    seen = scrapes(render(*MONITORING))
    for wrong in ('tandem_trainer_reward{rlhfjob=~"$job"}',  # no such metric
                  'tandem_trainer_reward_mean{phase="train"}',  # no such label
                  'tandem_engine_version{role="driver"}',  # no such value
                  'sum by (step) (tandem_trainer_reward_mean)',  # grouping by a label it lacks
                  'up{container="trainers"}', 'tandem_rlhfjob_phase{phase="Paused"}'):
        assert problems(wrong, seen), wrong
    assert problems("tandem_trainer_reward_mean", seen, "{{rollout}}")  # a legend label it lacks
    assert not problems('tandem_engine_version{role="rollout", pod_role="rollout", rlhfjob="demo"}', seen)


def test_the_monitors_select_the_builders_pods_on_their_metrics_ports() -> None:
    objs = render(*MONITORING)
    pods = job_pods()
    monitors = {o["metadata"]["name"]: o for o in objs if o["kind"] in ("PodMonitor", "ServiceMonitor")}
    assert set(monitors) == {"tandem-driver", "tandem-rollouts", "tandem-operator"}
    driver = [p["metadata"]["name"] for p in pods if selects(monitors["tandem-driver"]["spec"]["selector"],
                                                             p["metadata"]["labels"])]
    assert driver == ["demo-0"]  # pod 0's trainer alone serves the loop's /metrics
    rollouts = [p for p in pods if selects(monitors["tandem-rollouts"]["spec"]["selector"], p["metadata"]["labels"])]
    assert [p["metadata"]["name"] for p in rollouts] == ["demo-0", "demo-1", "demo-2"]
    for name, container in (("tandem-driver", "trainer"), ("tandem-rollouts", "rollout")):
        (ep,) = monitors[name]["spec"]["podMetricsEndpoints"]
        for pod in (p for p in pods if selects(monitors[name]["spec"]["selector"], p["metadata"]["labels"])):
            holders = [c["name"] for c in containers(pod) if any(q["name"] == ep["port"] for q in c.get("ports", []))]
            assert holders == [container], (pod["metadata"]["name"], ep["port"], holders)
        for r in ep["relabelings"]:  # each source is a label the builders put on every pod
            assert any(r["sourceLabels"] == ["__meta_kubernetes_pod_label_" + re.sub(r"[^A-Za-z0-9_]", "_", k)]
                       for k in pods[0]["metadata"]["labels"]), r
    op = monitors["tandem-operator"]["spec"]
    service = next(o for o in objs if o["kind"] == "Service" and selects(op["selector"], o["metadata"]["labels"]))
    deploy = next(o for o in objs if o["kind"] == "Deployment")
    assert selects({"matchLabels": service["spec"]["selector"]}, deploy["spec"]["template"]["metadata"]["labels"])
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == op["endpoints"][0]["port"]]
    assert port["targetPort"] in {p["name"] for p in deploy["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert op["endpoints"][0]["honorLabels"] is True  # the operator's namespace/rlhfjob labels are the job's
    assert not any(o["kind"] in ("PodMonitor", "ServiceMonitor") or o["metadata"]["name"].endswith("-dashboard")
                   for o in render())  # off by default


def test_the_dashboard_is_a_configmap_the_grafana_sidecar_picks_up() -> None:
    cm = next(o for o in render("monitoring.dashboard.enabled=true", "monitoring.dashboard.namespace=grafana")
              if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "tandem-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1" and cm["metadata"]["namespace"] == "grafana"
    assert json.loads(cm["data"]["tandem.json"]) == json.loads((CHART / "dashboards" / "tandem.json").read_text())


def monitoring_crds() -> Path:
    out = subprocess.run([str(Path(__file__).parents[2] / "scripts" / "fetch-monitoring-crds.sh")],
                         capture_output=True, text=True, timeout=300, check=False)
    if out.returncode != 0:
        pytest.fail(f"scripts/fetch-monitoring-crds.sh failed: {out.stderr[-2000:]}")
    return Path(out.stdout.strip())


@pytest.mark.k8s
def test_the_monitors_pass_the_api_servers_validation(k8s: ControlPlane) -> None:
    """The Prometheus Operator's own CRDs on the real API server; the monitors rendered with every option
    (labels, job namespaces, policies) dry-run server side against them, and a broken one refused."""
    for crd in sorted(monitoring_crds().glob("*.yaml")):
        k8s.kubectl("apply", "--server-side", "-f", str(crd))
    for name in ("podmonitors", "servicemonitors"):
        k8s.kubectl("wait", "--for=condition=Established", f"crd/{name}.monitoring.coreos.com", "--timeout=60s")
    k8s.kubectl("create", "namespace", OPERATOR_NS, check=False)
    objs = [o for o in render(*MONITORING, "monitoring.labels.release=kube-prometheus-stack",
                              "monitoring.jobNamespaces={team-a,team-b}", "networkPolicy.enabled=true")
            if o["kind"] in ("PodMonitor", "ServiceMonitor", "NetworkPolicy", "Service", "ConfigMap")]
    assert sum(o["kind"] in ("PodMonitor", "ServiceMonitor") for o in objs) == 3
    out = k8s.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                                "items": objs}))
    for o in objs:
        kind, name = re.escape(o["kind"].lower()), re.escape(o["metadata"]["name"])
        # "unchanged"/"configured": another test of the session's control plane installed the chart's object already
        assert re.search(rf"^{kind}(\.[a-z0-9.]+)?/{name} (created|unchanged|configured) \(server dry run\)$",
                         out.stdout, re.M), out.stdout
    broken = next(o for o in objs if o["kind"] == "PodMonitor")
    broken = {**broken, "spec": {**broken["spec"], "podMetricsEndpoints": [{"port": "ce-trainer",
                                                                            "interval": "every minute"}]}}
    refused = k8s.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(broken), check=False)
    assert refused.returncode != 0 and "interval" in refused.stderr, refused.stderr
