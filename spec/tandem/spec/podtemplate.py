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
Callers: `tandem.spec.models.JobSpec.pod_template`; `tandem.operator.manifests.pod_template` applies it.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from tandem.spec.strict_model import (
    ABS_PATH,
    DNS_LABEL,
    DNS_SUBDOMAIN,
    INT_OR_STRING,
    Base,
    Quantity,
    Rule,
    int_as_string,
)

RESERVED_ENV_PREFIXES = ("TANDEM_", "MASTER_")  # the pod env contract (tandem.spec.podenv.PodEnv)
RESERVED_ENV = ("NVIDIA_VISIBLE_DEVICES",)  # set on the rollout of a hybrid pod to share the GPUs
ALLOWED_CAPABILITIES = ("IPC_LOCK",)  # the one capability a container may add (RDMA); the rest are dropped
RESERVED_KEY_PREFIX = "tandem.dev/"
# Kueue's marks are the operator's too: a queue label set only on the pods (not on the job's
# metadata.labels, where the operator reads it) would make Kueue queue each pod alone, with no group
KUEUE_KEY_PREFIX = "kueue.x-k8s.io/"
OPERATOR_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/component")
RESERVED_MOUNTS = ("/dev/shm", "/etc/tandem")  # the shm emptyDir and the job-spec ConfigMap
RESERVED_VOLUMES = ("shm", "job-spec")
SPEC_VOLUME_PREFIX = "vol-"  # pod volumes of spec.volumes entries
# A qualified name ([DNS-subdomain prefix/]name), as label and annotation keys; [.] avoids escapes in CEL.
QUALIFIED = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
             r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
REL_PATH = r"^[A-Za-z0-9_][A-Za-z0-9._\-]*(/[A-Za-z0-9_][A-Za-z0-9._\-]*)*$"  # relative, no '..'
MAP = {"x-kubernetes-list-type": "map"}

Name = Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)]
Key = Annotated[str, Field(min_length=1, max_length=317)]
LabelValue = Annotated[str, Field(pattern=LABEL_VALUE, max_length=63)]
Labels = Annotated[dict[str, LabelValue], Field(max_length=64)]
Values = Annotated[list[Annotated[str, Field(max_length=317)]], Field(max_length=64)]


def qualified(key: str) -> bool:
    """A valid label/annotation key: [prefix/]name, prefix a DNS subdomain <= 253, name <= 63."""
    prefix, _, name = key.rpartition("/")
    return re.match(QUALIFIED, key) is not None and len(prefix) <= 253 and len(name) <= 63


def reserved_env(name: str) -> bool:
    return name.startswith(RESERVED_ENV_PREFIXES) or name in RESERVED_ENV


def reserved_path(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in RESERVED_MOUNTS)


def _one_of(*fields: str) -> str:
    return " + ".join(f"(has(self.{f}) ? 1 : 0)" for f in fields) + " == 1"


def _count(obj: Any, *fields: str) -> int:
    return sum(getattr(obj, f) is not None for f in fields)


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


class Toleration(Base):
    """core/v1 Toleration."""

    key: Annotated[str | None, Field(max_length=317)] = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: Annotated[str | None, Field(pattern=LABEL_VALUE, max_length=63)] = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: Annotated[int | None, Field(ge=0, description="NoExecute only.")] = None
    rules = (
        Rule("self.operator == 'Exists' || has(self.key)", "an empty key needs operator Exists", ".key",
             lambda t: t.operator == "Exists" or bool(t.key)),
        Rule("self.operator != 'Exists' || !has(self.value) || self.value == ''", "operator Exists takes no value",
             ".value", lambda t: t.operator != "Exists" or not t.value),
        Rule("!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
             "applies only to effect NoExecute", ".tolerationSeconds",
             lambda t: t.toleration_seconds is None or t.effect == "NoExecute"),
    )


class NodeSelectorRequirement(Base):
    key: Key
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: Values = Field(default_factory=list)
    rules = (Rule("self.operator in ['In', 'NotIn'] ? has(self.values) && size(self.values) > 0 : "
                  "self.operator in ['Gt', 'Lt'] ? has(self.values) && size(self.values) == 1 : "
                  "!has(self.values) || size(self.values) == 0",
                  "In and NotIn need values, Gt and Lt one, Exists and DoesNotExist none", ".values",
                  lambda r: (len(r.values) > 0 if r.operator in ("In", "NotIn") else
                             len(r.values) == (1 if r.operator in ("Gt", "Lt") else 0))),)


