"""Gang scheduling by kube-scheduler itself: the Workload API objects of a job (pure builders).

Callers: `tandem.operator.runtime.reconcile.carry_out` (creates the Workload and the gang's PodGroup before the
pods, and deletes the PodGroups of earlier gangs); `tandem.operator.manifests.builders.build_pod` puts each
hybrid pod in its gang's PodGroup (`job_objects.pod_group_name`). Opt-in with `spec.gangScheduling: true`.

Kubernetes 1.36 schedules a group of pods all-or-nothing (`scheduling.k8s.io/v1alpha2`, feature
gates GenericWorkload and GangScheduling on the API server, the scheduler and the controller
manager). A Workload holds the static shape (pod group templates with a scheduling policy); a
PodGroup is one runtime instance of a template; a pod joins one with `spec.schedulingGroup.
podGroupName`. The scheduler's GangScheduling plugin keeps the group's pods out of its queue until
`minCount` of them exist, and holds each placed pod at Permit until `minCount` are placed, so
either all bind or none do (after 5 minutes without quorum the placed ones are released and tried
again). The objects follow what the Job controller makes for a Job in 1.36 (WorkloadWithJob):

  Workload  `<job>`               controllerRef {apiGroup tandem.dev, kind RLHFJob, name <job>}; one
                                  template `hybrid` with policy gang, minCount = spec.replicas
  PodGroup  `<job>-hybrid-g<g>`   one per restart generation g (`job_status.gang_generation`): a new gang
                                  is a new instance, so pods of an old gang still terminating never
                                  count towards the new one's quorum; template ref to the Workload's
                                  `hybrid`, the same policy

Both are owned by the RLHFJob (the garbage collector deletes them with it; the PodGroup is also
owned, not as controller, by the Workload, as the Job controller does) and labelled `tandem.dev/job`.
The gang is the hybrid pods only (the trainers must start together for their rendezvous);
rollout-only pods stay outside it and are scheduled one by one, so /scale never waits for a quorum.
"""

from __future__ import annotations

from typing import Any

from tandem.operator.manifests.job_objects import LABEL_GENERATION, LABEL_JOB, owner_reference, pod_group_name
from tandem.spec.models import GROUP, KIND, RLHFJob

Manifest = dict[str, Any]

API_GROUP = "scheduling.k8s.io"
API_VERSION_WORKLOAD = "v1alpha2"
WORKLOADS, PODGROUPS = "workloads", "podgroups"
TEMPLATE = "hybrid"  # the one pod group template (job_objects.pod_group_name carries it)
UNAVAILABLE_REASON = "GangSchedulingUnavailable"
UNAVAILABLE = (f"spec.gangScheduling: the API server does not serve {API_GROUP}/{API_VERSION_WORKLOAD} "
               "workloads and podgroups (Kubernetes >= 1.36 with the GenericWorkload and GangScheduling "
               "feature gates); no pods are created until it does")


def enabled(job: RLHFJob) -> bool:
    return job.spec.gang_scheduling


def workload_name(job_name: str) -> str:
    return job_name


def _policy(job: RLHFJob) -> Manifest:
    return {"gang": {"minCount": job.spec.replicas}}


def _owner(job_name: str, uid: str | None) -> list[Manifest]:
    return [] if uid is None else [owner_reference(job_name, uid)]


def build_workload(job: RLHFJob, *, owner_uid: str | None = None) -> Manifest:
    name = job.metadata.name
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION_WORKLOAD}",
        "kind": "Workload",
        "metadata": {"name": workload_name(name), "namespace": job.metadata.namespace,
                     "labels": {LABEL_JOB: name}, "ownerReferences": _owner(name, owner_uid)},
        "spec": {
            "controllerRef": {"apiGroup": GROUP, "kind": KIND, "name": name},
            "podGroupTemplates": [{"name": TEMPLATE, "schedulingPolicy": _policy(job)}],
        },
    }


def build_pod_group(
    job: RLHFJob, generation: int, *, owner_uid: str | None = None, workload_uid: str | None = None
) -> Manifest:
    name = job.metadata.name
    owners = _owner(name, owner_uid)
    if workload_uid:  # not the controller, and never blocking the Workload's deletion
        owners.append({"apiVersion": f"{API_GROUP}/{API_VERSION_WORKLOAD}", "kind": "Workload",
                       "name": workload_name(name), "uid": workload_uid})
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION_WORKLOAD}",
        "kind": "PodGroup",
        "metadata": {"name": pod_group_name(name, generation), "namespace": job.metadata.namespace,
                     "labels": {LABEL_JOB: name, LABEL_GENERATION: str(generation)},
                     "ownerReferences": owners},
        "spec": {
            "podGroupTemplateRef": {"workload": {"workloadName": workload_name(name),
                                                 "podGroupTemplateName": TEMPLATE}},
            "schedulingPolicy": _policy(job),
        },
    }


def creates_gang(job: RLHFJob, indices: list[int]) -> bool:
    """A pass that creates any hybrid pod must first make sure its gang's objects exist."""
    return enabled(job) and any(i < job.spec.replicas for i in indices)


def stale_groups(groups: list[Manifest], generation: int) -> list[str]:
    """Names of the job's PodGroups that belong to an earlier gang than `generation`."""
    out = []
    for group in groups:
        meta = group.get("metadata") or {}
        try:
            theirs = int((meta.get("labels") or {}).get(LABEL_GENERATION, "-1"))
        except ValueError:
            continue
        if theirs != generation:
            out.append(str(meta.get("name")))
    return sorted(out)
