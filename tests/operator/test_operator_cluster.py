"""The operator against the real control plane, with the chart ServiceAccount's credentials.

Lifecycle of a sample job, status from etcd progress, gang restarts up to maxRestarts, suspend and
resume, operator killed mid-reconcile, deletion cleaning etcd, immutable fields.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane import ControlPlane
from harness import MANIFESTS, OperatorProcess, etcd_keys, etcd_put, get_json, wait_for
from wrappers import JobWrapper

from tandem.checkpoint_engine.etcd import keys
from tandem.spec.progress import EvalSummary, Progress

pytestmark = pytest.mark.k8s
OUT = Path("/tmp/tandem-operator-evidence")


def create(cp: ControlPlane, ns: str, job: JobWrapper | dict[str, Any]) -> dict[str, Any]:
    doc = job.obj() if isinstance(job, JobWrapper) else job
    doc["metadata"]["namespace"] = ns
    cp.kubectl("create", "-f", "-", input=json.dumps(doc))
    return get_json(cp, "rlhfjob", doc["metadata"]["name"], "-n", ns)


def job_of(cp: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    return get_json(cp, "rlhfjob", name, "-n", ns) or {}


def status_of(cp: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    return job_of(cp, ns, name).get("status") or {}


def pods_of(cp: ControlPlane, ns: str, name: str) -> list[dict[str, Any]]:
    return (get_json(cp, "pods", "-n", ns, "-l", f"tandem.dev/job={name}") or {}).get("items", [])


def job_documents(cp: ControlPlane, ns: str, name: str) -> list[dict[str, Any]]:
    """The job's document ConfigMaps (`<job>-spec-<hash>`, one per distinct document)."""
    items = (get_json(cp, "configmaps", "-n", ns, "-l", f"tandem.dev/job={name}") or {}).get("items", [])
    return [c for c in items if c["metadata"]["name"].startswith(f"{name}-spec-")]


def running(cp: ControlPlane, ns: str, name: str, n: int, generation: int = 0) -> list[dict[str, Any]] | None:
    pods = pods_of(cp, ns, name)
    ok = len(pods) == n and all(
        p["status"].get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
        and p["metadata"]["labels"]["tandem.dev/restart-generation"] == str(generation)
        for p in pods
    )
    return pods if ok else None


def phase_is(cp: ControlPlane, ns: str, name: str, phase: str, **fields: Any) -> dict[str, Any] | None:
    st = status_of(cp, ns, name)
    return st if st.get("phase") == phase and all(st.get(k) == v for k, v in fields.items()) else None


def events_of(cp: ControlPlane, ns: str, name: str) -> list[tuple[str, str]]:
    items = (get_json(cp, "events", "-n", ns, "--field-selector", f"involvedObject.name={name}") or {}).get(
        "items", []
    )
    return [(e["type"], e["reason"]) for e in items]


def fail_pod(cp: ControlPlane, ns: str, pod: str) -> None:
    cp.kubectl(
        "patch",
        "pod",
        pod,
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"phase": "Failed", "reason": "Evicted", "message": "test"}}),
    )


def small(name: str, replicas: int = 1, rollout_only: int = 0) -> JobWrapper:
    return JobWrapper(name).small().replicas(replicas).rollout_only(rollout_only)


