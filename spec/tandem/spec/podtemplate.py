"""spec.podTemplate: what a cluster needs of the job's pods, merged over what the builders make.

Role: the typed shape of the override (Kubernetes' own field names, as Kubeflow Trainer's
podTemplateOverrides and KubeRay's pod templates use them) and the rules that keep the pods
working: the pod env contract (`tandem.spec.podenv`: every TANDEM_* and MASTER_* variable, and
NVIDIA_VISIBLE_DEVICES, which lets the rollout share the trainer's GPUs), the pod's own volumes
(`shm` at /dev/shm, `job-spec` at /etc/tandem, `vol-<name>` for spec.volumes) and the operator's
labels (tandem.dev/*) stay the operator's. Containers are named `trainer` and `rollout` wherever
they live in the pod (the rollout is a native sidecar in hybrid pods). GPU counts, cpu and memory
are not overridable (spec.gpusPerPod, spec.trainer/rollout resources); a container may add extended
resources (`resources.limits`, e.g. an RDMA device plugin's) beside them. A container's
securityContext may add the IPC_LOCK capability (RDMA) and nothing broader: other capabilities,
privileged or allowPrivilegeEscalation true are refused (the pods pass Pod Security restricted
otherwise). Each rule is a `Rule` (CEL for the API server, Python for `tandem validate`); rules
that need spec.volumes live on `JobSpec` (`JOB_RULES`). `rolloutOnly` (labels, annotations, nodeSelector,
tolerations, affinity, priorityClassName) applies to the rollout-only pods over the rest, so that pool
can run apart, e.g. on spot nodes.
Here: the template itself (metadata, the pod spec's fields, the rollout-only pods' own, the extra volumes) and
the rules across it and spec.volumes (`JOB_RULES`); its containers are `pod_containers`, where the pods run
`pod_scheduling`, and the names and patterns they share `pod_fields`.
Callers: `tandem.spec.models.JobSpec.pod_template`; `tandem.operator.manifests.pod_template` applies it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from tandem.spec.pod_containers import RESTRICTED, ContainerOverride, LocalRef
from tandem.spec.pod_fields import (
    KUEUE_KEY_PREFIX,
    MAP,
    OPERATOR_LABELS,
    QUALIFIED,
    REL_PATH,
    RESERVED_KEY_PREFIX,
    RESERVED_VOLUMES,
    SPEC_VOLUME_PREFIX,
    Labels,
    Name,
    count_set,
    one_of,
    qualified,
)
from tandem.spec.pod_scheduling import Affinity, Toleration
from tandem.spec.strict_model import DNS_LABEL, DNS_SUBDOMAIN, Base, Quantity, Rule


def _key_rules(field: str, attr: str, reserved: tuple[str, ...]) -> tuple[Rule, Rule, Rule]:
    names = " && ".join(f"k != '{k}'" for k in reserved)
    return (
        Rule(f"!has(self.{field}) || self.{field}.all(k, k.matches('{QUALIFIED}') && size(k) <= 317)",
             "keys must be qualified names ([prefix/]name)", f".{field}",
             lambda m: all(qualified(k) for k in getattr(m, attr))),
        Rule(f"!has(self.{field}) || self.{field}.all(k, !k.startsWith('{RESERVED_KEY_PREFIX}')"
             + (f" && {names})" if reserved else ")"),
             f"keys {RESERVED_KEY_PREFIX}*{''.join(', ' + k for k in reserved)} are the operator's", f".{field}",
             lambda m: not any(k.startswith(RESERVED_KEY_PREFIX) or k in reserved for k in getattr(m, attr))),
        Rule(f"!has(self.{field}) || self.{field}.all(k, !k.startsWith('{KUEUE_KEY_PREFIX}'))",
             f"keys {KUEUE_KEY_PREFIX}* are set by the operator: put kueue.x-k8s.io/queue-name in the job's "
             "metadata.labels", f".{field}",
             lambda m: not any(k.startswith(KUEUE_KEY_PREFIX) for k in getattr(m, attr))),
    )


class PodMetadata(Base):
    labels: Labels = Field(default_factory=dict, description="Added to every pod (e.g. for Kueue or cost "
                           "tracking); the operator's own labels win.")
    annotations: Annotated[dict[str, Annotated[str, Field(max_length=65_536)]], Field(max_length=64)] = Field(
        default_factory=dict, description="Added to every pod.")
    rules = (*_key_rules("labels", "labels", OPERATOR_LABELS), *_key_rules("annotations", "annotations", ()))


class KeyToPath(Base):
    key: Annotated[str, Field(min_length=1, max_length=253)]
    path: Annotated[str, Field(pattern=REL_PATH, max_length=256)]
    mode: Annotated[int | None, Field(ge=0, le=0o777)] = None


class SecretSource(Base):
    secret_name: Name
    items: Annotated[list[KeyToPath], Field(max_length=64)] = Field(default_factory=list)
    default_mode: Annotated[int | None, Field(ge=0, le=0o777)] = None
    optional: bool | None = None


class ConfigMapSource(Base):
    name: Name
    items: Annotated[list[KeyToPath], Field(max_length=64)] = Field(default_factory=list)
    default_mode: Annotated[int | None, Field(ge=0, le=0o777)] = None
    optional: bool | None = None


class EmptyDirSource(Base):
    medium: Literal["", "Memory"] = ""
    size_limit: Quantity | None = None


class PodVolume(Base):
    """An extra pod volume for the containers' volumeMounts: a Secret, a ConfigMap or an emptyDir."""

    name: Annotated[str, Field(pattern=DNS_LABEL, max_length=63)]
    secret: SecretSource | None = None
    config_map: ConfigMapSource | None = None
    empty_dir: EmptyDirSource | None = None
    rules = (
        Rule(one_of("secret", "configMap", "emptyDir"), "exactly one of secret, configMap, emptyDir", ".secret",
             lambda v: count_set(v, "secret", "config_map", "empty_dir") == 1),
        Rule("!(self.name in ['shm', 'job-spec']) && !self.name.startsWith('vol-')",
             "shm, job-spec and vol-* name the pod's own volumes", ".name",
             lambda v: v.name not in RESERVED_VOLUMES and not v.name.startswith(SPEC_VOLUME_PREFIX)),
    )


