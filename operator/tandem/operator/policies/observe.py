"""What the operator keeps of a pod: a small, hashable summary built from the pod's manifest.

Callers: the pod index in `tandem.operator.runtime.handlers` (one summary per pod, keyed by job),
`tandem.operator.cluster.kube.list_job_pods` (fresh listing) and the pure policies that read them.
A container's termination message (the one line a sidecar that refused to start wrote, or the tail of
its log: terminationMessagePolicy FallbackToLogsOnError) gives its last line to a failed pod's reason
and to a crash loop's message, so the job's status says why rather than "Error" or the back-off; a
container that exited REFUSED_EXIT (2: it refused its input) marks the pod `refused`, which fails the
job at once (`tandem.operator.policies.plan`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tandem.operator.manifests import kueue
from tandem.operator.manifests.job_objects import LABEL_GENERATION, LABEL_INDEX, LABEL_JOB, LABEL_ROLE

# Waiting reasons of a container that is not getting anywhere by itself (the kubelet's words).
STUCK_WAITING = frozenset({"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "CreateContainerConfigError",
                           "CrashLoopBackOff"})


@dataclass(frozen=True)
class ContainerIssue:
    """A container (init/native-sidecar ones included) waiting in `STUCK_WAITING` or restarted."""

    container: str
    reason: str  # its waiting reason when in STUCK_WAITING, else ""
    message: str
    restarts: int  # restartCount


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
    gated: bool = False  # still held by Kueue's admission gate (`tandem.operator.manifests.kueue`)
    stopped: str = ""  # Kueue's stop condition on the pod (reason: message), "" when none
    issues: tuple[ContainerIssue, ...] = ()  # containers stuck waiting or restarted (`stuck_policy`)
    unschedulable: str = ""  # the scheduler's message while condition PodScheduled is False (Unschedulable)
    unschedulable_since: str = ""  # that condition's lastTransitionTime (RFC 3339)
    refused: str = ""  # a sidecar that refused to start (exit REFUSED_EXIT): "<container>: <its one line>"
    uid: str = ""  # metadata.uid: tells a replacement from the pod it replaces (`tandem.operator.policies.pool_policy`)


def _int(value: Any, default: int = -1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def last_line(message: Any) -> str:
    """The last non-empty line of a termination message: the one-line reason a sidecar that refused to
    start wrote to /dev/termination-log, or (FallbackToLogsOnError) the last line of its log."""
    lines = [line.strip() for line in str(message or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _exited(term: Mapping[str, Any]) -> str:
    """`exited <code>: <reason>: <last line of the termination message>`."""
    parts = [f"exited {term.get('exitCode')}", str(term.get("reason") or ""), last_line(term.get("message"))]
    return ": ".join(p for p in parts if p)


def _reason(status: Mapping[str, Any]) -> str:
    """The most telling reason a pod gives: its own, else the first terminated container's."""
    if status.get("reason"):
        return str(status["reason"])
    for key in ("containerStatuses", "initContainerStatuses"):
        for cs in status.get(key) or ():
            term = (cs.get("state") or {}).get("terminated")
            if term and term.get("exitCode"):
                return f"{cs.get('name')} {_exited(term)}"
    return ""


def _issues(status: Mapping[str, Any]) -> tuple[ContainerIssue, ...]:
    out = []
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(key) or ():
            waiting = (cs.get("state") or {}).get("waiting") or {}
            reason = str(waiting.get("reason") or "")
            restarts = _int(cs.get("restartCount"), 0)
            if reason in STUCK_WAITING or restarts > 0:
                stuck = reason in STUCK_WAITING
                message = str(waiting.get("message") or "") if stuck else ""
                last = (cs.get("lastState") or {}).get("terminated")
                if reason == "CrashLoopBackOff" and last:  # why it crashed first, then the kubelet's back-off
                    message = "; ".join(m for m in (_exited(last), message) if m)
                out.append(ContainerIssue(str(cs.get("name", "")), reason if stuck else "", message, restarts))
    return tuple(out)


def _unschedulable(status: Mapping[str, Any]) -> tuple[str, str]:
    for cond in status.get("conditions") or ():
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" \
                and cond.get("reason") == "Unschedulable":
            return str(cond.get("message") or "Unschedulable"), str(cond.get("lastTransitionTime") or "")
    return "", ""


REFUSED_EXIT = 2  # `tandem.sidecars.startup.refuse`: bad input (model dir, dataset row, env); a restart cannot help


def _refused(status: Mapping[str, Any]) -> str:
    """The first container that exited REFUSED_EXIT (now, or before the kubelet restarted it), with why."""
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(key) or ():
            for state in (cs.get("state") or {}, cs.get("lastState") or {}):
                term = state.get("terminated")
                if term and _int(term.get("exitCode")) == REFUSED_EXIT:
                    return f"{cs.get('name')}: {last_line(term.get('message')) or 'refused to start'}"
    return ""


def pod_state(pod: Mapping[str, Any]) -> PodState | None:
    """Summary of a pod manifest (dict); None for a pod that carries no tandem job label."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    job = labels.get(LABEL_JOB)
    if not job:
        return None
    status = pod.get("status") or {}
    unschedulable, since = _unschedulable(status)
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
        issues=_issues(status),
        unschedulable=unschedulable,
        unschedulable_since=since,
        refused=_refused(status),
        uid=str(meta.get("uid") or ""),
    )
