"""Stuck gangs on the real control plane: container statuses patched as the kubelet writes them (the
status subresource of pods on kwok nodes: state.waiting {reason, message}, restartCount), and pods
the real kube-scheduler cannot place. Each shows in the job's status (REASON column, condition
ContainersWaiting, message) and Events, and past spec.failurePolicy's limits the gang restarts or
the job fails with every pod deleted, so the GPUs of the scheduled pods are released.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from controlplane import ControlPlane
from harness import OperatorProcess, get_json, wait_for
from test_operator_cluster import create, events_of, phase_is, pods_of, running, small

pytestmark = pytest.mark.k8s


def kubelet_waits(cp: ControlPlane, ns: str, pod: str, container: str, reason: str, message: str,
                  restarts: int = 0) -> None:
    """Patch `container`'s status the way the kubelet reports a container it cannot start."""
    body = get_json(cp, "pod", pod, "-n", ns)
    init = any(c["name"] == container for c in body["spec"].get("initContainers", []))
    entry = {"name": container, "image": "example.com/tandem:bad", "imageID": "", "ready": False, "started": False,
             "restartCount": restarts, "state": {"waiting": {"reason": reason, "message": message}}}
    key = "initContainerStatuses" if init else "containerStatuses"
    cp.kubectl("patch", "pod", pod, "-n", ns, "--subresource=status", "--type=strategic",
               "-p", json.dumps({"status": {key: [entry]}}))


def condition(st: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in st.get("conditions", []) if c["type"] == type_), {})


def event_messages(cp: ControlPlane, ns: str, name: str) -> list[tuple[str, str, str]]:
    items = (get_json(cp, "events", "-n", ns, "--field-selector", f"involvedObject.name={name}") or {}).get(
        "items", [])
    return [(e["type"], e["reason"], e.get("message", "")) for e in items]


def reason_column(cp: ControlPlane, ns: str, name: str) -> str:
    """The REASON column of `kubectl get rlhfjobs`."""
    header, row = cp.kubectl("get", "rlhfjobs", name, "-n", ns).stdout.splitlines()[:2]
    assert header.split()[:3] == ["NAME", "PHASE", "REASON"]
    return row.split()[2]


def test_image_pull_backoff_shows_then_restarts_then_fails(
    k8s: ControlPlane, operator: OperatorProcess, ns: str
) -> None:
    name = "pull"
    job = small(name).set("failurePolicy", {"maxRestarts": 1, "backoffSeconds": 0, "waitingTimeoutSeconds": 4})
    create(k8s, ns, job)
    wait_for("1 running pod", lambda: running(k8s, ns, name, 1), 60)
    wait_for("Running", lambda: phase_is(k8s, ns, name, "Running"), 30)

    message = 'Back-off pulling image "example.com/tandem:bad"'
    kubelet_waits(k8s, ns, f"{name}-0", "rollout", "ImagePullBackOff", message)  # the native sidecar
    st = wait_for("ImagePullBackOff shown", lambda: phase_is(k8s, ns, name, "Running", reason="ImagePullBackOff"), 30)
    assert st["message"].endswith(f"pod {name}-0 container rollout ImagePullBackOff: {message}")
    waiting = condition(st, "ContainersWaiting")
    assert (waiting["status"], waiting["reason"]) == ("True", "ImagePullBackOff")
    assert reason_column(k8s, ns, name) == "ImagePullBackOff"
    assert ("Warning", "ImagePullBackOff") in events_of(k8s, ns, name)

    st = wait_for("gang restart after waitingTimeoutSeconds",
                  lambda: phase_is(k8s, ns, name, "Running", restarts=1), 60)
    restarting = [m for t, r, m in event_messages(k8s, ns, name) if (t, r) == ("Warning", "Restarting")]
    assert len(restarting) == 1 and "ImagePullBackOff" in restarting[0]
    assert "(failurePolicy.waitingTimeoutSeconds)" in restarting[0]
    pods = running(k8s, ns, name, 1, generation=1)
    assert pods is not None

    kubelet_waits(k8s, ns, f"{name}-0", "trainer", "CreateContainerConfigError", 'secret "hf-token" not found')
    st = wait_for("Failed: maxRestarts spent", lambda: phase_is(k8s, ns, name, "Failed"), 60)
    assert st["reason"] == "WaitingTimeout" and "maxRestarts (1) reached" in st["message"]
    assert 'CreateContainerConfigError: secret "hf-token" not found' in st["message"]
    wait_for("every pod deleted", lambda: not [p for p in pods_of(k8s, ns, name)
                                               if not p["metadata"].get("deletionTimestamp")], 30)


def test_crash_loop_past_max_container_restarts_fails_with_failjob(
    k8s: ControlPlane, operator: OperatorProcess, ns: str
) -> None:
    name = "crash"
    create(k8s, ns, small(name).set("failurePolicy", {"maxContainerRestarts": 3, "action": "FailJob"}))
    wait_for("1 running pod", lambda: running(k8s, ns, name, 1), 60)
    back_off = "back-off 40s restarting failed container=rollout pod=crash-0"
    kubelet_waits(k8s, ns, f"{name}-0", "rollout", "CrashLoopBackOff", back_off, restarts=2)
    st = wait_for("CrashLoopBackOff shown", lambda: phase_is(k8s, ns, name, "Running", reason="CrashLoopBackOff"), 30)
    assert st["restarts"] == 0
    kubelet_waits(k8s, ns, f"{name}-0", "rollout", "CrashLoopBackOff", back_off, restarts=3)
    st = wait_for("Failed", lambda: phase_is(k8s, ns, name, "Failed", reason="ContainerRestartLimit"), 30)
    assert "restarted 3 times (failurePolicy.maxContainerRestarts 3)" in st["message"]
    assert "failurePolicy.action FailJob" in st["message"] and st["restarts"] == 0
    assert reason_column(k8s, ns, name) == "ContainerRestartLimit"
    wait_for("every pod deleted", lambda: not [p for p in pods_of(k8s, ns, name)
                                               if not p["metadata"].get("deletionTimestamp")], 30)


def test_gang_not_fully_scheduled_times_out_and_releases_its_gpus(
    k8s: ControlPlane, operator: OperatorProcess, ns: str
) -> None:
    """5 pods of 8 GPUs on 4 nodes of 8: the real scheduler binds 4 (32 GPUs held) and cannot place one."""
    name = "toobig"
    job = small(name, replicas=5).gpus(8).set("failurePolicy", {"schedulingTimeoutSeconds": 8, "action": "FailJob"})
    create(k8s, ns, job)
    st = wait_for("Unschedulable shown", lambda: phase_is(k8s, ns, name, "Pending", reason="Unschedulable"), 60)
    assert "Insufficient nvidia.com/gpu" in st["message"]
    held = [p for p in pods_of(k8s, ns, name) if p["spec"].get("nodeName")]
    assert held, "some pods were bound and hold GPUs"
    st = wait_for("Failed after schedulingTimeoutSeconds",
                  lambda: phase_is(k8s, ns, name, "Failed", reason="SchedulingTimeout"), 60)
    assert "failurePolicy.schedulingTimeoutSeconds" in st["message"]
    wait_for("every pod deleted", lambda: not [p for p in pods_of(k8s, ns, name)
                                               if not p["metadata"].get("deletionTimestamp")], 30)