def _names_unique(field: str, attr: str, key: str = "name") -> Rule:
    return Rule(f"!has(self.{field}) || self.{field}.all(x, self.{field}.exists_one(y, y.{key} == x.{key}))",
                f"{key}s must be unique", f".{field}",
                lambda s: len({getattr(x, key) for x in getattr(s, attr)}) == len(getattr(s, attr)))


def _never_true(field: str, attr: str) -> Rule:
    return Rule(f"!has(self.{field}) || !self.{field}", f"must not be true: {RESTRICTED}", f".{field}",
                lambda s: getattr(s, attr) is not True)


class PodSpecOverride(Base):
    node_selector: Labels = Field(default_factory=dict, description="Node labels the pods require "
                                  "(e.g. a GPU type).")
    tolerations: Annotated[list[Toleration], Field(max_length=32, description="Added to the operator's own "
                                                   "(nvidia.com/gpu when gpusPerPod > 0).")] = Field(
        default_factory=list)
    affinity: Affinity | None = None
    priority_class_name: Annotated[str | None, Field(pattern=DNS_SUBDOMAIN, max_length=253)] = None
    service_account_name: Annotated[str | None, Field(pattern=DNS_SUBDOMAIN, max_length=253)] = None
    image_pull_secrets: Annotated[list[LocalRef], Field(max_length=16)] = Field(default_factory=list)
    volumes: Annotated[list[PodVolume], Field(max_length=16, json_schema_extra={
        **MAP, "x-kubernetes-list-map-keys": ["name"]})] = Field(default_factory=list)
    containers: Annotated[list[ContainerOverride], Field(max_length=2, json_schema_extra={
        **MAP, "x-kubernetes-list-map-keys": ["name"]})] = Field(default_factory=list)
    # Pod Security restricted, named so that a refusal says why (not "unknown field"): never true, or never set
    host_network: bool | None = Field(default=None, description="Refused when true.")
    host_pid: bool | None = Field(default=None, alias="hostPID", description="Refused when true.")
    host_ipc: bool | None = Field(default=None, alias="hostIPC", description="Refused when true.")
    automount_service_account_token: bool | None = Field(default=None, description="Refused when true.")
    security_context: dict[str, Any] | None = Field(default=None, description="Refused: the operator's.",
                                                    json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})
    rules = (
        _names_unique("volumes", "volumes"), _names_unique("containers", "containers"),
        *(_never_true(f, attr) for f, attr in (("hostNetwork", "host_network"), ("hostPID", "host_pid"),
                                               ("hostIPC", "host_ipc"))),
        Rule("!has(self.automountServiceAccountToken) || !self.automountServiceAccountToken",
             f"must not be true: {RESTRICTED}; the sidecars never call the Kubernetes API",
             ".automountServiceAccountToken", lambda s: s.automount_service_account_token is not True),
        Rule("!has(self.securityContext)", f"is the operator's: {RESTRICTED}", ".securityContext",
             lambda s: s.security_context is None),
    )


