"""Merge spec.podTemplate over a pod the builders made: pure, manifest in, manifest out.

Caller: `tandem.operator.manifests.builders.build_pod`, last, so every pod of a job (hybrid and rollout-only,
in a cluster and under `tandem run`) gets the same override; a rollout-only pod gets
spec.podTemplate.rolloutOnly merged over it first (`for_pod`: its labels, annotations and nodeSelector
entries win over the template's, its tolerations are added, its affinity and priorityClassName
replace the template's), so the rollout-only pool can run apart, e.g. on spot nodes. The spec's rules
(`tandem.spec.podtemplate`) already refuse overrides that would break the pod; the merge still
checks what it adds against what is there and raises `PodTemplateConflict` naming the field rather
than letting a user value replace the operator's.

Precedence: the operator's labels, env, volumes, mounts and tolerations stay as they are; the
override's labels and annotations, nodeSelector entries, tolerations, imagePullSecrets and volumes
are added; affinity, priorityClassName and serviceAccountName are set where the builders left them
unset. Per container (`trainer`, `rollout`, wherever the pod holds them): env entries are appended
after the contract's, envFrom is appended (Kubernetes lets env entries win over envFrom), and
volumeMounts are appended, a spec.volumes entry named by its own name (pod volume `vol-<name>`);
securityContext.capabilities.add (IPC_LOCK only) is added beside the operator's drop ALL, and
resources.limits (extended resources only, e.g. an RDMA device) are added as requests and limits.
"""

from __future__ import annotations

from typing import Any

from tandem.spec.models import RLHFJob
from tandem.spec.pod_fields import SPEC_VOLUME_PREFIX
from tandem.spec.podtemplate import PodTemplate

Manifest = dict[str, Any]
FIELD = "spec.podTemplate"


class PodTemplateConflict(ValueError):
    """The override would replace something the operator set; the message names the field."""


def _dump(items: list[Any]) -> list[Manifest]:
    return [i.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_defaults=True) for i in items]


def _add_map(target: Manifest, key: str, extra: dict[str, str], field: str) -> None:
    own = target.get(key, {})
    clash = sorted(k for k in extra if k in own and own[k] != extra[k])
    if clash:
        raise PodTemplateConflict(f"{FIELD}.{field}: {', '.join(clash)} set by the operator")
    if extra or own:
        target[key] = {**extra, **own}


def _set_once(spec: Manifest, key: str, value: Any, field: str) -> None:
    if value is None:
        return
    if key in spec and spec[key] != value:
        raise PodTemplateConflict(f"{FIELD}.{field}: set by the operator to {spec[key]!r}")
    spec[key] = value


def _append(spec: Manifest, key: str, extra: list[Manifest]) -> None:
    if extra:
        own = spec.get(key, [])
        spec[key] = own + [e for e in extra if e not in own]


def _container(c: Manifest, override: Any, spec_volumes: set[str], where: str) -> None:
    names = {e["name"] for e in c.get("env", [])}
    for i, env in enumerate(override.env):
        if env.name in names:
            raise PodTemplateConflict(f"{where}.env[{i}].name: {env.name} is set by the operator")
    paths = {m["mountPath"] for m in c.get("volumeMounts", [])}
    mounts = _dump(override.volume_mounts)
    for i, m in enumerate(mounts):
        if m["mountPath"] in paths:
            raise PodTemplateConflict(f"{where}.volumeMounts[{i}].mountPath: {m['mountPath']} is the operator's")
        if m["name"] in spec_volumes:
            m["name"] = f"{SPEC_VOLUME_PREFIX}{m['name']}"
    caps = override.security_context and override.security_context.capabilities
    if caps and caps.add:  # IPC_LOCK only (the spec's rule); the operator's drop ALL stays
        own = c.setdefault("securityContext", {}).setdefault("capabilities", {})
        own["add"] = own.get("add", []) + [a for a in caps.add if a not in own.get("add", [])]
    extra = override.resources.limits if override.resources else {}
    own_limits = c.setdefault("resources", {}).get("limits", {}) if extra else {}
    for name, count in extra.items():  # extended resources only (the spec's rule): requests = limits
        if name in own_limits:
            raise PodTemplateConflict(f"{where}.resources.limits: {name} is set by the operator")
        c["resources"].setdefault("limits", {})[name] = str(count)
        c["resources"].setdefault("requests", {})[name] = str(count)
    _append(c, "env", _dump(override.env))
    _append(c, "envFrom", _dump(override.env_from))
    _append(c, "volumeMounts", mounts)


def merge(pod: Manifest, template: PodTemplate, spec_volumes: set[str]) -> Manifest:
    """`pod` with `template` merged over it (in place; returned for chaining)."""
    meta, spec, t = pod["metadata"], pod["spec"], template.spec
    _add_map(meta, "labels", template.metadata.labels, "metadata.labels")
    _add_map(meta, "annotations", template.metadata.annotations, "metadata.annotations")
    _add_map(spec, "nodeSelector", t.node_selector, "spec.nodeSelector")
    _append(spec, "tolerations", _dump(t.tolerations))
    _set_once(spec, "affinity", t.affinity and t.affinity.model_dump(
        mode="json", by_alias=True, exclude_none=True, exclude_defaults=True), "spec.affinity")
    _set_once(spec, "priorityClassName", t.priority_class_name, "spec.priorityClassName")
    _set_once(spec, "serviceAccountName", t.service_account_name, "spec.serviceAccountName")
    _append(spec, "imagePullSecrets", [{"name": s.name} for s in t.image_pull_secrets])
    own_volumes = {v["name"] for v in spec.get("volumes", [])}
    for i, v in enumerate(t.volumes):
        if v.name in own_volumes:
            raise PodTemplateConflict(f"{FIELD}.spec.volumes[{i}].name: {v.name} is a volume of the pod's own")
    _append(spec, "volumes", _dump(t.volumes))
    by_name = {c.name: (i, c) for i, c in enumerate(t.containers)}
    for c in spec.get("initContainers", []) + spec.get("containers", []):
        if c["name"] in by_name:
            i, override = by_name[c["name"]]
            _container(c, override, spec_volumes, f"{FIELD}.spec.containers[{i}]")
    return pod


def for_pod(template: PodTemplate, *, rollout_only: bool) -> PodTemplate:
    """The template a pod gets: `template`, with its rolloutOnly part over it for a rollout-only pod."""
    extra = template.rollout_only
    if not rollout_only or extra is None:
        return template
    meta, spec, over = template.metadata, template.spec, extra.spec
    return template.model_copy(update={
        "metadata": meta.model_copy(update={"labels": {**meta.labels, **extra.metadata.labels},
                                            "annotations": {**meta.annotations, **extra.metadata.annotations}}),
        "spec": spec.model_copy(update={
            "node_selector": {**spec.node_selector, **over.node_selector},
            "tolerations": spec.tolerations + [t for t in over.tolerations if t not in spec.tolerations],
            "affinity": over.affinity or spec.affinity,
            "priority_class_name": over.priority_class_name or spec.priority_class_name,
        }),
    })


def apply(pod: Manifest, job: RLHFJob, *, rollout_only: bool = False) -> Manifest:
    """`pod` with the job's spec.podTemplate merged over it (rolloutOnly too for a rollout-only pod);
    unchanged when the job has none."""
    if job.spec.pod_template is None:
        return pod
    template = for_pod(job.spec.pod_template, rollout_only=rollout_only)
    return merge(pod, template, {v.name for v in job.spec.volumes})