class NodeSelectorTerm(Base):
    match_expressions: Annotated[list[NodeSelectorRequirement], Field(max_length=32)] = Field(default_factory=list)
    match_fields: Annotated[list[NodeSelectorRequirement], Field(max_length=32)] = Field(default_factory=list)


class NodeSelector(Base):
    node_selector_terms: Annotated[list[NodeSelectorTerm], Field(min_length=1, max_length=32)]


class PreferredSchedulingTerm(Base):
    weight: Annotated[int, Field(ge=1, le=100)]
    preference: NodeSelectorTerm


class NodeAffinity(Base):
    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    preferred_during_scheduling_ignored_during_execution: Annotated[
        list[PreferredSchedulingTerm], Field(max_length=32)] = Field(default_factory=list)


class LabelSelectorRequirement(Base):
    key: Key
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: Values = Field(default_factory=list)
    rules = (Rule("self.operator in ['In', 'NotIn'] ? has(self.values) && size(self.values) > 0 : "
                  "!has(self.values) || size(self.values) == 0",
                  "In and NotIn need values; Exists and DoesNotExist take none", ".values",
                  lambda r: bool(r.values) == (r.operator in ("In", "NotIn"))),)


class LabelSelector(Base):
    match_labels: Labels = Field(default_factory=dict)
    match_expressions: Annotated[list[LabelSelectorRequirement], Field(max_length=32)] = Field(default_factory=list)


class PodAffinityTerm(Base):
    label_selector: LabelSelector | None = None
    namespace_selector: LabelSelector | None = None
    namespaces: Annotated[list[Name], Field(max_length=64)] = Field(default_factory=list)
    topology_key: Key
    match_label_keys: Values = Field(default_factory=list)
    mismatch_label_keys: Values = Field(default_factory=list)


class WeightedPodAffinityTerm(Base):
    weight: Annotated[int, Field(ge=1, le=100)]
    pod_affinity_term: PodAffinityTerm


class PodAffinity(Base):
    required_during_scheduling_ignored_during_execution: Annotated[
        list[PodAffinityTerm], Field(max_length=32)] = Field(default_factory=list)
    preferred_during_scheduling_ignored_during_execution: Annotated[
        list[WeightedPodAffinityTerm], Field(max_length=32)] = Field(default_factory=list)


class Affinity(Base):
    """core/v1 Affinity, typed to the depth the scheduler reads."""

    node_affinity: NodeAffinity | None = None
    pod_affinity: PodAffinity | None = None
    pod_anti_affinity: PodAffinity | None = None


class KeyRef(Base):
    name: Name
    key: Annotated[str, Field(pattern=r"^[-._a-zA-Z0-9]+$", max_length=253)]
    optional: bool | None = None


class FieldRef(Base):
    field_path: Annotated[str, Field(min_length=1, max_length=256)]
    api_version: Annotated[str | None, Field(max_length=64)] = None


class ResourceFieldRef(Base):
    container_name: Literal["trainer", "rollout"] | None = None
    resource: Annotated[str, Field(min_length=1, max_length=64)]
    divisor: Quantity | None = None


SOURCES = ("secret_key_ref", "config_map_key_ref", "field_ref", "resource_field_ref")


class EnvVarSource(Base):
    secret_key_ref: KeyRef | None = None
    config_map_key_ref: KeyRef | None = None
    field_ref: FieldRef | None = None
    resource_field_ref: ResourceFieldRef | None = None
    rules = (Rule(_one_of("secretKeyRef", "configMapKeyRef", "fieldRef", "resourceFieldRef"),
                  "exactly one of secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef", ".secretKeyRef",
                  lambda s: _count(s, *SOURCES) == 1),)


class EnvVar(Base):
    name: Annotated[str, Field(pattern=ENV_NAME, max_length=256)]
    value: Annotated[str | None, Field(max_length=65_536)] = None
    value_from: EnvVarSource | None = None
    rules = (
        Rule("!self.name.startsWith('TANDEM_') && !self.name.startsWith('MASTER_') && "
             "self.name != 'NVIDIA_VISIBLE_DEVICES'",
             "TANDEM_*, MASTER_* and NVIDIA_VISIBLE_DEVICES belong to the pod env contract (tandem.spec.podenv)",
             ".name", lambda e: not reserved_env(e.name)),
        Rule("!(has(self.value) && has(self.valueFrom))", "set value or valueFrom, not both", ".valueFrom",
             lambda e: e.value is None or e.value_from is None),
    )


