"""A stand-in for Kueue on the test control plane: plays Kueue's documented part for plain pod groups.

Callers: tests/operator/test_operator_kueue.py. Kueue itself cannot be built here (the Go module
proxy refuses it), so this plays what Kueue's documentation ("Run Plain Pods", "Troubleshooting
Pods") and its pod integration (pkg/controller/jobs/pod: the webhook's Default, the controller's Run
and Stop) say Kueue does to pods, through the same API-server mechanisms:
- at pod creation, a real mutating admission webhook (a MutatingWebhookConfiguration the API
  server calls over HTTPS, as Kueue's is) adds the scheduling gate `kueue.x-k8s.io/admission`, the
  label `kueue.x-k8s.io/managed: "true"` and the finalizer `kueue.x-k8s.io/managed` to every pod
  labelled `kueue.x-k8s.io/queue-name`;
- `finalize(group)`: Kueue's accounting of a group's inactive pods (Failed, or deleted before
  being scheduled): it removes its finalizer only from as many of them as there are active pods
  beyond the group's total count, i.e. once replacements exist (`admit` calls it first);
- `admit(group)`: once the group's active pods number its `kueue.x-k8s.io/pod-group-total-count`,
  removes Kueue's gate from each (other gates stay);
- `evict(group)`: what Kueue's Stop does on preemption: sets the pod condition TerminationTarget
  (status True, reason WorkloadEvicted, message the preemption) on every pod of the group through
  the status subresource, then deletes the pods.
Left out, as they change nothing the operator reads: the Workload object, quota and the queues
themselves (a test decides when to admit and when to preempt). The simulated nodes (kwok) end a
deleted pod that was bound without a kubelet's Failed phase, so the finalizer holds back only
pods deleted while gated here.
The webhook serves with the control plane's API-server certificate (its SANs include 127.0.0.1,
signed by the test CA that the configuration's caBundle names).
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from controlplane import ControlPlane, free_port
from harness import get_json, wait_for

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
TOTAL_COUNT = "kueue.x-k8s.io/pod-group-total-count"
MANAGED_LABEL = "kueue.x-k8s.io/managed"
GATE = "kueue.x-k8s.io/admission"
CONFIG_NAME = "kueue-standin"
PREEMPTED = "Preempted to accommodate a workload (UID: standin) due to prioritization in the ClusterQueue"


def mutation(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON patch Kueue's pod webhook amounts to for a queued pod: managed label, admission gate."""
    ops: list[dict[str, Any]] = []
    if not (pod.get("metadata") or {}).get("labels"):
        ops.append({"op": "add", "path": "/metadata/labels", "value": {}})
    ops.append({"op": "add", "path": "/metadata/labels/" + MANAGED_LABEL.replace("/", "~1"), "value": "true"})
    finalizers = (pod.get("metadata") or {}).get("finalizers")
    if finalizers is None:
        ops.append({"op": "add", "path": "/metadata/finalizers", "value": [MANAGED_LABEL]})
    elif MANAGED_LABEL not in finalizers:
        ops.append({"op": "add", "path": "/metadata/finalizers/-", "value": MANAGED_LABEL})
    gates = (pod.get("spec") or {}).get("schedulingGates")
    if gates is None:
        ops.append({"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]})
    elif not any(g.get("name") == GATE for g in gates):
        ops.append({"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": GATE}})
    return ops


def active(pod: dict[str, Any]) -> bool:
    """Kueue's isPodRunnableOrSucceeded: not Failed, and not deleted before it was scheduled."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    if meta.get("deletionTimestamp") and not spec.get("nodeName"):
        return False
    return (pod.get("status") or {}).get("phase") != "Failed"


class _Webhook(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        review = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        request = review["request"]
        patch = base64.b64encode(json.dumps(mutation(request["object"])).encode()).decode()
        body = json.dumps({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": request["uid"], "allowed": True, "patchType": "JSONPatch", "patch": patch},
        }).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.server.calls += 1  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        pass


class KueueStandIn:
    """Start with `start()`, stop with `stop()` (removes the webhook configuration)."""

    def __init__(self, cp: ControlPlane):
        self.cp = cp
        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), _Webhook)
        self.server.calls = 0  # type: ignore[attr-defined]
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(cp.pki / "apiserver.crt"), str(cp.pki / "apiserver.key"))
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, name="kueue-standin", daemon=True)

    @property
    def calls(self) -> int:
        return int(self.server.calls)  # type: ignore[attr-defined]

    def start(self) -> KueueStandIn:
        self.thread.start()
        ca = base64.b64encode((self.cp.pki / "ca.crt").read_bytes()).decode()
        self.cp.apply({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": CONFIG_NAME},
            "webhooks": [{
                "name": "mpod.kueue-standin.tandem.test",
                "clientConfig": {"url": f"https://127.0.0.1:{self.port}/mutate--v1-pod", "caBundle": ca},
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                           "resources": ["pods"], "scope": "Namespaced"}],
                "objectSelector": {"matchExpressions": [{"key": QUEUE_LABEL, "operator": "Exists"}]},
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 10,
            }],
        })
        return self

    def stop(self) -> None:
        self.cp.kubectl("delete", "mutatingwebhookconfiguration", CONFIG_NAME, "--ignore-not-found", check=False)
        self.server.shutdown()
        self.server.server_close()

    def pods(self, ns: str, name: str) -> list[dict[str, Any]]:
        return list((get_json(self.cp, "pods", "-n", ns, "-l", f"{GROUP_LABEL}={name}") or {}).get("items", []))

    def group(self, ns: str, name: str) -> list[dict[str, Any]]:
        """The group's active pods (Kueue's isPodRunnableOrSucceeded)."""
        return [p for p in self.pods(ns, name) if active(p)]

    def finalize(self, ns: str, name: str) -> list[str]:
        """Remove Kueue's finalizer from the inactive pods that active ones have replaced."""
        pods = self.pods(ns, name)
        live = [p for p in pods if active(p)]
        held = [p for p in pods if not active(p) and MANAGED_LABEL in (p["metadata"].get("finalizers") or ())]
        total = max([int(p["metadata"].get("annotations", {}).get(TOTAL_COUNT, 0)) for p in pods] or [0])
        done = held[:max(0, min(len(held), len(held) + len(live) - total))]
        for pod in done:
            rest = [f for f in pod["metadata"]["finalizers"] if f != MANAGED_LABEL]
            self.cp.kubectl("patch", "pod", pod["metadata"]["name"], "-n", ns, "--type=json", "-p",
                            json.dumps([{"op": "replace", "path": "/metadata/finalizers", "value": rest}]))
        return sorted(p["metadata"]["name"] for p in done)

    def admit(self, ns: str, name: str, timeout: float = 60) -> list[str]:
        """Ungate every pod of the group once all of them exist; returns the pod names."""

        def complete() -> list[dict[str, Any]] | None:
            pods = self.group(ns, name)
            counts = {p["metadata"].get("annotations", {}).get(TOTAL_COUNT) for p in pods}
            return pods if pods and counts == {str(len(pods))} else None

        self.finalize(ns, name)
        pods = wait_for(f"every pod of group {name}", complete, timeout)
        for pod in pods:
            gates = [g for g in pod["spec"].get("schedulingGates") or () if g.get("name") != GATE]
            self.cp.kubectl("patch", "pod", pod["metadata"]["name"], "-n", ns, "--type=json",
                            "-p", json.dumps([{"op": "replace", "path": "/spec/schedulingGates", "value": gates}]))
        return sorted(p["metadata"]["name"] for p in pods)

    def evict(self, ns: str, name: str, reason: str = "WorkloadEvicted", message: str = PREEMPTED) -> list[str]:
        """Kueue's Stop of a pod group: TerminationTarget on each pod, then delete them all."""
        pods = [p for p in self.pods(ns, name) if not p["metadata"].get("deletionTimestamp")]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        condition = {"type": "TerminationTarget", "status": "True", "reason": reason, "message": message,
                     "lastTransitionTime": now}
        for pod in pods:  # per pod, as Stop does; a pod already gone (its controller was quicker) is fine
            out = self.cp.kubectl("patch", "pod", pod["metadata"]["name"], "-n", ns, "--subresource=status",
                                  "-p", json.dumps({"status": {"conditions": [condition]}}), check=False)
            if out.returncode != 0 and "NotFound" not in out.stderr:
                raise AssertionError(f"marking {pod['metadata']['name']}: {out.stderr}")
            self.cp.kubectl("delete", "pod", pod["metadata"]["name"], "-n", ns, "--wait=false", "--ignore-not-found")
        return sorted(p["metadata"]["name"] for p in pods)
