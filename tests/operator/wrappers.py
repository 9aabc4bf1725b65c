"""Fluent test builders for the operator tests: RLHFJob documents, pod summaries, statuses.

Callers: every test in tests/operator/. Each builder starts from a small valid object and each
method changes one thing and returns the builder, so a table row reads as the difference it tests:
    JobWrapper("demo").replicas(2).gpus(4).set("trainer.tensorParallel", 2).job()
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

from tandem.operator.manifests.job_objects import ROLE_HYBRID, ROLE_ROLLOUT, pod_object_name
from tandem.operator.policies.observe import ContainerIssue, PodState
from tandem.spec.load import parse_job
from tandem.spec.models import RLHFJob
from tandem.spec.status import Condition, JobStatus

T0 = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)


def _set_path(doc: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted path (list items as numbers: rewards.0.type); value DELETE removes the key."""
    parts = path.split(".")
    node: Any = doc
    for part in parts[:-1]:
        key: Any = int(part) if isinstance(node, list) else part
        if isinstance(node, dict) and key not in node:
            node[key] = {}
        node = node[key]
    last: Any = int(parts[-1]) if isinstance(node, list) else parts[-1]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value


DELETE = object()


class JobWrapper:
    def __init__(self, name: str = "demo", namespace: str = "default"):
        self.doc: dict[str, Any] = {
            "apiVersion": "tandem.dev/v1alpha1",
            "kind": "RLHFJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "model": {"path": "/models/tiny"},
                "rewards": [{"type": "answerMatch", "weight": 1.0}],
                "dataset": {"path": "/data/prompts.jsonl"},
            },
        }

    def set(self, path: str, value: Any) -> JobWrapper:
        """Set a spec field by its camelCase dotted path, e.g. set("trainer.tensorParallel", 2)."""
        _set_path(self.doc["spec"], path, value)
        return self

    def unset(self, path: str) -> JobWrapper:
        return self.set(path, DELETE)

    def meta(self, path: str, value: Any) -> JobWrapper:
        _set_path(self.doc["metadata"], path, value)
        return self

    def replicas(self, n: int) -> JobWrapper:
        return self.set("replicas", n)

    def rollout_only(self, n: int) -> JobWrapper:
        return self.set("rolloutOnlyReplicas", n)

    def gpus(self, n: int) -> JobWrapper:
        return self.set("gpusPerPod", n)

    def small(self) -> JobWrapper:
        """Resources that fit a simulated node many times over (cluster tests)."""
        return (
            self.gpus(0)
            .set("trainer.resources", {"cpu": "100m", "memory": "128Mi"})
            .set("rollout.resources", {"cpu": "100m", "memory": "128Mi"})
            .set("checkpointEngine.shmSize", "64Mi")
        )

    def etcd(self, *endpoints: str) -> JobWrapper:
        return self.set("checkpointEngine.etcd", {"endpoints": list(endpoints)})

    def volume(self, name: str, mount_path: str, **source: Any) -> JobWrapper:
        """Append a spec.volumes entry; source: claimName=..., hostPath=..., readOnly=... (camelCase keys)."""
        self.doc["spec"].setdefault("volumes", []).append({"name": name, "mountPath": mount_path, **source})
        return self

    def persist(self, path: str, **extra: Any) -> JobWrapper:
        """checkpointEngine.persist with `path` (and every=..., keep=...)."""
        return self.set("checkpointEngine.persist", {"path": path, **extra})

    def failure_policy(self, max_restarts: int, backoff_seconds: int = 0) -> JobWrapper:
        return self.set("failurePolicy", {"maxRestarts": max_restarts, "backoffSeconds": backoff_seconds})

    def suspend(self, value: bool = True) -> JobWrapper:
        return self.set("suspend", value)

    def queue(self, name: str) -> JobWrapper:
        """Label the job kueue.x-k8s.io/queue-name: `name` (queued by Kueue)."""
        return self.meta("labels", {"kueue.x-k8s.io/queue-name": name})

    def obj(self) -> dict[str, Any]:
        return copy.deepcopy(self.doc)

    def job(self) -> RLHFJob:
        return parse_job(self.obj(), "wrapper")


