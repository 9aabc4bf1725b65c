"""The rollout sidecar's version source: a version missing from this pod's shm is pulled from other pods.

Role: the `VersionSource` (`tandem.sidecars.rollout_engine.version_source`) the sidecar gives its
`RolloutEngine`. In a pod whose trainer did not publish `v` (other hybrid replicas, rollout-only pods that
joined to scale generation) the shards are first pulled from pods that hold them (`transport.BroadcastNode`:
pipelined chain or tree, RDMA or TCP, deltas against a version held); the engine then loads `v` through the
same in-pod path. Each pod's node also serves what it holds, so the next receivers can pull from it.
Caller: `python -m tandem.sidecars.rollout` (the control API's /update and the supervisor's restarts reach it
through `RolloutEngine.update`).
"""

from __future__ import annotations

import logging

from tandem.checkpoint_engine.transport import BroadcastNode

log = logging.getLogger(__name__)


class TransportPuller:
    def __init__(self, node: BroadcastNode) -> None:
        self.node = node
        self.last_receive: dict[str, float] = {}

    def present(self, version: int | None) -> int | None:
        """Pull `version` (None: the newest registered) unless this pod holds it; the version now held."""
        report = self.node.receive(version) if version is not None else self.node.receive_latest()
        self.last_receive = {"receive_s": report.seconds, "bytes": float(report.bytes),
                             "already_here": float(report.already_here)}
        if not report.already_here:
            log.info("pulled version %d (%d bytes) in %.2fs", report.version, report.bytes, report.seconds)
        return report.version
