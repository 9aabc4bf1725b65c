"""Two operator replicas with leader election on the real control plane, with the chart's RBAC (the
ServiceAccount's token): one leads through the chart's Lease, the other waits as a standby serving its
liveness endpoint; the leader is killed mid-job while a pod fails, and the standby takes over and
restarts the gang exactly once, with no duplicate pods; a replica stopped cleanly releases the Lease.
And the API server itself refusing a status write made on a stale resourceVersion (what keeps a
former leader, or a lagging view, from counting a restart twice).
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from controlplane import ControlPlane, free_port
from harness import OPERATOR_NS, OperatorProcess, get_json, wait_for
from test_operator_cluster import create, events_of, fail_pod, job_of, phase_is, pods_of, running, small

from tandem.operator.cluster.kube import CONFLICT, Kube, KubeError, connect

pytestmark = pytest.mark.k8s
LEASE = "tandem-operator-leader"  # the chart's (release tandem); its Role grants get/update on this name only
Start = Callable[[str], OperatorProcess]


def holder(cp: ControlPlane) -> str:
    lease = get_json(cp, "lease", LEASE, "-n", OPERATOR_NS) or {}
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def healthz(port: int) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:  # noqa: S310
        return json.loads(r.read())


@pytest.fixture
def replicas(operator: OperatorProcess, operator_kubeconfig: Path, etcd_server: Any,
             tmp_path: Path) -> Iterator[Start]:
    """The session's operator stopped, leader-elected replicas started in its place; afterwards they
    stop and the session's operator starts again."""
    operator.stop()
    made: list[OperatorProcess] = []

    def start(identity: str) -> OperatorProcess:
        proc = OperatorProcess(operator_kubeconfig, etcd_server.endpoint, tmp_path / f"{identity}.log",
                               leader=identity, liveness_port=free_port())
        made.append(proc.start())
        return proc

    yield start
    for proc in made:
        proc.stop()
        print(f"--- {proc.leader} log tail:\n{proc.tail(30)}")
    operator.start()


def test_leader_killed_mid_job_the_standby_takes_over_and_restarts_the_gang_once(
    k8s: ControlPlane, replicas: Start, ns: str
) -> None:
    a = replicas("replica-a")
    wait_for("replica-a leads", lambda: holder(k8s).startswith("replica-a_"), 60)
    b = replicas("replica-b")
    wait_for("replica-b waits as a standby", lambda: "standby; replica-a_" in b.tail(200), 60)
    assert healthz(b.liveness_port) == {"standby": True}  # its liveness probe passes meanwhile

    name = "ha"
    create(k8s, ns, small(name, replicas=2).failure_policy(3))
    wait_for("2 running pods", lambda: running(k8s, ns, name, 2), 60)
    wait_for("Running", lambda: phase_is(k8s, ns, name, "Running", restarts=0), 30)

    a.kill()  # no release: the standby must wait out the Lease
    fail_pod(k8s, ns, f"{name}-1")  # the gang fails while nobody leads
    wait_for("replica-b leads", lambda: holder(k8s).startswith("replica-b_"), 60)
    wait_for("the new gang running", lambda: running(k8s, ns, name, 2, generation=1), 90)
    wait_for("Running after one restart", lambda: phase_is(k8s, ns, name, "Running", restarts=1), 30)
    assert sorted(p["metadata"]["name"] for p in pods_of(k8s, ns, name)) == [f"{name}-0", f"{name}-1"]
    assert events_of(k8s, ns, name).count(("Warning", "Restarting")) == 1

    b.stop()  # SIGTERM: kopf stops, then the Lease is released
    assert b.proc is not None and b.proc.returncode == 0, b.tail(40)
    wait_for("the Lease released", lambda: holder(k8s) == "", 30)
    c = replicas("replica-c")  # takes a released Lease at its first try, without waiting it out
    wait_for("replica-c leads", lambda: holder(k8s).startswith("replica-c_"), 60)
    wait_for("replica-c reconciling", lambda: "Timer 'reconcile_job' succeeded" in c.tail(400), 30)
    assert phase_is(k8s, ns, name, "Running", restarts=1)


def test_the_api_server_refuses_a_status_write_on_a_stale_resource_version(
    k8s: ControlPlane, operator: OperatorProcess, operator_kubeconfig: Path, ns: str
) -> None:
    name = "stale"
    seen_at_creation = create(k8s, ns, small(name).suspend())["metadata"]["resourceVersion"]
    wait_for("Suspended (the operator wrote its status)", lambda: phase_is(k8s, ns, name, "Suspended"), 30)

    async def writes() -> tuple[int, str]:
        kube = Kube(await connect(2, str(operator_kubeconfig)))  # the chart's RBAC
        try:
            with pytest.raises(KubeError) as refused:
                await kube.patch_status(ns, name, {"restarts": 5}, seen_at_creation)
            current = job_of(k8s, ns, name)
            patched = await kube.patch_status(ns, name, {"restarts": current["status"]["restarts"]},
                                              current["metadata"]["resourceVersion"])
            return refused.value.status, str(patched["status"]["restarts"])
        finally:
            await kube.close()

    status, restarts = asyncio.run(writes())
    assert status == CONFLICT and restarts == "0"
    assert job_of(k8s, ns, name)["status"]["restarts"] == 0