def test_sample_job_runs_and_status_follows_etcd_progress(
    k8s: ControlPlane, operator: OperatorProcess, ns: str, etcd_server: Any
) -> None:
    sample = yaml.safe_load((MANIFESTS / "samples" / "qwen-grpo.yaml").read_text())
    job = create(k8s, ns, sample)
    uid, name = job["metadata"]["uid"], "qwen-grpo"
    owned = {"kind": "RLHFJob", "name": name, "uid": uid, "controller": True}
    document = wait_for("job document", lambda: job_documents(k8s, ns, name), 30)[0]["metadata"]["name"]
    for kind, obj in (("service", name), ("configmap", document), ("secret", f"{name}-token")):
        got = wait_for(f"{kind}/{obj}", lambda k=kind, o=obj: get_json(k8s, k, o, "-n", ns), 30)
        assert owned.items() <= got["metadata"]["ownerReferences"][0].items()
    pods = wait_for("2 running pods", lambda: running(k8s, ns, name, 2), 60)
    for pod in pods:
        assert owned.items() <= pod["metadata"]["ownerReferences"][0].items()
        assert pod["spec"]["nodeName"].startswith("kwok-node-")
        assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    wait_for("phase Running", lambda: phase_is(k8s, ns, name, "Running"), 30)

    progress = Progress(
        phase="train",
        iteration=2,
        iterations=200,
        weight_version=1,
        reward_mean=0.5,
        updated_at=1000.0,
    )
    uid = job_of(k8s, ns, name)["metadata"]["uid"]  # the job's records live under its uid
    etcd_put(etcd_server.endpoint, keys.progress(ns, keys.scope(name, uid)), progress.to_json())
    wait_for("first progress record", lambda: phase_is(k8s, ns, name, "Running", iteration=2), 30)
    progress = Progress(  # 10 iterations in 20 s since the first record (the driver's clock)
        phase="train",
        iteration=12,
        iterations=200,
        weight_version=11,
        last_sync_seconds=2.5,
        reward_mean=0.75,
        eval=EvalSummary(iteration=10, weight_version=10, pass_at_1=0.4, pass_at_k=0.6, k=4, prompts=256),
        updated_at=1020.0,
    )
    etcd_put(etcd_server.endpoint, keys.progress(ns, keys.scope(name, uid)), progress.to_json())
    st = wait_for(
        "status from etcd", lambda: phase_is(k8s, ns, name, "Running", iteration=12, rewardMean=0.75), 30
    )
    assert st["weightVersion"] == 11 and st["lastSyncSeconds"] == 2.5
    assert st["eval"] == {"iteration": 10, "passAt1": 0.4, "passAtK": 0.6, "k": 4}
    assert {c["type"]: (c["status"], c["reason"]) for c in st["conditions"]}["Ready"] == ("True", "PodsRunning")
    assert all(c["observedGeneration"] == job["metadata"]["generation"] for c in st["conditions"])
    assert {k: st["progress"][k] for k in ("percent", "iterationsPerSecond", "etaSeconds", "eta")} == {
        "percent": 6.0, "iterationsPerSecond": 0.5, "etaSeconds": 376, "eta": "6m16s"}

    table = k8s.kubectl("get", "rlhfjobs", "-n", ns).stdout
    header, row = table.splitlines()[:2]
    assert header.split() == ["NAME", "PHASE", "REASON", "ITERATION", "REWARD", "EVAL", "SYNC(S)", "PROGRESS", "ETA",
                              "AGE"]
    assert row.split()[:9] == [name, "Running", "PodsRunning", "12", "0.75", "0.4", "2.5", "6", "6m16s"]
    OUT.mkdir(exist_ok=True)
    pods_table = k8s.kubectl("get", "pods", "-n", ns, "-o", "wide").stdout
    (OUT / "kubectl-get-rlhfjobs.txt").write_text(
        f"$ kubectl get rlhfjobs\n{table}\n$ kubectl get pods -o wide\n{pods_table}"
    )
    assert {("Normal", "Pending"), ("Normal", "Running")} <= set(events_of(k8s, ns, name))

    # the same state on the operator's Prometheus endpoint
    from prometheus_client.parser import text_string_to_metric_families

    def sample(metric: str, **labels: str) -> float | None:
        for family in text_string_to_metric_families(operator.metrics()):
            for s in family.samples:
                if s.name == metric and labels.items() <= s.labels.items():
                    return float(s.value)
        return None

    job = {"namespace": ns, "rlhfjob": name}
    assert sample("tandem_rlhfjob_phase", phase="Running", **job) == 1.0
    assert sample("tandem_rlhfjob_phase", phase="Pending", **job) == 0.0
    assert sample("tandem_rlhfjob_iteration", **job) == 12 and sample("tandem_rlhfjob_weight_version", **job) == 11
    assert sample("tandem_rlhfjob_reward_mean", **job) == 0.75
    assert (sample("tandem_pods_created_total") or 0) >= 2
    assert (sample("tandem_reconcile_seconds_count") or 0) >= 1


