"""The job's PodDisruptionBudget: a drain waits instead of evicting a trainer (pure builder).

Caller: `tandem.operator.runtime.reconcile.carry_out`, with the job's other objects (Service, ConfigMap,
Secret), while spec.podDisruptionBudget is true (the default); when it is false the operator deletes
the budget, so the owner of a stuck drain can let it through without deleting the job.

Why: evicting one hybrid pod kills a trainer rank, which restarts the whole gang (every pod goes,
and without checkpointEngine.persist training starts over). So the budget covers the hybrid pods
only, `<job>-hybrid`, with minAvailable = spec.replicas (immutable), an integer: across restart
generations (the selector names the role, not the generation), no healthy hybrid pod may be evicted.
Not maxUnavailable 0: with maxUnavailable (or a percentage) the disruption controller counts the
expected pods through the /scale subresource of the pods' controller, and an RLHFJob's /scale is its
rollout-only pool (spec.rolloutOnlyReplicas), the wrong number (0 for a job without a pool: every
eviction allowed); an integer minAvailable needs no controller lookup. Voluntary disruptions (`kubectl
drain`, the cluster autoscaler's scale-down, node upgrades that honour budgets) then wait for the
job to end or for the field to be set false; involuntary ones (a node lost, a spot VM reclaimed)
are not stopped by any budget and restart the gang as any failure does. unhealthyPodEvictionPolicy
AlwaysAllow lets a drain evict hybrid pods that are not Ready (a gang still starting, crash-looping,
or stuck), which hold nothing worth waiting for. Rollout-only pods are left out on purpose: one
evicted is replaced alone (`tandem.operator.policies.pool_policy`), so they may sit on preemptible nodes.
Peers: Kubeflow's training operators created a PDB (minAvailable = replicas) per job for gang
scheduling by kube-batch before PodGroups; KubeRay leaves budgets to an opt-in in its chart. Here it
is opt-out, per job, because a lost hybrid pod costs the whole gang.
"""

from __future__ import annotations

from typing import Any

from tandem.operator.manifests import job_objects
from tandem.spec.models import RLHFJob

Manifest = dict[str, Any]
API_VERSION = "policy/v1"


def budget_name(job_name: str) -> str:
    return f"{job_name}-hybrid"


def build_pod_disruption_budget(job: RLHFJob, *, owner_uid: str | None = None) -> Manifest:
    name = job.metadata.name
    return {
        "apiVersion": API_VERSION,
        "kind": "PodDisruptionBudget",
        "metadata": job_objects.object_metadata(job, budget_name(name), owner_uid, job_objects.job_labels(name)),
        "spec": {
            "minAvailable": job.spec.replicas,
            "selector": {"matchLabels": {job_objects.LABEL_JOB: name, job_objects.LABEL_ROLE: job_objects.ROLE_HYBRID}},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
