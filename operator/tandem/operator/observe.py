"""What the operator keeps of a pod: a small, hashable summary built from the pod's manifest.

Callers: the pod index in `tandem.operator.handlers` (one summary per pod, keyed by job),
`tandem.operator.kube.list_job_pods` (fresh listing) and the pure policies that read them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tandem.operator import kueue
from tandem.operator.builders import LABEL_GENERATION, LABEL_INDEX, LABEL_JOB, LABEL_ROLE


@dataclass(frozen=True)
class PodState:
    name: str
    job: str
    index: int
    role: str
    generation: int
    phase: str  # Pending | Running | Succeeded | Failed | Unknown
    deleting: bool = False
    reason: str = ""
    gated: bool = False  # still held by Kueue's admission gate (`tandem.operator.kueue`)
    stopped: str = ""  # Kueue's stop condition on the pod (reason: message), "" when none


def _int(value: Any, default: int = -1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _reason(status: Mapping[str, Any]) -> str:
    """The most telling reason a pod gives: its own, else the first terminated container's."""
    if status.get("reason"):
        return str(status["reason"])
    for key in ("containerStatuses", "initContainerStatuses"):
        for cs in status.get(key) or ():
            term = (cs.get("state") or {}).get("terminated")
            if term and term.get("exitCode"):
                return f"{cs.get('name')} exited {term.get('exitCode')}: {term.get('reason', '')}".strip(": ")
    return ""


def pod_state(pod: Mapping[str, Any]) -> PodState | None:
    """Summary of a pod manifest (dict); None for a pod that carries no tandem job label."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    job = labels.get(LABEL_JOB)
    if not job:
        return None
    status = pod.get("status") or {}
    return PodState(
        name=str(meta.get("name", "")),
        job=str(job),
        index=_int(labels.get(LABEL_INDEX)),
        role=str(labels.get(LABEL_ROLE, "")),
        generation=_int(labels.get(LABEL_GENERATION)),
        phase=str(status.get("phase") or "Pending"),
        deleting=meta.get("deletionTimestamp") is not None,
        reason=_reason(status),
        gated=kueue.gated(pod),
        stopped=kueue.stop_reason(pod),
    )
