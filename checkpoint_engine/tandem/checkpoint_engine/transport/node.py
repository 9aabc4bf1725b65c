"""BroadcastNode: one pod's part in the cross-pod weight broadcast (holder server + receiver).

Callers: every pod's checkpoint engine. A trainer pod starts a node so that the versions its
publisher writes are served to others; a rollout(-only) pod starts a node, then calls
`receive(v)` (or `receive_latest()`) before `RolloutEngine.update(v)`, which then finds the
version in its own shm dir. `start()` publishes where the node listens under
keys.transport_endpoint (lease-bound: a dead pod disappears from every plan).
"""

from __future__ import annotations

from pathlib import Path

from tandem.checkpoint_engine.etcd import keys
from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.checkpoint_engine.transport.auth import shard_key
from tandem.checkpoint_engine.transport.holder_server import MAX_CONNECTIONS, HolderServer
from tandem.checkpoint_engine.transport.receiver import Receiver, ReceiveReport
from tandem.checkpoint_engine.transport.store import LocalStore
from tandem.checkpoint_engine.transport.transport_choice import make_transport
from tandem.checkpoint_engine.transport.transport_interface import Peer, Transport
from tandem.checkpoint_engine.versions import layout


class BroadcastNode:
    def __init__(
        self,
        registry: SyncRegistry,
        shm_root: Path,
        transport: str | Transport = "auto",
        bind: str = "0.0.0.0",
        advertise: str = "127.0.0.1",
        port: int = 0,
        stall_timeout: float = 5.0,
        deadline: float = 600.0,
        max_rate: float | None = None,
        *,
        token: str,
        max_connections: int = MAX_CONNECTIONS,
        fan: int | None = None,
    ) -> None:
        """`registry`: this pod's SyncRegistry (its pod name names the node); `advertise`: the address other
        pods reach this one on (the pod IP); `port`: where the holder server listens
        (checkpointEngine.shardPort in a pod; 0: a free one); `stall_timeout`: seconds without a byte before
        an upstream is given up; `max_rate`: optional per-stream cap in bytes/s; `token`: the job's token
        (TANDEM_TOKEN): the node serves only readers that prove it and proves it to the nodes it reads from
        (auth.py); `max_connections`: connections served at once; `fan`: 1 (chain) or 2 (binary tree) always,
        None: chosen per version by its size and the pods taking it (receiver.fanout)."""
        self.registry, self.shm_root = registry, Path(shm_root)
        self.pod, self.job = registry.pod, registry.job
        key = shard_key(token, self.job)
        self.store = LocalStore(self.shm_root, self.job)
        self.advertise = advertise
        self.transport: Transport = (
            make_transport(transport, host=advertise, metadata=registry.endpoint)
            if isinstance(transport, str)
            else transport
        )
        self.server = HolderServer(
            self.store,
            key,
            host=bind,
            port=port,
            wait_timeout=max(30.0, stall_timeout),
            max_rate=max_rate,
            transport=self.transport,
            max_connections=max_connections,
        )
        self.receiver = Receiver(registry, self.store, self.transport, stall_timeout=stall_timeout, deadline=deadline,
                                 key=key, fan=fan)

    @property
    def peer(self) -> Peer:
        names = ("tcp",) if self.transport.name == "tcp" else (self.transport.name, "tcp")
        return Peer(self.pod, self.advertise, int(self.server.port), names, self.transport.advertise())

    def start(self) -> BroadcastNode:
        self.server.start()
        self.registry.put_json(
            keys.transport_endpoint(self.registry.namespace, self.registry.scope, self.pod),
            self.peer.record(),
            lease=True,
        )
        return self

    def receive(self, version: int) -> ReceiveReport:
        """Pull `version` into this pod's shm dir (no-op if it is there) and announce it as held."""
        return self.receiver.receive(version)

    def receive_latest(self) -> ReceiveReport:
        return self.receiver.receive(None)

    def announce_local(self) -> list[int]:
        """Announce every complete version already in this pod's shm dir that etcd still lists
        (after a restart of the node, so it serves them again)."""
        registered = set(self.registry.versions())
        out = []
        for v in layout.list_versions(self.shm_root, self.job):
            if v in registered:
                self.registry.add_holder(v, str(layout.version_dir(self.shm_root, self.job, v)))
                out.append(v)
        return out

    def prune(self, keep: int = 1) -> list[int]:
        """Delete local versions that etcd no longer registers (the publisher's GC unregistered
        them: nobody pins them), keeping at least the newest `keep` local ones; returns them.
        Their shard files become spares that the next receive writes into (no fresh pages)."""
        registered = set(self.registry.versions())
        local = layout.list_versions(self.shm_root, self.job)
        newest = set(local[-keep:]) if keep > 0 else set()
        removed = []
        for v in local:
            if v not in registered and v not in newest:
                self.store.drop(v)
                self.store.recycle(v)  # its pages are reused by the next version received
                removed.append(v)
        layout.clean_stale_temps(self.shm_root, self.job)
        return removed

    def release(self, version: int) -> bool:
        """Stop serving `version` (withdraw as its holder) and keep its pages as spares for the
        next version received. For versions no local reader maps any more."""
        self.registry.delete(keys.holder(self.registry.namespace, self.registry.scope, version, self.pod))
        self.store.drop(version)
        return self.store.recycle(version)

    def close(self) -> None:
        self.server.close()
        self.transport.close()
