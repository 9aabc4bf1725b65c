"""Where the rollout engine's versions come from: a version made present in this pod's shared memory, or an error.

Role: `RolloutEngine.update(v)` loads a version from the pod's own shared memory (weights.py). A pod whose
trainer did not publish `v` (other hybrid replicas, rollout-only pods) must first get its shards from pods that
hold them; that is a `VersionSource` the engine is given (`RolloutEngine(..., source=...)`): the rollout
sidecar's, backed by the checkpoint engine's transports (`tandem.sidecars.rollout.puller`). The default,
`SHM_ONLY`, fetches nothing: the version is in shm or the load fails. Caller: `engine.RolloutEngine.update`,
outside the engine's lock (generation goes on while shards arrive), once the engine is READY.
"""

from __future__ import annotations

from typing import Protocol


class VersionSource(Protocol):
    def present(self, version: int | None) -> int | None:
        """Make `version` (None: the newest registered) present in this pod's shm, or raise; returns the
        version to load (None: the newest registered, resolved by the engine)."""
        ...


class ShmOnly:
    """Versions are loaded from this pod's shm as they are: nothing is fetched."""

    def present(self, version: int | None) -> int | None:
        return version


SHM_ONLY = ShmOnly()