class SchedulingOverride(Base):
    """Where the rollout-only pods run: merged over `spec` for them only."""

    node_selector: Labels = Field(default_factory=dict, description="Entries win over spec.nodeSelector's "
                                  "(e.g. a spot node pool).")
    tolerations: Annotated[list[Toleration], Field(max_length=32, description="Added to spec.tolerations and "
                                                   "the operator's (e.g. the spot nodes' taint).")] = Field(
        default_factory=list)
    affinity: Affinity | None = Field(default=None, description="Replaces spec.affinity.")
    priority_class_name: Annotated[str | None, Field(pattern=DNS_SUBDOMAIN, max_length=253, description="Replaces "
                                                     "spec.priorityClassName (e.g. a preemptible class).")] = None


class RolloutOnlyTemplate(Base):
    """The rollout-only pods' own labels, annotations and scheduling, over the template's: a lost one is
    replaced alone (no gang restart), so they may run on preemptible nodes."""

    metadata: PodMetadata = Field(default_factory=PodMetadata)
    spec: SchedulingOverride = Field(default_factory=SchedulingOverride)


class PodTemplate(Base):
    """Merged over every pod of the job (Kubernetes field names; see the module docstring)."""

    metadata: PodMetadata = Field(default_factory=PodMetadata)
    spec: PodSpecOverride = Field(default_factory=PodSpecOverride)
    rollout_only: RolloutOnlyTemplate | None = Field(default=None, description="Merged over metadata and spec "
                                                     "for the rollout-only pods only.")


# Rules that also read spec.volumes; `tandem.spec.models.JobSpec` carries them.
def _mount_names_resolve(s: Any) -> bool:
    t: PodTemplate | None = s.pod_template
    known = {v.name for v in s.volumes} | ({v.name for v in t.spec.volumes} if t else set())
    return t is None or all(m.name in known for c in t.spec.containers for m in c.volume_mounts)


def _mount_paths_free(s: Any) -> bool:
    t: PodTemplate | None = s.pod_template
    taken = {v.mount_path for v in s.volumes}
    return t is None or not any(m.mount_path in taken for c in t.spec.containers for m in c.volume_mounts)


def _volume_names_free(s: Any) -> bool:
    t: PodTemplate | None = s.pod_template
    return t is None or not {v.name for v in s.volumes} & {v.name for v in t.spec.volumes}


_MOUNTS = ("!has(self.podTemplate) || !has(self.podTemplate.spec.containers) || "
           "self.podTemplate.spec.containers.all(c, !has(c.volumeMounts) || c.volumeMounts.all(m, ")
_T_VOLUMES = "self.podTemplate.spec.volumes"
JOB_RULES = (
    Rule(_MOUNTS + f"(has(self.volumes) && self.volumes.exists(v, v.name == m.name)) || "
         f"(has({_T_VOLUMES}) && {_T_VOLUMES}.exists(v, v.name == m.name))))",
         "volumeMounts[].name must name a spec.volumes or a podTemplate.spec.volumes entry",
         ".podTemplate.spec.containers", _mount_names_resolve),
    Rule(_MOUNTS + "!has(self.volumes) || !self.volumes.exists(v, v.mountPath == m.mountPath)))",
         "volumeMounts[].mountPath is already a spec.volumes mountPath", ".podTemplate.spec.containers",
         _mount_paths_free),
    Rule(f"!has(self.podTemplate) || !has(self.volumes) || !has({_T_VOLUMES}) || "
         f"!{_T_VOLUMES}.exists(p, self.volumes.exists(v, v.name == p.name))",
         "names must differ from spec.volumes names", ".podTemplate.spec.volumes", _volume_names_free),
)
