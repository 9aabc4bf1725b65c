"""Stuck-gang policy: which containers and pods of the current gang are not getting anywhere, and
when that counts as a gang failure (spec.failurePolicy). Pure functions of the observed pods, the
policy and the clock values passed in.

Callers: `tandem.operator.policies.plan.decide` (shows the first issue in the phase message, the REASON
column and condition ContainersWaiting; turns a verdict into a gang restart or a failure).

Issues, in pod index order (init containers, i.e. the rollout native sidecar, first):
- a container waiting in ImagePullBackOff, ErrImagePull, InvalidImageName, CreateContainerConfigError
  or CrashLoopBackOff (the kubelet's reason and message, `tandem.operator.policies.observe.STUCK_WAITING`);
- a pod Pending with condition PodScheduled False, reason Unschedulable (the scheduler's message).
Verdicts (the first that applies), each with a stable reason:
- ContainerRestartLimit: a container's restartCount reached maxContainerRestarts;
- WaitingTimeout: a container waits on an image or config reason and the job's condition
  ContainersWaiting has been True for waitingTimeoutSeconds (0: never);
- SchedulingTimeout: a pod has been Unschedulable for schedulingTimeoutSeconds (since the
  scheduler's lastTransitionTime of its PodScheduled condition; 0: never).
A verdict restarts the gang while failurePolicy.action is RestartJob and restarts < maxRestarts,
else the job fails; either way every pod is deleted, so the GPUs of the scheduled pods are released.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from tandem.operator.policies.observe import PodState
from tandem.spec.models import FailurePolicy

IMAGE_OR_CONFIG = frozenset({"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "CreateContainerConfigError"})
UNSCHEDULABLE = "Unschedulable"
MESSAGE_CHARS = 300  # of a kubelet or scheduler message carried into the status


@dataclass(frozen=True)
class Issue:
    pod: str
    container: str  # "" for a pod the scheduler cannot place
    reason: str  # the kubelet's waiting reason, or Unschedulable
    message: str

    def describe(self) -> str:
        where = f"pod {self.pod}" + (f" container {self.container}" if self.container else "")
        text = self.message[:MESSAGE_CHARS] + ("..." if len(self.message) > MESSAGE_CHARS else "")
        return f"{where} {self.reason}" + (f": {text}" if text else "")


@dataclass(frozen=True)
class Verdict:
    reason: str  # ContainerRestartLimit | WaitingTimeout | SchedulingTimeout
    message: str


def _current(pods: Iterable[PodState], generation: int) -> list[PodState]:
    return sorted((p for p in pods if p.generation == generation and not p.deleting), key=lambda p: p.index)


def issues(pods: Iterable[PodState], generation: int) -> list[Issue]:
    """Every issue of the gang of `generation`, in pod index order."""
    out: list[Issue] = []
    for p in _current(pods, generation):
        out += [Issue(p.name, c.container, c.reason, c.message) for c in p.issues if c.reason]
        if p.unschedulable and p.phase == "Pending":
            out.append(Issue(p.name, "", UNSCHEDULABLE, p.unschedulable))
    return out


def same_kind(a: str, b: str) -> bool:
    """Reasons the kubelet alternates between (ErrImagePull <-> ImagePullBackOff) are one state."""
    return a == b or (a in IMAGE_OR_CONFIG and b in IMAGE_OR_CONFIG)


def _since(text: str) -> datetime | None:
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def verdict(
    pods: Iterable[PodState], generation: int, policy: FailurePolicy, *, waiting_since: datetime | None,
    now: datetime,
) -> Verdict | None:
    """Whether the gang of `generation` failed one of the policy's limits (None: not yet)."""
    current = _current(pods, generation)
    for p in current:
        for c in p.issues:
            if c.restarts >= policy.max_container_restarts:
                what = f"{c.reason}: {c.message}"[:MESSAGE_CHARS] if c.reason else "restarted"
                return Verdict("ContainerRestartLimit", f"pod {p.name} container {c.container} restarted "
                               f"{c.restarts} times (failurePolicy.maxContainerRestarts {policy.max_container_restarts}"
                               f"): {what}")
    timeout = policy.waiting_timeout_seconds
    if timeout and waiting_since is not None and (now - waiting_since).total_seconds() >= timeout:
        stuck = [i for i in issues(current, generation) if i.reason in IMAGE_OR_CONFIG]
        if stuck:
            return Verdict("WaitingTimeout", f"{stuck[0].describe()} for {timeout}s or more "
                           "(failurePolicy.waitingTimeoutSeconds)")
    timeout = policy.scheduling_timeout_seconds
    for p in current if timeout else ():
        since = _since(p.unschedulable_since) if p.unschedulable and p.phase == "Pending" else None
        if since is not None and (now - since).total_seconds() >= timeout:
            return Verdict("SchedulingTimeout", f"{Issue(p.name, '', UNSCHEDULABLE, p.unschedulable).describe()} "
                           f"for {timeout}s or more (failurePolicy.schedulingTimeoutSeconds)")
    return None


def on_verdict(action: str, restarts: int, max_restarts: int) -> Literal["restart", "fail"]:
    """`restarts` counts the gang restarts already done."""
    return "restart" if action == "RestartJob" and restarts < max_restarts else "fail"
