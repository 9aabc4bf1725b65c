"""Kueue's documented contract for plain pod groups, as the operator's pods carry it (pure).

Callers: `tandem.operator.manifests.builders.build_pod` (marks the pods of a queued job),
`tandem.operator.policies.observe` (reads Kueue's marks back from a pod), `tandem.operator.policies.admission_policy`
(decides from them).
Written from Kueue's documentation ("Run Plain Pods", "Troubleshooting Pods") and its pod
integration (pkg/controller/jobs/pod): nothing here imports or talks to Kueue.

What a user writes: the label `kueue.x-k8s.io/queue-name: <LocalQueue>` on the RLHFJob. Then every
pod of the job carries
  label       kueue.x-k8s.io/queue-name             the same queue (Kueue's webhook manages such pods)
  label       kueue.x-k8s.io/pod-group-name         `rlhfjob-<job>`: one group, so one Workload of
                                                    that name, admitted all-or-nothing
  annotation  kueue.x-k8s.io/pod-group-total-count  replicas + rolloutOnlyReplicas (every pod)
The group holds every pod of the job, hybrid and rollout-only: the driver waits at start for all
the rollouts of its gang, so admitting the hybrid pods without the rollout-only ones would leave
it waiting. The name stays the same across gang restarts and preemptions: Kueue's docs make the
controller that created a group responsible for creating its replacement pods, which join the
same Workload (and wait, gated, while it is not admitted). Kueue keeps its finalizer
(`kueue.x-k8s.io/managed`) on a stopped group's pods until it sees those replacements, so a queued
job's pods of restart generation g > 0 are named `<job>-<i>-g<g>` (`job_objects.pod_object_name`;
hostnames stay `<job>-<i>`) and the next gang does not wait for pods whose containers have ended.
The total count is the pool size when a pod is made: resizing the rollout-only pool (/scale) of
an admitted queued job gives its new pods a count that differs from the group's; Kueue's plain
pod groups have no documented resize, so scale a queued job while it is suspended, or not at all.

What Kueue does, and how the operator reads it:
- Its mutating webhook adds the scheduling gate `kueue.x-k8s.io/admission` to each pod at creation
  (and the label `kueue.x-k8s.io/managed: "true"`); once the Workload is admitted it removes the
  gate. A pod still gated is waiting for admission: the job is Queued.
- To stop an admitted group (preemption, eviction, the Workload deleted) Kueue sets the pod
  condition `TerminationTarget` (status True, reason the stop reason, e.g. `WorkloadEvicted`,
  message why) on every pod of the group and deletes them. The operator takes that condition, or
  a pod of a running queued job being deleted or gone (Kueue stops groups by DELETE, and the pods
  may be gone before a pass sees the condition), as a preemption: the job is Suspended.

Why a queued job's pool does not shrink or heal alone (`tandem.operator.policies.pool_policy` replaces lost
rollout-only pods of other jobs). Kueue's pod integration (pkg/controller/jobs/pod) builds the
group's Workload from the total count, which must be equal on every pod; its pod sets' counts are
fixed while admitted, and a group whose pods no longer match the Workload gets its Workload deleted
(the group queued again). Plain pod groups have no elastic resize (workload slices serve batch Jobs
and a few CRDs, not pod groups), and Kueue preempts a Workload whole, deleting every pod of the group:
there is no "one rollout-only pod preempted", so a preemption still suspends the job. A pod that
fails on its own Kueue leaves to its creator ("Kueue does not re-create failed Pods"): it keeps its
finalizer on the Failed pod until it observes a replacement pod of the same shape, and meanwhile marks
the Workload WaitingForReplacementPods. A replacement must therefore be created under a new name while
the failed pod still exists, which the one-name-per-index-and-generation scheme here cannot do without
naming every pod by more than index and generation; so a failed rollout-only pod of a queued job still
restarts the gang (the next generation's names are new), as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
TOTAL_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
MANAGED_LABEL = "kueue.x-k8s.io/managed"
ADMISSION_GATE = "kueue.x-k8s.io/admission"
STOP_CONDITION = "TerminationTarget"
GROUP_PREFIX = "rlhfjob-"


def queue_name(labels: Mapping[str, str] | None) -> str:
    """The LocalQueue a job (or pod) is queued in; "" when it is not queued by Kueue."""
    return str((labels or {}).get(QUEUE_LABEL, ""))


def group_name(job_name: str) -> str:
    """The pod group (and Kueue Workload) name of a job: at most 8 + 48 characters, a label value."""
    return f"{GROUP_PREFIX}{job_name}"


def pod_marks(job_name: str, queue: str, total: int) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations) that put a pod of the job in its Kueue pod group; empty when not queued."""
    if not queue:
        return {}, {}
    return (
        {QUEUE_LABEL: queue, GROUP_LABEL: group_name(job_name)},
        {TOTAL_COUNT_ANNOTATION: str(total)},
    )


def mark_pod(pod: dict[str, Any], job_name: str, queue: str, total: int) -> dict[str, Any]:
    """Add the group marks to a pod manifest (in place; returned for chaining). Applied last, so a
    podTemplate cannot split a job's pods into different groups."""
    labels, annotations = pod_marks(job_name, queue, total)
    if labels:
        meta = pod.setdefault("metadata", {})
        meta.setdefault("labels", {}).update(labels)
        meta.setdefault("annotations", {}).update(annotations)
    return pod


def gated(pod: Mapping[str, Any]) -> bool:
    """The pod still carries Kueue's admission gate (its Workload is not admitted)."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or ()
    return any(g.get("name") == ADMISSION_GATE for g in gates)


def stop_reason(pod: Mapping[str, Any]) -> str:
    """`reason: message` of Kueue's TerminationTarget condition on the pod, "" when there is none."""
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if cond.get("type") == STOP_CONDITION and cond.get("status") == "True":
            reason, message = cond.get("reason") or "Stopped", cond.get("message") or ""
            return f"{reason}: {message}" if message else str(reason)
    return ""