class PodWrapper:
    def __init__(self, job: str, index: int, *, replicas: int = 1):
        self.fields: dict[str, Any] = {
            "name": f"{job}-{index}",
            "job": job,
            "index": index,
            "role": ROLE_HYBRID if index < replicas else ROLE_ROLLOUT,
            "generation": 0,
            "phase": "Pending",
            "deleting": False,
            "reason": "",
        }

    def phase(self, phase: str, reason: str = "") -> PodWrapper:
        self.fields.update(phase=phase, reason=reason)
        return self

    def running(self) -> PodWrapper:
        return self.phase("Running")

    def failed(self, reason: str = "Error") -> PodWrapper:
        return self.phase("Failed", reason)

    def generation(self, g: int, *, queued: bool = False) -> PodWrapper:
        """Restart generation `g`; queued: the pod of a Kueue-queued job (named `<job>-<i>-g<g>` after 0)."""
        self.fields["generation"] = g
        self.fields["name"] = pod_object_name(self.fields["job"], self.fields["index"], g, queued=queued)
        return self

    def deleting(self) -> PodWrapper:
        self.fields["deleting"] = True
        return self

    def gated(self) -> PodWrapper:
        """Held at Kueue's admission gate."""
        self.fields["gated"] = True
        return self

    def stopped(self, why: str = "WorkloadEvicted: Preempted to accommodate a workload") -> PodWrapper:
        """Marked by Kueue's TerminationTarget condition (and, as Kueue then deletes it, deleting)."""
        self.fields.update(stopped=why, deleting=True)
        return self

    def waiting(self, reason: str, container: str = "rollout", message: str = "", restarts: int = 0) -> PodWrapper:
        """A container waiting with the kubelet's `reason` (or only restarted, reason "")."""
        issue = ContainerIssue(container, reason, message, restarts)
        self.fields["issues"] = (*self.fields.get("issues", ()), issue)
        return self

    def unschedulable(self, since: datetime, message: str = "0/4 nodes are available") -> PodWrapper:
        """Pending, PodScheduled False (Unschedulable) since `since`."""
        self.fields.update(phase="Pending", unschedulable=message,
                           unschedulable_since=since.strftime("%Y-%m-%dT%H:%M:%SZ"))
        return self

    def refused(self, why: str = "trainer: spec.model.path: /models/x/config.json: missing") -> PodWrapper:
        """Failed: a sidecar exited 2 (`tandem.sidecars.startup.refuse`) with `why` as its one line."""
        self.fields.update(phase="Failed", refused=why)
        return self

    def uid(self, uid: str) -> PodWrapper:
        """metadata.uid (a replacement of the same name has another)."""
        self.fields["uid"] = uid
        return self

    def state(self) -> PodState:
        return PodState(**self.fields)


def pods(
    job: str, n: int, *, phase: str = "Running", generation: int = 0, replicas: int | None = None,
    queued: bool = False,
) -> list[PodState]:
    return [
        PodWrapper(job, i, replicas=n if replicas is None else replicas)
        .phase(phase)
        .generation(generation, queued=queued)
        .state()
        for i in range(n)
    ]


class StatusWrapper:
    def __init__(self) -> None:
        self.status = JobStatus()

    def phase(self, phase: str, conditions: bool = True) -> StatusWrapper:
        self.status.phase = phase  # type: ignore[assignment]
        if conditions:
            self.status.conditions = [
                Condition(
                    type="Ready",
                    status="True" if phase == "Running" else "False",
                    reason=phase,
                    last_transition_time="2026-11-22T11:00:00Z",
                )
            ]
        return self

    def restarts(self, n: int) -> StatusWrapper:
        self.status.restarts = n
        return self

    def rollout_only(self, n: int) -> StatusWrapper:
        """Rollout-only pods the last pass saw (status.rolloutOnlyReplicas)."""
        self.status.rollout_only_replicas = n
        return self

    def restart_began(self, when: datetime) -> StatusWrapper:
        self.status.conditions.append(
            Condition(
                type="Restarting",
                status="True",
                reason="Restarting",
                last_transition_time=when.strftime("%Y-%m-%dT%H:%M:%SZ"),
            )
        )
        return self.phase_only("Restarting")

    def phase_only(self, phase: str) -> StatusWrapper:
        self.status.phase = phase  # type: ignore[assignment]
        return self

    def get(self) -> JobStatus:
        return self.status.model_copy(deep=True)


def later(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)
