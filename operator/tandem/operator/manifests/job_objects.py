"""A job's names, labels and owner references, and the objects beside its pods: Service, spec ConfigMap, token
Secret.

Pure, as every builder: an RLHFJob in, names and plain manifests (dicts) out.

Objects of a job `<job>` in namespace `<ns>` (the pods are built by `builders`):
  Service    `<job>`          headless, selects every pod of the job (rendezvous DNS names)
  ConfigMap  `<job>-spec-<h>` key `job.yaml`: the job (apiVersion, kind, metadata, spec) as YAML; immutable,
                              named by its content (h), so a changed spec is a new ConfigMap, never a patch
  Secret     `<job>-token`    key `token`: the checkpoint-engine API token (created once, kept)
  Pod        `<job>-<i>`      i < replicas: trainer container + rollout native sidecar (role hybrid)
                              replicas <= i: rollout container only (rolloutOnlyReplicas; role rollout)

Pod labels: tandem.dev/job, tandem.dev/role (hybrid|rollout), tandem.dev/index,
tandem.dev/restart-generation; when the job is labelled kueue.x-k8s.io/queue-name, Kueue's pod-group
labels and annotation too (`tandem.operator.manifests.kueue`, applied last), and its pods of restart generation
g > 0 are named `<job>-<i>-g<g>` (`pod_object_name`; hostname unchanged). Every pod has hostname
`<job>-<i>` and subdomain `<job>`, so pod 0 answers at `<job>-0.<job>.<ns>.svc`.
With spec.gangScheduling, each hybrid pod joins its gang's PodGroup `<job>-hybrid-g<g>`
(`spec.schedulingGroup`; `tandem.operator.manifests.gang` builds the Workload and PodGroup objects).

Callers: `builders` (the pods take these names, labels and ports), `tandem.operator.runtime.reconcile` (creates
the Service, ConfigMap and Secret), the policies and the cluster edge (labels, pod names), `gang`, `tandem run`.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

import yaml

from tandem.operator.manifests import kueue
from tandem.spec.models import API_VERSION, KIND, RLHFJob

Manifest = dict[str, Any]
SAFE_DUMPER: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml: ~10x faster, same documents

LABEL_JOB = "tandem.dev/job"
LABEL_ROLE = "tandem.dev/role"
LABEL_INDEX = "tandem.dev/index"
LABEL_GENERATION = "tandem.dev/restart-generation"
ROLE_HYBRID = "hybrid"
ROLE_ROLLOUT = "rollout"
JOB_FILE_KEY = "job.yaml"
MASTER_PORT = 29500
SHARD_PORT_NAME = "shards"  # the rollout's shard server (checkpointEngine.shardPort)
TOKEN_KEY = "token"


def service_name(job_name: str) -> str:
    return job_name


def spec_configmap_name(job: RLHFJob) -> str:
    return f"{job.metadata.name}-spec-{hashlib.sha256(job_text(job).encode()).hexdigest()[:10]}"


def token_secret_name(job_name: str) -> str:
    return f"{job_name}-token"


def pod_name(job_name: str, index: int) -> str:
    return f"{job_name}-{index}"


def pod_count(job: RLHFJob) -> int:
    return job.spec.replicas + job.spec.rollout_only_replicas


def pod_names(job: RLHFJob, generation: int = 0) -> list[str]:
    """Object names of the job's pods in restart generation `generation` (see `pod_object_name`)."""
    queued = bool(kueue.queue_name(job.metadata.labels))
    return [pod_object_name(job.metadata.name, i, generation, queued=queued) for i in range(pod_count(job))]


def pod_object_name(job_name: str, index: int, generation: int, *, queued: bool = False) -> str:
    """`<job>-<i>`; for a job queued by Kueue, `<job>-<i>-g<generation>` after its first gang: Kueue keeps
    its finalizer on a stopped group's pods until it sees their replacements, so these must not wait
    for the old names to be free. The hostname (and the env contract's pod name) stays `<job>-<i>`."""
    name = pod_name(job_name, index)
    return f"{name}-g{generation}" if queued and generation > 0 else name


