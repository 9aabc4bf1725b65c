"""The rollout engine of a pod: versions missing from this pod's shm are pulled from other pods first.

Role: `RolloutEngine.update(v)` loads a version from the pod's own shared memory. In a pod whose
trainer did not publish `v` (other hybrid replicas, rollout-only pods that joined to scale
generation) the shards are first pulled from pods that hold them (`transport.BroadcastNode`:
pipelined chain, RDMA or TCP), then loaded through the same in-pod path. Each pod's node also
serves what it holds, so the next receivers can pull from it. Caller: `python -m
tandem.sidecars.rollout` (the control API's /update goes through here).
"""

from __future__ import annotations

import logging

from tandem.checkpoint_engine.engine_status import Phase, UpdateReport
from tandem.checkpoint_engine.sync_registry import SyncRegistry
from tandem.checkpoint_engine.transport import BroadcastNode
from tandem.sidecars.rollout_engine.engine import EngineConfig, RolloutEngine

log = logging.getLogger(__name__)


class PodRolloutEngine(RolloutEngine):
    def __init__(self, config: EngineConfig, registry: SyncRegistry, node: BroadcastNode) -> None:
        super().__init__(config, registry)
        self.node = node
        self.last_receive: dict[str, float] = {}

    def update(self, version: int | None = None) -> UpdateReport:
        self._need(Phase.READY)  # a failed or restarting engine pulls nothing (the supervisor loads the latest)
        report = self.node.receive(version) if version is not None else self.node.receive_latest()
        self.last_receive = {"receive_s": report.seconds, "bytes": float(report.bytes),
                             "already_here": float(report.already_here)}
        if not report.already_here:
            log.info("pulled version %d (%d bytes) in %.2fs", report.version, report.bytes, report.seconds)
        return super().update(report.version)
