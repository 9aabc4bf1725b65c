"""Scaling policy of the rollout-only pool (`spec.rolloutOnlyReplicas`, the /scale subresource) (pure).

Callers: `tandem.operator.policies.plan.decide`. `kubectl scale rlhfjob/NAME --replicas=N` (or an HPA)
writes spec.rolloutOnlyReplicas through the CRD's scale subresource; the status carries what the
operator last observed (status.rolloutOnlyReplicas) and the pool's label selector.

Rules:
- Scaling up creates the new rollout-only pods in the current gang generation, with no gang
  restart: a pod the last pass did not see, and that this operator has not created, cannot have
  "disappeared". They join the running driver, which adopts newly registered rollouts before each
  rollout phase and sends them the current weight version (by broadcast from a pod that has it).
- Scaling down deletes the highest-index rollout-only pods; a pod beyond the pool is neither a
  failure nor a preemption.
- While the job is Running, a pool that is still growing keeps it Running: every hybrid (trainer)
  pod running is what the job needs; the message counts the pool.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from tandem.operator.policies.observe import PodState


def known(expected: Sequence[str], replicas: int, observed_rollout_only: int,
          created: Collection[str] = ()) -> list[str]:
    """The expected pods known to have existed, in index order: those the last pass saw the pool hold,
    and those of `created` (pods this operator created, which may have run and gone before any pass
    saw them). Only these can have vanished."""
    seen = replicas + max(0, observed_rollout_only)
    return [name for i, name in enumerate(expected) if i < seen or name in created]


def excess(pods: Iterable[PodState], generation: int, count: int) -> list[str]:
    """Pods of `generation` beyond the job's `count` pods (scaled down), not yet being deleted."""
    return sorted(p.name for p in pods if p.generation == generation and p.index >= count and not p.deleting)


def trainers_running(pods: Iterable[PodState], generation: int, replicas: int) -> bool:
    """Every hybrid pod of `generation` is Running (and none is going)."""
    up = {p.index for p in pods
          if p.generation == generation and p.index < replicas and p.phase == "Running" and not p.deleting}
    return len(up) == replicas


def pool_running(pods: Iterable[PodState], generation: int, replicas: int) -> int:
    """Rollout-only pods of `generation` that are Running."""
    return len([p for p in pods if p.generation == generation and p.index >= replicas and p.phase == "Running"
                and not p.deleting])
