"""Rollout-only pool policy: a lost rollout-only pod is replaced alone, not by a gang restart (pure).

Callers: `tandem.operator.policies.plan.decide`, for jobs not queued by Kueue, after a sidecar's refusal (which
fails the job: a replacement would be refused too) and the hybrid pods' failures (which restart the
gang), before the stuck-gang verdicts. Pure functions of the observed pods, the record the last pass
left in status.rolloutPool and the clock value passed in.

Rules:
- A rollout-only pod (index >= spec.replicas) of the current gang generation is lost when it reached
  phase Failed (a crash, an OOM, an eviction: reason Evicted, a node shutdown), or, once it is known to
  have existed (`scale_policy.known`: the last pass saw the pool hold it, or this operator created it),
  when it is being deleted (a drain, the Eviction API, a reclaimed spot node, `kubectl delete`) or is
  gone. Like a Failed pod, whatever the job's phase: the status says Running only from the pass that saw
  every pod run, and a pod may run and be evicted before that pass, even before any pass saw it (the pod
  index lags the API; hence "created"). A Failed pod is deleted; once its name is free,
  plan.decide's "create what is missing" recreates it with the same name, index and generation. The
  hybrid pods (the trainers' collective) are untouched and status.restarts does not move; the driver
  adopts the new rollout before its next rollout phase and sends it the current version.
- Each lost pod is counted once (status.rolloutReplacements, an Event RolloutReplaced naming the pod
  and the cause), however many passes see it: the pass that counts it records its name, UID and
  generation in status.rolloutPool.replacing; a pod whose UID is recorded, or a free name that is
  recorded, is not counted again. A record goes once a pod of that name with another UID exists (the
  replacement), or when its generation is no longer the gang's.
- Crash loops: more than max(1, failurePolicy.maxRestarts) x rolloutOnlyReplicas replacements within
  one window (WINDOW_SECONDS, an hour from the window's first replacement) make a stuck pool: verdict
  RolloutReplacementLimit, which restarts the gang or fails the job as the other stuck verdicts do
  (`stuck_policy.on_verdict`); the record starts afresh after it.
- While the job is Running, the rollout-only pods are left out of the stuck-gang verdicts
  (`gang_view`): a spot pool without capacity (Unschedulable) or a rollout-only pod that cannot pull its
  image shortens the pool, it does not restart the trainers; the status still shows it.
- A gang restart (a hybrid pod failed) keeps the rollout-only pods that run (`kept`): they hold the newest
  version they pulled, which the restarted trainers resume from when checkpointEngine.persist is not set
  (`tandem.sidecars.rollout.kept`, `tandem.sidecars.trainer.loop.recovery.resume`). The restart relabels them into
  the new generation (plan.adopt) instead of deleting them; their sidecars follow the new gang through etcd.
Jobs queued by Kueue keep the gang behaviour: Kueue keeps its finalizer on a failed pod of a pod group
until it sees a replacement pod, which therefore needs a new name, and a pod group never shrinks (its
total count is fixed on every pod; Kueue stops a group by deleting all its pods). See `tandem.operator.manifests.kueue`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from tandem.operator.policies.observe import PodState
from tandem.spec.status import ReplacingPod, RolloutPoolStatus

WINDOW_SECONDS = 3600
REPLACED = "RolloutReplaced"  # Event reason, one per lost pod
SHORT = "RolloutPoolShort"  # status.reason while the job runs with fewer rollout-only pods than asked
LIMIT = "RolloutReplacementLimit"  # the stuck verdict of a crash-looping pool


@dataclass(frozen=True)
class Loss:
    pod: str
    uid: str
    cause: str  # "failed (OOMKilled)", "evicted", "is being deleted", "disappeared"

    def describe(self) -> str:
        return f"rollout-only pod {self.pod} {self.cause}"


@dataclass
class Replacement:
    delete: list[str] = field(default_factory=list)  # Failed pods to delete (their names, to be recreated)
    lost: list[Loss] = field(default_factory=list)  # counted in this pass
    record: RolloutPoolStatus | None = None  # status.rolloutPool after this pass
    verdict: str = ""  # the RolloutReplacementLimit message, "" while under the bound


def bound(max_restarts: int, pool_size: int) -> int:
    """Replacements allowed within one window."""
    return max(1, max_restarts) * pool_size


def _time(text: str) -> datetime | None:
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def _cause(pod: PodState, *, known: bool) -> str:
    """Why `pod` is lost, "" when it is not."""
    if pod.phase == "Failed":
        return "evicted" if pod.reason == "Evicted" else f"failed ({pod.reason or 'Failed'})"
    if pod.deleting and known:
        return "is being deleted"
    return ""


def replace(
    pods: Iterable[PodState], pool: Sequence[str], known: Sequence[str], generation: int, *,
    record: RolloutPoolStatus | None, limit: int, now: datetime,
) -> Replacement:
    """What to do about the rollout-only pods `pool` (expected names, in index order) of `generation`;
    `known` are those known to have existed: the last pass saw them, or this operator created them
    (only these can have gone)."""
    current = {p.name: p for p in pods if p.generation == generation}
    was = record or RolloutPoolStatus()
    open_ = [r for r in was.replacing if r.generation == generation
             and not (r.pod in current and current[r.pod].uid != r.uid)]  # replaced: a new pod of that name
    out = Replacement()
    for name in pool:
        pod = current.get(name)
        if pod is None:
            if name in known and not any(r.pod == name for r in open_):
                out.lost.append(Loss(name, "", "disappeared"))
            continue
        cause = _cause(pod, known=name in known)
        if not cause:
            continue
        if pod.phase == "Failed" and not pod.deleting:
            out.delete.append(name)
        if not any(r.pod == name and r.uid == pod.uid for r in open_):
            out.lost.append(Loss(name, pod.uid, cause))
    start, count = _time(was.window_start), was.window_replacements
    if start is not None and (now - start).total_seconds() >= WINDOW_SECONDS:
        start, count = None, 0  # the window is over
    if out.lost and start is None:
        start = now
    count += len(out.lost)
    if out.lost and count > limit:
        out.verdict = (f"{count} rollout-only pods lost within {WINDOW_SECONDS // 60} minutes, more than "
                       f"max(1, failurePolicy.maxRestarts) x rolloutOnlyReplicas = {limit}; the last: "
                       f"{out.lost[-1].describe()}")
        return out  # the gang goes: no record survives it
    open_ += [ReplacingPod(pod=loss.pod, uid=loss.uid, generation=generation) for loss in out.lost]
    window = start.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if start is not None else ""
    if open_ or window:
        out.record = RolloutPoolStatus(replacing=open_, window_start=window, window_replacements=count)
    return out


def gang_view(pods: Iterable[PodState], replicas: int, generation: int, *, job_running: bool) -> list[PodState]:
    """The pods whose troubles may fail the gang: all of them until the job runs, then all but the
    current rollout-only pods (their loss is a short pool, handled by `replace`)."""
    return [p for p in pods if not job_running or p.generation != generation or p.index < replicas]


def replacing(record: RolloutPoolStatus | None) -> list[str]:
    """Names of the pods being replaced (for the status message)."""
    return [r.pod for r in record.replacing] if record is not None else []


def kept(pods: Iterable[PodState], replicas: int, count: int, generation: int) -> list[str]:
    """Rollout-only pods of `generation` a gang restart keeps: running, not being deleted, still in the pool
    (index below `count`, the job's pod count)."""
    return sorted(p.name for p in pods if p.generation == generation and replicas <= p.index < count
                  and p.phase == "Running" and not p.deleting)