def test_gang_restart_counts_restarts_then_fails(
    k8s: ControlPlane, operator: OperatorProcess, ns: str
) -> None:
    name = "gang"
    create(k8s, ns, small(name, replicas=2).failure_policy(max_restarts=2, backoff_seconds=1))
    wait_for("gen 0 running", lambda: running(k8s, ns, name, 2, 0), 60)
    wait_for("Running", lambda: phase_is(k8s, ns, name, "Running"), 30)
    token = get_json(k8s, "secret", f"{name}-token", "-n", ns)["data"]["token"]

    fail_pod(k8s, ns, f"{name}-1")  # a failed pod restarts the whole gang
    wait_for("restart 1", lambda: status_of(k8s, ns, name).get("restarts") == 1, 30)
    wait_for("gen 1 running", lambda: running(k8s, ns, name, 2, 1), 60)
    wait_for("Running after restart 1", lambda: phase_is(k8s, ns, name, "Running", restarts=1), 30)

    k8s.kubectl("delete", "pod", f"{name}-0", "-n", ns, "--wait=false")  # a vanished pod counts too
    wait_for("gen 2 running", lambda: running(k8s, ns, name, 2, 2), 60)
    wait_for("Running after restart 2", lambda: phase_is(k8s, ns, name, "Running", restarts=2), 30)

    fail_pod(k8s, ns, f"{name}-0")  # maxRestarts (2) reached: Failed, pods removed
    st = wait_for("Failed", lambda: phase_is(k8s, ns, name, "Failed", restarts=2), 30)
    assert "maxRestarts (2) reached" in st["message"]
    assert {c["type"]: c["status"] for c in st["conditions"]}["Failed"] == "True"
    wait_for("pods gone", lambda: not pods_of(k8s, ns, name), 60)
    assert get_json(k8s, "secret", f"{name}-token", "-n", ns)["data"]["token"] == token  # created once, kept
    assert {("Warning", "Restarting"), ("Warning", "Failed")} <= set(events_of(k8s, ns, name))


