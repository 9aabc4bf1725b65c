"""A job queued by Kueue, on the real control plane, against the Kueue stand-in (`kueue_standin`).

Queued while Kueue's admission gate holds its pods; stopped by Kueue while still queued, with its
pods kept by Kueue's finalizer until replacements exist (which therefore get names of their own);
Running once admitted; Suspended when Kueue preempts it (pods marked and deleted), with no restart
counted and the replacement pods created once and held at the gate; Running again, as the next
gang generation (which resumes from the newest durable copy), after re-admission. Events for
queueing, preemption and suspension.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from controlplane import ControlPlane
from harness import OperatorProcess, wait_for
from kueue_standin import GATE, MANAGED_LABEL, KueueStandIn
from test_operator_cluster import create, events_of, phase_is, pods_of, running, small

pytestmark = pytest.mark.k8s


@pytest.fixture
def kueue(installed: ControlPlane) -> Iterator[KueueStandIn]:
    standin = KueueStandIn(installed).start()
    yield standin
    standin.stop()


def gated(cp: ControlPlane, ns: str, name: str, n: int, generation: int) -> list[dict[str, Any]] | None:
    pods = [p for p in pods_of(cp, ns, name) if not p["metadata"].get("deletionTimestamp")]
    ok = len(pods) == n and all(
        p["metadata"]["labels"]["tandem.dev/restart-generation"] == str(generation)
        and any(g["name"] == GATE for g in p["spec"].get("schedulingGates") or ())
        and not p["spec"].get("nodeName")
        for p in pods
    )
    return pods if ok else None


def conditions(st: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in st.get("conditions", [])}


def queued_again(cp: ControlPlane, ns: str, name: str, preemptions: int) -> dict[str, Any] | None:
    st = phase_is(cp, ns, name, "Suspended", preemptions=preemptions)
    return st if st and conditions(st)["Queued"][0] == "True" else None


def test_queued_admitted_preempted_suspended_readmitted_resumed(
    k8s: ControlPlane, operator: OperatorProcess, kueue: KueueStandIn, ns: str
) -> None:
    name, group = "queued", "rlhfjob-queued"
    create(k8s, ns, small(name, replicas=2, rollout_only=1).queue("gpu-team").failure_policy(max_restarts=0))

    pods = wait_for("3 gated pods", lambda: gated(k8s, ns, name, 3, 0), 60)
    for pod in pods:  # Kueue's contract: one group of every pod, marked by Kueue's webhook
        meta = pod["metadata"]
        assert meta["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-team"
        assert meta["labels"]["kueue.x-k8s.io/pod-group-name"] == group
        assert meta["labels"]["kueue.x-k8s.io/managed"] == "true" and MANAGED_LABEL in meta["finalizers"]
        assert meta["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "3"
    st = wait_for("Queued", lambda: phase_is(k8s, ns, name, "Queued"), 30)
    assert conditions(st)["Queued"] == ("True", "AwaitingAdmission")
    assert f"pod group {group} (queue gpu-team)" in st["message"]
    assert all(c["observedGeneration"] == 1 for c in st["conditions"])
    assert k8s.kubectl("get", "rlhfjob", name, "-n", ns).stdout.splitlines()[1].split()[:2] == [name, "Queued"]

    # Kueue stops the group while it is still queued: the deleted, never scheduled pods keep Kueue's
    # finalizer until replacements exist, so the replacements (generation 1) must not wait for them
    kueue.evict(ns, group)
    wait_for("Suspended", lambda: phase_is(k8s, ns, name, "Suspended", preemptions=1, restarts=0), 30)
    wait_for("generation 1 held at the gate", lambda: gated(k8s, ns, name, 3, 1), 60)
    held = [p["metadata"]["name"] for p in pods_of(k8s, ns, name) if p["metadata"].get("deletionTimestamp")]
    assert held == [f"{name}-{i}" for i in range(3)]  # generation 0, still there behind the finalizer
    wait_for("Suspended and queued", lambda: queued_again(k8s, ns, name, 1), 30)

    assert kueue.admit(ns, group) == [f"{name}-{i}-g1" for i in range(3)]  # finalizes generation 0 first
    wait_for("admitted pods running", lambda: running(k8s, ns, name, 3, 1), 60)
    st = wait_for("Running", lambda: phase_is(k8s, ns, name, "Running", preemptions=1), 30)
    assert conditions(st)["Queued"] == ("False", "PodsRunning") and st["restarts"] == 0

    kueue.evict(ns, group)  # preemption: maxRestarts is 0, so a counted restart would fail the job
    st = wait_for("Suspended by preemption", lambda: phase_is(k8s, ns, name, "Suspended", preemptions=2), 30)
    assert st["restarts"] == 0 and conditions(st)["Suspended"] == ("True", "Preempted")
    assert st["message"].startswith("preempted by Kueue: pod queued-")  # marked, or already deleted
    created = {p["metadata"]["uid"] for p in wait_for("replacements held", lambda: gated(k8s, ns, name, 3, 2), 60)}
    st = wait_for("still Suspended, queued again", lambda: queued_again(k8s, ns, name, 2), 30)

    assert kueue.admit(ns, group) == [f"{name}-{i}-g2" for i in range(3)]
    pods = wait_for("generation 2 running", lambda: running(k8s, ns, name, 3, 2), 60)
    assert {p["metadata"]["uid"] for p in pods} == created  # created once while queued, no loop
    st = wait_for("Running again", lambda: phase_is(k8s, ns, name, "Running", preemptions=2, restarts=0), 30)
    env = {e["name"]: e.get("value") for e in pods[0]["spec"]["containers"][0]["env"]}
    assert env["TANDEM_RESTART_GENERATION"] == "2" and env["TANDEM_RESUME"] == "1"
    assert pods[0]["spec"]["hostname"] == f"{name}-0" and env["TANDEM_POD"] == f"{name}-0"
    events = set(events_of(k8s, ns, name))
    assert {("Normal", "Queued"), ("Warning", "Preempted"), ("Normal", "Suspended"), ("Normal", "Running")} <= events
    assert not any(reason in ("Failed", "Restarting") for _, reason in events)