class LocalRef(Base):
    name: Name
    optional: bool | None = None


class EnvFromSource(Base):
    """A Secret's or ConfigMap's keys as variables. Entries of env (the contract's included) win over
    these in Kubernetes, so a key named like a contract variable cannot replace it."""

    prefix: Annotated[str | None, Field(pattern=ENV_NAME, max_length=64)] = None
    config_map_ref: LocalRef | None = None
    secret_ref: LocalRef | None = None
    rules = (Rule(_one_of("configMapRef", "secretRef"), "exactly one of configMapRef and secretRef",
                  ".secretRef", lambda s: _count(s, "config_map_ref", "secret_ref") == 1),)


class VolumeMount(Base):
    name: Annotated[str, Field(pattern=DNS_LABEL, max_length=63, description="A spec.volumes entry or a "
                               "podTemplate.spec.volumes entry, by its name.")]
    mount_path: Annotated[str, Field(pattern=ABS_PATH, max_length=256)]
    sub_path: Annotated[str | None, Field(pattern=REL_PATH, max_length=256)] = None
    read_only: bool = False
    rules = (Rule("!['/dev/shm', '/etc/tandem'].exists(p, self.mountPath == p || self.mountPath.startsWith(p + '/'))",
                  "must not be /dev/shm or /etc/tandem (the pod's own mounts)", ".mountPath",
                  lambda m: not reserved_path(m.mount_path)),)


class Capabilities(Base):
    add: Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=4, description="IPC_LOCK only "
                   "(RDMA memory registration); the operator drops ALL others.")] = Field(default_factory=list)
    rules = (Rule("!has(self.add) || self.add.all(c, c == 'IPC_LOCK')",
                  f"only {', '.join(ALLOWED_CAPABILITIES)} may be added (the pods run as Pod Security "
                  "restricted asks; RDMA needs IPC_LOCK)", ".add",
                  lambda c: all(x in ALLOWED_CAPABILITIES for x in c.add)),)


RESTRICTED = ("the job's pods run as Pod Security restricted asks (tandem.operator.manifests.pod_security: non-root "
              "user, group and fsGroup 10001, which the images are built for, seccomp RuntimeDefault, no host "
              "namespaces, no service-account token)")


class SecurityContext(Base):
    """What a container may ask beyond the operator's restricted context (`tandem.operator.manifests.pod_security`)."""

    capabilities: Capabilities | None = None
    privileged: bool | None = Field(default=None, description="Refused when true.")
    allow_privilege_escalation: bool | None = Field(default=None, description="Refused when true.")
    run_as_user: Annotated[int | None, Field(ge=0, le=2**31 - 1, description="Refused: the operator's.")] = None
    run_as_group: Annotated[int | None, Field(ge=0, le=2**31 - 1, description="Refused: the operator's.")] = None
    run_as_non_root: bool | None = Field(default=None, description="Refused when false.")
    rules = (
        Rule("!has(self.privileged) || !self.privileged", "must not be true: the job's pods are never privileged",
             ".privileged", lambda s: s.privileged is not True),
        Rule("!has(self.allowPrivilegeEscalation) || !self.allowPrivilegeEscalation",
             "must not be true: the job's containers run with allowPrivilegeEscalation false",
             ".allowPrivilegeEscalation", lambda s: s.allow_privilege_escalation is not True),
        Rule("!has(self.runAsUser)", f"is the operator's: {RESTRICTED}", ".runAsUser", lambda s: s.run_as_user is None),
        Rule("!has(self.runAsGroup)", f"is the operator's: {RESTRICTED}", ".runAsGroup",
             lambda s: s.run_as_group is None),
        Rule("!has(self.runAsNonRoot) || self.runAsNonRoot", f"must not be false: {RESTRICTED}", ".runAsNonRoot",
             lambda s: s.run_as_non_root is not False),
    )


