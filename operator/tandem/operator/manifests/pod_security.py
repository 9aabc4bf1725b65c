"""Pod Security "restricted" for every pod the operator builds: pure, pod spec in, pod spec out.

Caller: `tandem.operator.manifests.builders.build_pod`, before spec.podTemplate is merged (the template may
add the IPC_LOCK capability to a container, nothing broader: `tandem.spec.podtemplate`, merged by
`tandem.operator.manifests.pod_template`).

What the Kubernetes Pod Security Standards' restricted profile asks, and what the pods get:
- pod: runAsNonRoot, runAsUser/runAsGroup/fsGroup 10001 (the images' user: `useradd --uid 10001`
  in Dockerfile.megatron and Dockerfile.vllm; fsGroup makes the volumes writable for it),
  seccompProfile RuntimeDefault;
- every container, the rollout native sidecar (an init container) included: allowPrivilegeEscalation
  false, capabilities drop ALL;
- automountServiceAccountToken false: the sidecars never call the Kubernetes API (they meet the
  operator through etcd and the job document), so no token is mounted into the job's pods.
A spec.volumes hostPath entry still violates restricted (and baseline): such a job needs a namespace
that enforces privileged (docs/security.md); so does IPC_LOCK, which baseline does not allow either.
"""

from __future__ import annotations

from typing import Any

Manifest = dict[str, Any]
RUN_AS = 10001  # user and group of the sidecar images


def pod_context() -> Manifest:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_context() -> Manifest:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def restrict(pod_spec: Manifest) -> Manifest:
    """`pod_spec` (in place; returned for chaining) with the contexts above on it and every container."""
    pod_spec["securityContext"] = pod_context()
    pod_spec["automountServiceAccountToken"] = False
    for c in pod_spec.get("initContainers", []) + pod_spec.get("containers", []):
        c["securityContext"] = container_context()
    return pod_spec
