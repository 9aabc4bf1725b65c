"""Queueing policy of a job queued by Kueue: waiting for admission, and preemption (pure).

Callers: `tandem.operator.policies.plan.decide`, for jobs labelled `kueue.x-k8s.io/queue-name` only (see
`tandem.operator.manifests.kueue` for the contract). Pure functions of the observed pods.

Rules:
- A pod of the current gang generation still gated by Kueue waits for admission: the job is Queued
  (or stays Suspended after a preemption) until every pod runs.
- Kueue stops an admitted pod group by marking its pods (condition TerminationTarget) and deleting
  them. A current pod so marked, or, once every pod had been running, a current pod being deleted
  or gone, is a preemption: the job is Suspended (not Failed, not a restart counted against
  failurePolicy.maxRestarts); the operator deletes what is left and creates the replacement pods
  of the next gang generation, which Kueue holds gated until it admits the group again; then the
  driver resumes from the newest durable copy (TANDEM_RESUME, as after a gang restart).
- A pod that fails (phase Failed) is not a preemption: the restart policy handles it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tandem.operator.policies.observe import PodState


def gated(pods: Iterable[PodState], generation: int) -> list[str]:
    """Pods of `generation` that Kueue still holds at its admission gate."""
    return sorted(p.name for p in pods if p.generation == generation and p.gated and not p.deleting)


def preemption(
    pods: Iterable[PodState], expected: Sequence[str], generation: int, *, all_were_running: bool
) -> str | None:
    """Why Kueue stopped the gang of `generation` ("pod X ..."), or None when it did not."""
    current = {p.name: p for p in pods if p.generation == generation}
    for name in expected:
        pod = current.get(name)
        if pod is not None and pod.stopped:
            return f"pod {name} {pod.stopped}"
    if not all_were_running:
        return None
    for name in expected:
        pod = current.get(name)
        if pod is None:
            return f"pod {name} deleted"
        if pod.deleting and pod.phase != "Failed":
            return f"pod {name} is being deleted"
    return None
