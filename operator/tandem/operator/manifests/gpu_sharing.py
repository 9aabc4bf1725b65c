"""How the trainer and the rollout of one pod share its GPUs (`spec.gpuAllocation`).

Role: pure manifest edits applied by `tandem.operator.manifests.builders` to every pod of a job with
`gpusPerPod > 0`, and the one extra object DRA needs. Two modes, because which one works depends on
the cluster:

* `devicePlugin` (default): only the container that owns the GPUs requests `nvidia.com/gpu` (the
  trainer in a hybrid pod, the rollout in a rollout-only pod). The hybrid pod's rollout gets
  NVIDIA_VISIBLE_DEVICES=all, so the NVIDIA container toolkit mounts the node's GPUs into it, and
  restricts itself to exactly the trainer's: the trainer writes the GPU UUIDs the device plugin gave
  it to `TANDEM_GPU_IDS_FILE` in an emptyDir both mount, and the rollout's entry waits for that file
  and sets CUDA_VISIBLE_DEVICES before CUDA starts (`tandem.sidecars.gpu_share`). Toolkits hardened
  with `accept-nvidia-visible-devices-envvar-when-unprivileged = false` (or CDI-only setups) ignore
  that variable in unprivileged containers: there the rollout sees no GPU and refuses to start, and
  the job needs DRA.
* `dra`: the operator creates a ResourceClaimTemplate `<job>-gpus` (resource.k8s.io/v1, owned by the
  job) asking `gpuDeviceClassName` for exactly gpusPerPod devices; each pod gets one ResourceClaim
  from it, referenced by both containers, so the DRA driver gives both the same devices and nothing
  requests `nvidia.com/gpu`.
Callers: `builders.build_pod` (`attach`), `reconcile` (the claim template before the pods).
"""

from __future__ import annotations

from typing import Any

from tandem.spec.models import RLHFJob
from tandem.spec.podenv import PodEnv

Manifest = dict[str, Any]
GPU_RESOURCE = "nvidia.com/gpu"
CLAIM = "gpus"  # the pod's resourceClaims entry, and the containers' resources.claims name
IDS_VOLUME = "gpu-ids"
IDS_DIR = "/var/run/tandem-gpus"
IDS_FILE = f"{IDS_DIR}/visible"
DRA_API_VERSION = "resource.k8s.io/v1"


def uses_dra(job: RLHFJob) -> bool:
    return job.spec.gpus_per_pod > 0 and job.spec.gpu_allocation == "dra"


def claim_template_name(job_name: str) -> str:
    return f"{job_name}-gpus"


def claim_template(job: RLHFJob, owner: Manifest | None) -> Manifest:
    """The job's ResourceClaimTemplate: gpusPerPod devices of gpuDeviceClassName per pod."""
    meta: Manifest = {"name": claim_template_name(job.metadata.name), "namespace": job.metadata.namespace,
                      "labels": {"tandem.dev/job": job.metadata.name}}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    request = {"name": CLAIM, "exactly": {"deviceClassName": job.spec.gpu_device_class_name,
                                          "allocationMode": "ExactCount", "count": job.spec.gpus_per_pod}}
    return {"apiVersion": DRA_API_VERSION, "kind": "ResourceClaimTemplate", "metadata": meta,
            "spec": {"spec": {"devices": {"requests": [request]}}}}


def _drop_gpu_resource(container: Manifest) -> None:
    for part in ("requests", "limits"):
        container.get("resources", {}).get(part, {}).pop(GPU_RESOURCE, None)


def attach(pod_spec: Manifest, job: RLHFJob, *, hybrid: bool) -> Manifest:
    """Wire the pod's trainer and rollout containers to its GPUs as `spec.gpuAllocation` says."""
    if job.spec.gpus_per_pod == 0:
        return pod_spec
    containers = {c["name"]: c for c in [*pod_spec.get("initContainers", []), *pod_spec["containers"]]}
    users = [containers[n] for n in ("trainer", "rollout") if n in containers]
    if uses_dra(job):
        pod_spec["resourceClaims"] = [{"name": CLAIM, "resourceClaimTemplateName":
                                       claim_template_name(job.metadata.name)}]
        for c in users:
            _drop_gpu_resource(c)
            c.setdefault("resources", {})["claims"] = [{"name": CLAIM}]
        return pod_spec
    if not hybrid:  # a rollout-only pod: its rollout requested the GPUs itself
        return pod_spec
    own = 2  # after the pod's shm and job-spec, before spec.volumes' vol-*
    pod_spec["volumes"].insert(own, {"name": IDS_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}})
    ids = PodEnv.environ(gpu_ids_file=IDS_FILE)
    for c in users:
        c["env"] += [{"name": k, "value": v} for k, v in ids.items()]
        c["volumeMounts"].insert(own, {"name": IDS_VOLUME, "mountPath": IDS_DIR})
    containers["rollout"]["env"].append({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"})
    return pod_spec
