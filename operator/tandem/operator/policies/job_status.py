"""RLHFJob status: phase, Kubernetes-style conditions, progress fields, and transition events.

Callers: `tandem.operator.policies.plan.decide` builds the next status with these helpers; the handlers
post the returned events. Pure: the clock value is passed in.

Conditions (type: meaning when True), each with a stable CamelCase reason, a message, the
metadata.generation it was set from (observedGeneration) and lastTransitionTime that only moves
when the condition's status flips (Kubernetes API conventions):
  SpecValid   the spec passed every rule the operator checks
  Queued      pods of the current generation wait for Kueue to admit them (`tandem.operator.manifests.kueue`)
  Ready       every pod of the current generation is Running
  Restarting  a gang restart is under way (lastTransitionTime = when it began; backoff counts from it)
  Suspended   spec.suspend is true (reason SpecSuspended) or Kueue preempted the pods (Preempted)
  Complete    the job finished (the driver reported done, or every trainer pod succeeded)
  Failed      the job gave up (maxRestarts exhausted, or the driver reported failure)
  ContainersWaiting  a container of the gang waits in ImagePullBackOff, CrashLoopBackOff, ... (reason:
              the kubelet's; lastTransitionTime: when it began, which failurePolicy.waitingTimeoutSeconds counts from)
  DurableCheckpoints  a gang restart resumes from a durable copy (checkpointEngine.persist; False, reason
              NoDurableCheckpoints: it starts over from the initial model)
  RolloutsAvailable  set once the driver first waits for a healthy rollout (every engine dead, hung or
              restarting): False (reason NoHealthyRollout, the driver's message naming each rollout) while it
              waits, True (RolloutsHealthy) once one is back; an Event NoHealthyRollout when it turns False
  MismatchGuard  set once algorithm.mismatchGuard first fires: True while the driver's record carries its
              warning (reason MismatchHigh) or its pause (MismatchPaused; the driver holds the pods, phase
              Running: spec.suspend frees them), False (MismatchWithinThreshold) once it is quiet; an Event
              with the guard's line whenever it turns True or its reason changes
Reasons (every condition carries the reason of the current phase; `REASONS` has the defaults):
PodsPending, AwaitingAdmission, PodsRunning, GangRestart, SpecSuspended, Preempted, DriverDone,
TrainersSucceeded, DriverFailed, MaxRestartsReached, InvalidSpec, PodCreateRefused (the API server
refused a pod), a waiting container's reason, Unschedulable, and the `tandem.operator.policies.stuck_policy`
verdicts, RolloutPoolShort (Running while lost rollout-only pods are replaced, or the pool grows) and
RolloutReplacementLimit (`tandem.operator.policies.pool_policy`). status.reason holds the current phase's (the
REASON column). Events: one per phase change (reason: the new phase), Preempted when Kueue stops the
pods, PodCreateRefused, one per container that starts waiting (reason: the kubelet's), RolloutReplaced
per lost rollout-only pod, and NoDurableCheckpoints when a job without checkpointEngine.persist is created.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from tandem.spec.progress import Progress
from tandem.spec.status import Condition, EvalStatus, JobStatus

Phase = Literal["Pending", "Queued", "Running", "Restarting", "Succeeded", "Failed", "Suspended", "InvalidSpec"]
CONDITION_TYPES = ("SpecValid", "Queued", "Ready", "Restarting", "Suspended", "Complete", "Failed",
                   "ContainersWaiting", "DurableCheckpoints", "RolloutsAvailable", "MismatchGuard")
CONTAINERS_WAITING = "ContainersWaiting"
DURABLE_CHECKPOINTS = "DurableCheckpoints"
NO_DURABLE_CHECKPOINTS = "NoDurableCheckpoints"
POD_CREATE_REFUSED = "PodCreateRefused"
ROLLOUTS_AVAILABLE = "RolloutsAvailable"
NO_HEALTHY_ROLLOUT = "NoHealthyRollout"
MISMATCH_GUARD = "MismatchGuard"
REASONS: dict[str, str] = {
    "Pending": "PodsPending", "Queued": "AwaitingAdmission", "Running": "PodsRunning",
    "Restarting": "GangRestart", "Suspended": "SpecSuspended", "Succeeded": "DriverDone",
    "Failed": "MaxRestartsReached", "InvalidSpec": "InvalidSpec",
}
PREEMPTED = "Preempted"
TERMINAL: frozenset[str] = frozenset({"Succeeded", "Failed"})
WARNING_PHASES: frozenset[str] = frozenset({"Restarting", "Failed", "InvalidSpec"})


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def rfc3339(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def read_status(raw: Any) -> JobStatus:
    """The status stanza as a model; anything unreadable yields a fresh Pending status."""
    if not isinstance(raw, dict):
        return JobStatus()
    try:
        return JobStatus.model_validate(raw)
    except ValueError:
        keep = {k: raw[k] for k in ("restarts", "phase") if k in raw}
        try:
            return JobStatus.model_validate(keep)
        except ValueError:
            return JobStatus()


def dump_status(status: JobStatus) -> dict[str, Any]:
    return status.model_dump(mode="json", by_alias=True)


def condition(status: JobStatus, type_: str) -> Condition | None:
    return next((c for c in status.conditions if c.type == type_), None)


def set_condition(
    status: JobStatus, type_: str, value: bool, reason: str, message: str, now: datetime
) -> None:
    """Upsert a condition; lastTransitionTime moves only when its status changes."""
    new: Literal["True", "False"] = "True" if value else "False"
    old = condition(status, type_)
    if old is None:
        status.conditions.append(
            Condition(
                type=type_, status=new, reason=reason, message=message, last_transition_time=rfc3339(now)
            )
        )
    else:
        if old.status != new:
            old.last_transition_time = rfc3339(now)
        old.status, old.reason, old.message = new, reason, message
    order = {t: i for i, t in enumerate(CONDITION_TYPES)}
    status.conditions.sort(key=lambda c: order.get(c.type, len(order)))


def set_phase(status: JobStatus, phase: Phase, message: str, now: datetime, reason: str = "") -> None:
    """Set the phase and derive every condition from it (reason: the phase's default when empty)."""
    status.phase = phase
    status.message = message
    reason = reason or REASONS[phase]
    status.reason = reason
    invalid = phase == "InvalidSpec"
    set_condition(
        status,
        "SpecValid",
        not invalid,
        "InvalidSpec" if invalid else "Valid",
        message if invalid else "",
        now,
    )
    set_condition(status, "Ready", phase == "Running", reason, message, now)
    for type_, when in (
        ("Queued", "Queued"),
        ("Restarting", "Restarting"),
        ("Suspended", "Suspended"),
        ("Complete", "Succeeded"),
        ("Failed", "Failed"),
    ):
        set_condition(status, type_, phase == when, reason, message if phase == when else "", now)


def reason_of(status: JobStatus, type_: str) -> str:
    """The reason of a True condition, "" when it is absent or not True."""
    cond = condition(status, type_)
    return cond.reason if cond is not None and cond.status == "True" else ""


def stamp(status: JobStatus, generation: int) -> None:
    """Every condition was evaluated against metadata.generation `generation` in this pass."""
    status.observed_generation = generation
    for cond in status.conditions:
        cond.observed_generation = generation


def gang_generation(status: JobStatus) -> int:
    """The restart generation of the current gang: every gang restart, Kueue preemption and
    suspension (spec.suspend) starts a new one, whose pods resume from the newest durable copy."""
    return status.restarts + status.preemptions + status.suspensions


def waiting_since(status: JobStatus) -> datetime | None:
    """When condition ContainersWaiting turned True (None while it is not)."""
    cond = condition(status, CONTAINERS_WAITING)
    return parse_time(cond.last_transition_time) if cond is not None and cond.status == "True" else None


def restart_began(status: JobStatus) -> datetime | None:
    cond = condition(status, "Restarting")
    if cond is None or cond.status != "True":
        return None
    return parse_time(cond.last_transition_time)


def apply_progress(status: JobStatus, progress: Progress | None) -> None:
    """Copy the driver's metrics into the status (only when a record exists)."""
    if progress is None:
        return
    status.iteration = progress.iteration
    status.weight_version = progress.weight_version
    status.last_sync_seconds = progress.last_sync_seconds
    status.reward_mean = progress.reward_mean
    status.mismatch_kl, status.ess, status.staleness_mean = progress.mismatch_kl, progress.ess, progress.staleness_mean
    status.rows_refused = progress.rows_refused
    if progress.rollout_engines is not None:  # a driver that has not seen one keeps what an earlier one reported
        status.rollout_engines = progress.rollout_engines.model_copy()
    if progress.eval is not None:
        e = progress.eval
        status.eval = EvalStatus(iteration=e.iteration, pass_at_1=e.pass_at_1, pass_at_k=e.pass_at_k, k=e.k)


def rollouts_available(status: JobStatus, progress: Progress | None, now: datetime) -> Event | None:
    """Condition RolloutsAvailable from the driver's progress record (see the module docstring); the
    Event to post when it turns False."""
    old = condition(status, ROLLOUTS_AVAILABLE)
    if progress is not None and progress.waiting_for_rollouts:
        set_condition(status, ROLLOUTS_AVAILABLE, False, NO_HEALTHY_ROLLOUT, progress.message, now)
        return Event("Warning", NO_HEALTHY_ROLLOUT, progress.message) if old is None or old.status == "True" else None
    if old is not None and old.status == "False":
        set_condition(status, ROLLOUTS_AVAILABLE, True, "RolloutsHealthy", "", now)
    return None


def mismatch_guard(status: JobStatus, progress: Progress | None, now: datetime) -> Event | None:
    """Condition MismatchGuard from the driver's progress record (see the module docstring); the Event to
    post when it turns True or moves from a warning to a pause."""
    old = condition(status, MISMATCH_GUARD)
    paused = progress is not None and progress.phase == "paused"
    message = "" if progress is None else progress.message if paused else progress.guard
    if message:
        reason = "MismatchPaused" if paused else "MismatchHigh"
        fresh = old is None or old.status != "True" or old.reason != reason
        set_condition(status, MISMATCH_GUARD, True, reason, message, now)
        return Event("Warning", reason, message) if fresh else None
    if old is not None and old.status == "True":
        set_condition(status, MISMATCH_GUARD, False, "MismatchWithinThreshold", "", now)
    return None


def transition_event(before: str, after: JobStatus) -> Event | None:
    """The Event announcing a phase change (None when the phase stayed)."""
    if before == after.phase:
        return None
    kind: Literal["Normal", "Warning"] = "Warning" if after.phase in WARNING_PHASES else "Normal"
    text = f"{before} -> {after.phase}" + (f": {after.message}" if after.message else "")
    return Event(kind, after.phase, text)
