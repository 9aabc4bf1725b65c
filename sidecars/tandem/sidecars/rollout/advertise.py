"""Keeping a rollout advertised in etcd after its lease was lost.

Role: the rollout sidecar writes its endpoint (and its shared-memory versions, `BroadcastNode.announce_local`)
under its etcd lease, so that a dead pod's records vanish with it. A live pod can lose its lease too: etcd or
the machine too slow to answer its keepalives for the lease's TTL. Its records are then gone, and a trainer
waiting for its rollouts would never see it again. `keep_advertised` watches for the loss and writes the
records again under a new lease (`Registry.lease_id` grants one), retrying while etcd does not answer.
While the lease holds, the same thread calls `tick` every POLL_S (a rollout-only pod follows a restarted gang:
`tandem.sidecars.rollout.kept`). Caller: `tandem.sidecars.rollout.__main__`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry

log = logging.getLogger(__name__)
POLL_S = 5.0  # how often the thread looks at `stop` while the lease holds
RETRY_S = 1.0  # pause between attempts while etcd does not answer


def keep_advertised(registry: SyncRegistry, advertise: Callable[[], None], stop: threading.Event,
                    tick: Callable[[], None] | None = None) -> threading.Thread:
    """A daemon thread that calls `advertise` again each time the registry's lease is lost, and `tick` every
    POLL_S while it holds, until `stop`."""

    def run() -> None:
        while not stop.is_set():
            try:
                if not registry.wait_lease_lost(POLL_S):
                    if tick is not None and not stop.is_set():
                        tick()
                    continue
                log.warning("etcd lease lost: advertising this rollout again under a new lease")
                advertise()
            except errors.CheckpointEngineError as e:  # etcd still away: the lease stays lost, try again
                log.warning("advertising again failed: %s", e)
                stop.wait(RETRY_S)

    thread = threading.Thread(target=run, name="rollout-advertise", daemon=True)
    thread.start()
    return thread