def test_suspend_deletes_pods_and_resume_recreates_them(
    k8s: ControlPlane, operator: OperatorProcess, ns: str
) -> None:
    name = "pause"
    create(k8s, ns, small(name, replicas=1, rollout_only=1))
    wait_for("running", lambda: running(k8s, ns, name, 2), 60)
    k8s.kubectl("patch", "rlhfjob", name, "-n", ns, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_for("Suspended", lambda: phase_is(k8s, ns, name, "Suspended"), 30)
    wait_for("pods gone", lambda: not pods_of(k8s, ns, name), 60)
    k8s.kubectl("patch", "rlhfjob", name, "-n", ns, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    wait_for("running again, a new gang", lambda: running(k8s, ns, name, 2, generation=1), 60)
    wait_for("Running, no restart counted", lambda: phase_is(k8s, ns, name, "Running", restarts=0, suspensions=1), 30)
    assert ("Normal", "Suspended") in events_of(k8s, ns, name)


def test_operator_killed_mid_reconcile_converges_without_duplicates(
    k8s: ControlPlane, operator: OperatorProcess, ns: str
) -> None:
    names = [f"crash-{i}" for i in range(3)]
    for name in names:
        create(k8s, ns, small(name, replicas=2, rollout_only=1))
    wait_for("some pods created", lambda: pods_of(k8s, ns, names[0]), 30, every=0.05)
    operator.kill()  # SIGKILL in the middle of creating the three gangs
    operator.start()
    for name in names:
        pods = wait_for(f"{name} running", lambda n=name: running(k8s, ns, n, 3), 90)
        assert sorted(p["metadata"]["name"] for p in pods) == [f"{name}-{i}" for i in range(3)]
        wait_for(f"{name} Running", lambda n=name: phase_is(k8s, ns, n, "Running", restarts=0), 30)

    fail_pod(k8s, ns, f"{names[0]}-1")  # now kill it again right after it begins a gang restart (a hybrid pod)
    wait_for("Restarting", lambda: status_of(k8s, ns, names[0]).get("restarts") == 1, 30, every=0.05)
    operator.kill()
    operator.start()
    wait_for("gen 1 running", lambda: running(k8s, ns, names[0], 3, 1), 90)
    wait_for("one restart only", lambda: phase_is(k8s, ns, names[0], "Running", restarts=1), 30)
    assert len(pods_of(k8s, ns, names[0])) == 3
    for name in names[1:]:
        assert phase_is(k8s, ns, name, "Running", restarts=0) and running(k8s, ns, name, 3, 0)


def test_deletion_removes_the_jobs_etcd_keys_and_owned_objects(
    k8s: ControlPlane, operator: OperatorProcess, ns: str, etcd_server: Any
) -> None:
    name, other = "gone", "stays"
    create(k8s, ns, small(name))
    wait_for("running", lambda: running(k8s, ns, name, 1), 60)
    assert job_documents(k8s, ns, name)
    job = job_of(k8s, ns, name)
    assert "tandem.dev/cleanup" in job["metadata"]["finalizers"]
    mine = keys.scope(name, job["metadata"]["uid"])
    newer = keys.scope(name, "uid-of-a-later-job")  # a job of the same name created after: not ours
    for key in (
        keys.progress(ns, mine),
        keys.version(ns, mine, 3),
        keys.shard(ns, mine, 3, 0),
        keys.progress(ns, newer),
        keys.progress(ns, keys.scope(other, "x")),
    ):
        etcd_put(etcd_server.endpoint, key, "{}")
    k8s.kubectl("delete", "rlhfjob", name, "-n", ns, "--timeout=60s")
    assert etcd_keys(etcd_server.endpoint, keys.job_prefix(ns, mine)) == []
    assert etcd_keys(etcd_server.endpoint, keys.job_prefix(ns, name)) == [keys.progress(ns, newer)]
    assert etcd_keys(etcd_server.endpoint, keys.job_prefix(ns, other)) == [keys.progress(ns, keys.scope(other, "x"))]
    wait_for("job documents collected", lambda: not job_documents(k8s, ns, name), 60)
    for kind, obj in (("service", name), ("secret", f"{name}-token")):
        wait_for(f"{kind} collected", lambda k=kind, o=obj: get_json(k8s, k, o, "-n", ns) is None, 60)
    wait_for("pods collected", lambda: not pods_of(k8s, ns, name), 60)


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"replicas": 3}, "replicas"),
        ({"gpusPerPod": 4}, "gpusPerPod"),
        ({"model": {"path": "/other"}}, "model"),
        ({"trainer": {"tensorParallel": 2}}, "trainer"),
        ({"checkpointEngine": {"shmSize": "1Gi"}}, "checkpointEngine"),
        ({"gangScheduling": True}, "gangScheduling"),
    ],
)
def test_immutable_fields_are_rejected(
    k8s: ControlPlane, installed: ControlPlane, ns: str, patch: dict[str, Any], field: str
) -> None:
    create(k8s, ns, JobWrapper("frozen").small())
    out = k8s.kubectl(
        "patch", "rlhfjob", "frozen", "-n", ns, "--type=merge", "-p", json.dumps({"spec": patch}), check=False
    )
    assert out.returncode != 0 and f"{field} is immutable" in out.stderr
    ok = k8s.kubectl(
        "patch",
        "rlhfjob",
        "frozen",
        "-n",
        ns,
        "--type=merge",
        "-p",
        '{"spec":{"suspend":true,"failurePolicy":{"maxRestarts":5}}}',
    )
    assert "patched" in ok.stdout  # suspend and failurePolicy stay mutable
