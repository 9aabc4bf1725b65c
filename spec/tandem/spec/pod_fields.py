"""The Kubernetes field shapes every part of spec.podTemplate shares, and the names the operator keeps.

Role: the names, paths and keys of the pods that stay the operator's (the pod env contract's variables, the
pod's own mounts and volumes, the tandem.dev/* and Kueue label keys), the patterns of Kubernetes' names,
label keys and values, environment variable names and relative paths, and the small helpers the rules share.
Callers: `tandem.spec.podtemplate` and its parts (`pod_containers`, `pod_scheduling`),
`tandem.operator.manifests.pod_template` (`SPEC_VOLUME_PREFIX`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import Field

from tandem.spec.strict_model import DNS_SUBDOMAIN

RESERVED_ENV_PREFIXES = ("TANDEM_", "MASTER_")  # the pod env contract (tandem.spec.podenv.PodEnv)
RESERVED_ENV = ("NVIDIA_VISIBLE_DEVICES",)  # set on the rollout of a hybrid pod to share the GPUs
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


def one_of(*fields: str) -> str:
    """CEL: exactly one of `fields` is set."""
    return " + ".join(f"(has(self.{f}) ? 1 : 0)" for f in fields) + " == 1"


def count_set(obj: Any, *fields: str) -> int:
    """How many of `fields` are set on `obj` (the Python side of `one_of`)."""
    return sum(getattr(obj, f) is not None for f in fields)
