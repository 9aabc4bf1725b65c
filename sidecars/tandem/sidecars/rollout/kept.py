"""A rollout-only pod kept through a gang restart: it follows the new gang and keeps what was learnt.

Role: when a hybrid pod fails, the operator restarts the gang (its trainer ranks are one collective) but keeps
the rollout-only pods that still run (`tandem.operator.policies.pool_policy.kept`). Those pods hold, in their shared
memory, the newest version they pulled: without `checkpointEngine.persist`, the only copy of what was learnt.
Two things keep it usable, done every few seconds by the rollout's advertise thread (`GangFollower.tick`):

- the version records in etcd were bound to the dead trainer's lease and vanish with it (`latest` too): the
  kept pod registers its newest complete version again under its own lease, as its holder, so the restarted
  driver finds it (`tandem.sidecars.trainer.loop.recovery.resume`, "peers") and its pod's rollout pulls it over the
  transport like any other version (checksums checked on the way);
- the pod's environment still names the old gang generation, which the new driver does not count: the kept
  pod reads the generation the new driver writes (`keys.gang`) and advertises itself under it.

Only a pod whose lease is alive can do either, so a dead pod's records never join the new gang.
Caller: `python -m tandem.sidecars.rollout` in rollout-only pods (through `advertise.keep_advertised`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.etcd import keys
from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.checkpoint_engine.transport import BroadcastNode
from tandem.checkpoint_engine.versions import layout

log = logging.getLogger(__name__)


class GangFollower:
    """`record` is the rollout's endpoint record (shared with its other writers: the same dict object)."""

    def __init__(self, registry: SyncRegistry, node: BroadcastNode, shm_dir: Path, job: str,
                 record: dict[str, Any], endpoint: str) -> None:
        self.registry, self.node, self.shm_dir, self.job = registry, node, Path(shm_dir), job
        self.record, self.endpoint = record, endpoint
        self.seen_latest = False  # a trainer published while this pod ran: only then can its records have gone

    def tick(self) -> None:
        try:
            self.follow_generation()
            self.keep_newest_registered()
        except (errors.CheckpointEngineError, OSError, ValueError) as e:  # etcd away or a torn dir: next tick
            log.warning("following the gang: %s", e)

    def follow_generation(self) -> int | None:
        """Advertise under the generation a newer driver wrote; the generation adopted, or None."""
        raw = self.registry.get_json(keys.gang(self.registry.namespace, self.registry.scope))
        generation = int(raw.get("generation", 0)) if raw else 0
        if generation <= int(self.record.get("generation", 0)):
            return None
        log.warning("gang generation %d started (this pod was kept from generation %s): serving it", generation,
                    self.record.get("generation", 0))
        self.record["generation"] = generation
        self.registry.put_json(self.endpoint, self.record, lease=True)
        return generation

    def keep_newest_registered(self) -> int | None:
        """With no version registered any more (one was, while this pod ran: a new pod of a resumed run holding
        old versions registers nothing) and one held here, register the newest held again under this pod's
        lease; the version registered, or None (nothing to do, or another kept pod was first)."""
        if self.registry.latest() is not None:
            self.seen_latest = True
            return None
        if not self.seen_latest:
            return None
        held = layout.list_versions(self.shm_dir, self.job)
        if not held:
            return None
        path = layout.version_dir(self.shm_dir, self.job, held[-1])
        index = layout.read_index(path)
        try:
            version = self.registry.register(index, str(path))
        except errors.VersionExists:  # another kept pod registered it (or a newer one) first: hold it too
            self.node.announce_local()
            return None
        log.warning("no version is registered any more (the trainer that published them is gone): registered "
                    "version %d, held here, for the restarted gang to resume from", version)
        self.node.announce_local()
        return version