def pod_group_name(job_name: str, generation: int) -> str:
    """The PodGroup of the hybrid pods of restart generation `generation` (spec.gangScheduling)."""
    return f"{job_name}-hybrid-g{generation}"


def new_token() -> str:
    """A fresh random checkpoint-engine API token (the only impure helper: callers choose when)."""
    return secrets.token_urlsafe(32)


def owner_reference(name: str, uid: str) -> Manifest:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def object_metadata(job: RLHFJob, name: str, owner_uid: str | None, labels: dict[str, str]) -> Manifest:
    meta: Manifest = {"name": name, "namespace": job.metadata.namespace, "labels": labels}
    if owner_uid is not None:
        meta["ownerReferences"] = [owner_reference(job.metadata.name, owner_uid)]
    return meta


def job_labels(job_name: str) -> dict[str, str]:
    return {LABEL_JOB: job_name, "app.kubernetes.io/name": "tandem", "app.kubernetes.io/component": "rlhfjob"}


def pod_labels(job_name: str, role: str, index: int, generation: int) -> dict[str, str]:
    return {
        **job_labels(job_name),
        LABEL_ROLE: role,
        LABEL_INDEX: str(index),
        LABEL_GENERATION: str(generation),
    }


def rollout_only_selector(job_name: str) -> str:
    """Label selector of a job's rollout-only pods (the /scale subresource's labelSelectorPath)."""
    return f"{LABEL_JOB}={job_name},{LABEL_ROLE}={ROLE_ROLLOUT}"


def ce_ports(job: RLHFJob) -> tuple[int, int]:
    """(trainer, rollout) checkpoint-engine ports."""
    port = job.spec.checkpoint_engine.port
    return port, port + 1


def build_service(job: RLHFJob, *, owner_uid: str | None = None) -> Manifest:
    """Headless Service: stable DNS for every pod (rendezvous + checkpoint-engine peers)."""
    trainer_port, rollout_port = ce_ports(job)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_metadata(job, service_name(job.metadata.name), owner_uid, job_labels(job.metadata.name)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_JOB: job.metadata.name},
            "ports": [
                {"name": "rendezvous", "port": MASTER_PORT, "targetPort": MASTER_PORT, "protocol": "TCP"},
                {"name": "ce-trainer", "port": trainer_port, "targetPort": trainer_port, "protocol": "TCP"},
                {"name": "ce-rollout", "port": rollout_port, "targetPort": rollout_port, "protocol": "TCP"},
                {"name": SHARD_PORT_NAME, "port": job.spec.checkpoint_engine.shard_port,
                 "targetPort": job.spec.checkpoint_engine.shard_port, "protocol": "TCP"},
            ],
        },
    }


def job_document(job: RLHFJob) -> Manifest:
    """The job as the sidecars read it: apiVersion, kind, metadata (name, namespace), spec."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": job.metadata.name, "namespace": job.metadata.namespace},
        "spec": job.spec.model_dump(mode="json", by_alias=True, exclude_none=True),
    }


def job_text(job: RLHFJob) -> str:
    return yaml.dump(job_document(job), Dumper=SAFE_DUMPER, sort_keys=False)


def build_spec_configmap(job: RLHFJob, *, owner_uid: str | None = None) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_metadata(job, spec_configmap_name(job), owner_uid, job_labels(job.metadata.name)),
        "immutable": True,
        "data": {JOB_FILE_KEY: job_text(job)},
    }


def build_token_secret(job: RLHFJob, token: str, *, owner_uid: str | None = None) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": object_metadata(
            job, token_secret_name(job.metadata.name), owner_uid, job_labels(job.metadata.name)
        ),
        "stringData": {TOKEN_KEY: token},
    }
