"""Gang-restart policy: which pod failures count, whether to restart or give up, and the backoff.

Callers: `tandem.operator.policies.plan.decide` (pure reconcile decision), with the hybrid pods' names (every
pod's for a job queued by Kueue): a lost rollout-only pod is replaced alone (`tandem.operator.policies.pool_policy`).
Pure functions of the observed pods, the failure policy and the clock value passed in.

Rules:
- A pod of the current restart generation that reached phase Failed is a failure.
- A pod that vanished while the job was Running (every pod had been Running) is a failure; while
  Pending it is simply recreated.
- On a failure the whole gang restarts (all pods deleted; restarts + 1, so the next restart
  generation, `job_status.gang_generation`) while restarts < failurePolicy.maxRestarts; then the job is Failed.
- New pods of the next generation are created once every pod of older generations is gone (or has
  ended while a finalizer keeps it) and
  backoffSeconds have passed since the restart began. The driver resumes from the last published
  weight version (it reads `latest` in etcd), so a restart loses at most one iteration.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from tandem.operator.policies.observe import PodState


@dataclass(frozen=True)
class Failure:
    pod: str
    reason: str

    def describe(self) -> str:
        return f"pod {self.pod} {self.reason}"


def failures(
    pods: Iterable[PodState], expected: Sequence[str], generation: int, *, all_were_running: bool
) -> list[Failure]:
    """Failures among the pods of `generation` (expected names in index order)."""
    current = {p.name: p for p in pods if p.generation == generation}
    out: list[Failure] = []
    for name in expected:
        pod = current.get(name)
        if pod is None:
            if all_were_running:
                out.append(Failure(name, "disappeared"))
        elif pod.phase == "Failed":
            out.append(Failure(name, f"failed ({pod.reason or 'Failed'})"))
        elif pod.deleting and all_were_running:
            out.append(Failure(name, "is being deleted"))
    return out


def on_failure(restarts: int, max_restarts: int) -> Literal["restart", "fail"]:
    """`restarts` counts the gang restarts already done."""
    return "restart" if restarts < max_restarts else "fail"


def backoff_remaining(restart_began: datetime | None, backoff_seconds: int, now: datetime) -> float:
    """Seconds still to wait before the new generation may start (0 when it may start now)."""
    if restart_began is None:
        return 0.0
    left = (restart_began + timedelta(seconds=backoff_seconds) - now).total_seconds()
    return max(0.0, left)


def old_generation_left(pods: Iterable[PodState], generation: int) -> list[str]:
    """Pods of other generations that may still run (deleting or not): the new gang must wait. A pod
    being deleted whose containers have ended (phase Succeeded or Failed) no longer counts, though a
    finalizer may keep it (Kueue keeps one on a group's pods until it sees their replacements)."""
    return sorted(p.name for p in pods
                  if p.generation != generation and not (p.deleting and p.phase in ("Succeeded", "Failed")))
