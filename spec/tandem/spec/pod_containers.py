"""What a job may add to its `trainer` and `rollout` containers: env, envFrom, volume mounts, IPC_LOCK and
extended resources.

Role: the shape of `spec.podTemplate.spec.containers[]` and the rules that keep the containers working and
restricted: the pod env contract's variables (TANDEM_*, MASTER_*, NVIDIA_VISIBLE_DEVICES) and the pod's own
mounts stay the operator's, a securityContext may add IPC_LOCK (RDMA) and nothing broader, and resources are
extended resources only (GPUs, cpu and memory are set elsewhere in the spec). Callers: `tandem.spec.podtemplate`
(`PodSpecOverride.containers`); the operator merges them into the pods (`tandem.operator.manifests.pod_template`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from tandem.spec.pod_fields import (
    ENV_NAME,
    MAP,
    REL_PATH,
    Name,
    count_set,
    one_of,
    qualified,
    reserved_env,
    reserved_path,
)
from tandem.spec.strict_model import ABS_PATH, DNS_LABEL, INT_OR_STRING, Base, Quantity, Rule, int_as_string

ALLOWED_CAPABILITIES = ("IPC_LOCK",)  # the one capability a container may add (RDMA); the rest are dropped


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
    rules = (Rule(one_of("secretKeyRef", "configMapKeyRef", "fieldRef", "resourceFieldRef"),
                  "exactly one of secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef", ".secretKeyRef",
                  lambda s: count_set(s, *SOURCES) == 1),)


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
    rules = (Rule(one_of("configMapRef", "secretRef"), "exactly one of configMapRef and secretRef",
                  ".secretRef", lambda s: count_set(s, "config_map_ref", "secret_ref") == 1),)


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
