"""Leader election's decision: given the Lease as last read, should this replica create, renew or take
it, or wait? Pure; the clock values are passed in.

Callers: `tandem.operator.runtime.leader.LeaderElector` (the I/O around it). The rules are client-go's
leader election (k8s.io/client-go/tools/leaderelection), which every Kubernetes controller uses:
- a replica never trusts the holder's `renewTime` (its clock may differ from ours): a holder is
  live while the Lease *as this replica observed it* has changed within `leaseDurationSeconds` of
  this replica's own monotonic clock;
- a held Lease is taken only after that, and every write carries the resourceVersion read, so
  of two standbys racing for an expired Lease exactly one succeeds (the other gets 409);
- a Lease released on a clean shutdown (empty holderIdentity) is taken at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any


class Action(Enum):
    CREATE = "create"  # no Lease yet
    RENEW = "renew"  # we hold it
    TAKE = "take"  # released, or its holder stopped renewing: ours after a conditional write
    WAIT = "wait"  # another replica holds it


@dataclass(frozen=True)
class Record:
    """The fields of a coordination.k8s.io/v1 Lease that election reads."""

    holder: str = ""
    duration_s: int = 0
    renew_time: str = ""
    transitions: int = 0
    resource_version: str = ""

    @classmethod
    def of(cls, lease: dict[str, Any] | None) -> Record | None:
        if lease is None:
            return None
        spec = lease.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            duration_s=int(spec.get("leaseDurationSeconds") or 0),
            renew_time=str(spec.get("renewTime") or ""),
            transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=str((lease.get("metadata") or {}).get("resourceVersion") or ""),
        )

    def same_as(self, other: Record | None) -> bool:
        """The holder wrote nothing between the two reads (resourceVersion moves on every write)."""
        return other is not None and (self.holder, self.renew_time, self.resource_version) == (
            other.holder, other.renew_time, other.resource_version)


@dataclass
class Observed:
    """This replica's memory of the Lease: the record last read and when (its own monotonic clock) it
    last saw the record change."""

    record: Record | None = None
    changed_at: float = 0.0

    def see(self, record: Record | None, now: float) -> None:
        if record is None or not record.same_as(self.record):
            self.changed_at = now
        self.record = record


def decide(observed: Observed, identity: str, now: float) -> Action:
    record = observed.record
    if record is None:
        return Action.CREATE
    if record.holder == identity:
        return Action.RENEW
    if not record.holder:
        return Action.TAKE
    if now - observed.changed_at >= max(record.duration_s, 1):
        return Action.TAKE
    return Action.WAIT


def micro_time(t: datetime) -> str:
    """A MicroTime as the API server stores it."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_spec(action: Action, record: Record | None, identity: str, duration_s: int, now: datetime) -> dict[str, Any]:
    """The spec to write for `action` (never WAIT)."""
    stamp = micro_time(now)
    if action is Action.RENEW and record is not None:
        return {"holderIdentity": identity, "leaseDurationSeconds": duration_s, "renewTime": stamp,
                "leaseTransitions": record.transitions}
    transitions = record.transitions + 1 if record is not None and action is Action.TAKE else 0
    return {"holderIdentity": identity, "leaseDurationSeconds": duration_s, "acquireTime": stamp,
            "renewTime": stamp, "leaseTransitions": transitions}


def released(record: Record, now: datetime) -> dict[str, Any]:
    """What a leader writes when it stops cleanly: no holder, so a standby takes over at once."""
    return {"holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": micro_time(now),
            "leaseTransitions": record.transitions}