GPU_RESOURCES = ("nvidia.com/gpu",)  # the operator's (spec.gpusPerPod, spec.gpuAllocation)


def extended_resource(name: str) -> bool:
    """A device plugin's resource ([domain]/[name], outside kubernetes.io) that is not the GPUs."""
    domain, _, rest = name.partition("/")
    return (bool(domain and rest) and qualified(name) and name not in GPU_RESOURCES
            and not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io")))


WHOLE = r"^[1-9][0-9]*(k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"  # a whole, positive quantity (no m, no fraction)
DeviceCount = Annotated[str, Field(max_length=32, json_schema_extra=INT_OR_STRING), BeforeValidator(int_as_string)]


class ContainerResources(Base):
    """Device-plugin resources a container adds, e.g. an RDMA HCA (`rdma/hca_shared_devices_a`,
    `nvidia.com/hostdev`); the requests equal these limits (extended resources are never overcommitted)."""

    limits: Annotated[dict[str, DeviceCount], Field(max_length=8, description=(
        "Extended resources by name ([domain]/[name]; not nvidia.com/gpu, which spec.gpusPerPod sets, nor "
        "cpu or memory, which spec.trainer/spec.rollout resources set): whole quantities, as integers (1) or "
        "strings (\"1\", \"2k\")."))] = Field(default_factory=dict)
    rules = (
        Rule("!has(self.limits) || self.limits.all(k, k.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]"
             "([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$') && k != 'nvidia.com/gpu' && "
             "!k.matches('^([^/]*[.])?kubernetes[.]io/'))",
             "only extended resources ([domain]/[name], e.g. rdma/hca_shared_devices_a) may be added; "
             "nvidia.com/gpu is spec.gpusPerPod's, cpu and memory are spec.trainer/spec.rollout resources",
             ".limits", lambda r: all(extended_resource(k) for k in r.limits)),
        Rule(f"!has(self.limits) || self.limits.all(k, string(self.limits[k]).matches('{WHOLE}'))",
             "extended resources count whole devices: 1, 2, \"1\", \"2k\" (Kubernetes refuses 0, fractions and "
             "milli-units such as 500m for them)", ".limits",
             lambda r: all(re.match(WHOLE, v) for v in r.limits.values())),
    )


class ContainerOverride(Base):
    name: Literal["trainer", "rollout"] = Field(description="The container: trainer (hybrid pods) or rollout "
                                                "(every pod; a native sidecar in hybrid pods).")
    env: Annotated[list[EnvVar], Field(max_length=64, json_schema_extra={
        **MAP, "x-kubernetes-list-map-keys": ["name"]})] = Field(default_factory=list)
    env_from: Annotated[list[EnvFromSource], Field(max_length=16)] = Field(default_factory=list)
    volume_mounts: Annotated[list[VolumeMount], Field(max_length=16, json_schema_extra={
        **MAP, "x-kubernetes-list-map-keys": ["mountPath"]})] = Field(default_factory=list)
    security_context: SecurityContext | None = Field(default=None, description="May add the IPC_LOCK "
                                                     "capability (RDMA); nothing broader.")
    resources: ContainerResources | None = Field(default=None, description="Extended resources the container "
                                                 "needs beside its GPUs, e.g. an RDMA device (with IPC_LOCK).")

    @model_validator(mode="before")
    @classmethod
    def _operator_fields(cls, data: Any) -> Any:
        for key in ("image", "command", "args", "ports"):
            if isinstance(data, dict) and key in data:
                raise ValueError(f"{key}: the operator's (image: spec.trainer / spec.rollout); an override may "
                                 "add env, envFrom, volumeMounts, securityContext IPC_LOCK and extended resources")
        return data

    @model_validator(mode="after")
    def _unique(self) -> ContainerOverride:
        for field, attr, key in (("env", "env", "name"), ("volumeMounts", "volume_mounts", "mount_path")):
            seen = [getattr(x, key) for x in getattr(self, attr)]
            dup = next((v for i, v in enumerate(seen) if v in seen[:i]), None)
            if dup is not None:
                raise ValueError(f"{field}: duplicate entry {dup!r}")
        return self


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
        Rule(_one_of("secret", "configMap", "emptyDir"), "exactly one of secret, configMap, emptyDir", ".secret",
             lambda v: _count(v, "secret", "config_map", "empty_dir") == 1),
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
