"""etcd registry of weight versions, reader pins, engine statuses and operations (aetcd, asyncio).

Callers: publisher.py (register, gc), the rollout engine (latest, pin/unpin, status), api.py (ops),
transports of other pods (shard records), through `SyncRegistry` when the caller is not async.
Every listed etcd endpoint is used: requests go through `failover.EtcdCluster`, which moves to
another member when one dies (the lease lives in the cluster's raft state and survives that).

Protocol (keys.py holds the paths):
- register(v): ONE transaction puts every shard record, the version record and `latest`, all on
  the writer's lease, guarded by "version v does not exist" and "latest < v". The lease is
  refreshed by a keepalive task: the files live in the writer pod's shared memory, so when the
  writer dies its versions disappear from etcd with it. A reader never sees a partial version.
- pin(v): a transaction puts `readers/<v>/<me>` on the reader's lease only if version v exists.
- gc(keep): deletes a version's records in a transaction guarded by "no reader key in
  readers/<v>/" (a range compare), so a pin and a deletion cannot interleave.
- A transaction retried on another member after its first attempt failed may find its own
  earlier attempt committed: register and gc then read the outcome back (the version record on
  this writer's lease / the version gone) instead of reporting a conflict.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import aetcd
import aetcd.exceptions
from aetcd.utils import prefix_range_end

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.etcd import keys
from tandem.checkpoint_engine.etcd.endpoints import split_endpoints
from tandem.checkpoint_engine.etcd.failover import EtcdCluster
from tandem.checkpoint_engine.etcd.security import EtcdSecurity
from tandem.checkpoint_engine.versions.layout import VersionIndex

T = TypeVar("T")
log = logging.getLogger(__name__)


def _b(s: str) -> bytes:
    return s.encode()


class Registry:
    """One job's view of etcd for one identity (pod + role), with its own lease."""

    def __init__(
        self,
        endpoints: str | Sequence[str],
        namespace: str,
        job: str,
        pod: str,
        role: str,
        ttl: int = 10,
        timeout: float = 5.0,
        failover_s: float | None = None,
        *,
        uid: str = "local",
        security: EtcdSecurity | None = None,
    ) -> None:
        """`endpoints`: the cluster's members, a list or comma-separated (as TANDEM_ETCD_ENDPOINTS
        carries them); `timeout`: seconds per request on one member; `failover_s`: how long a
        request keeps trying members (default 2 x timeout); `uid`: the job's metadata.uid (its
        records live under `keys.scope(job, uid)`, so a later job of the same name never reads
        them); `security`: TLS and etcd user (`security`)."""
        self.endpoints = split_endpoints(endpoints) if isinstance(endpoints, str) else list(endpoints)
        self.etcd = EtcdCluster(self.endpoints, timeout=timeout, failover_s=failover_s, security=security)
        self.namespace, self.job, self.pod, self.role = namespace, job, pod, role
        self.uid, self.scope = uid, keys.scope(job, uid)
        self.ttl = ttl
        self._lease: Any = None
        self._keepalive: asyncio.Task[None] | None = None
        self.lease_lost = asyncio.Event()

    @property
    def endpoint(self) -> str:
        """The member answering now (for single-endpoint consumers: Mooncake's metadata server)."""
        return self.etcd.current

    @property
    def me(self) -> str:
        return f"{self.pod}.{self.role}"

    # ---- connection and lease -------------------------------------------------------------
    async def connect(self, wait_s: float = 60.0) -> None:
        """Wait until some member answers a read: a sidecar starting beside a just-started (or busy)
        etcd sees transient dial failures ("tcp handshaker shutdown") that a retry clears."""
        key = _b(keys.job_prefix(*self._k()))
        await self.etcd.call("first read", lambda c: c.get(key), budget=wait_s)

    async def lease_id(self) -> int:
        """The identity's lease (granted on first use; re-granted after it expired). A grant retried
        on another member may leave an unused lease behind: it has no keys and expires after `ttl`."""
        if self._lease is None:
            self._lease = await self.etcd.call("lease grant", lambda c: c.lease(self.ttl))
            self.lease_lost.clear()
            if self._keepalive is None or self._keepalive.done():
                self._keepalive = asyncio.create_task(self._keep_alive())
        return int(self._lease.id)

    async def _keep_alive(self) -> None:
        """Refresh the lease every ttl/3 on whichever member answers (each refresh is its own
        short keepalive stream, so a dead member's stream is simply not used again). The lease is lost
        when etcd answers that it expired (TTL <= 0); while etcd does not answer it is kept, since etcd
        may still hold it (abandoning it would expire its keys for nothing); a write that meets a lease
        etcd no longer knows replaces it (`register`)."""
        while self._lease is not None:
            await asyncio.sleep(max(self.ttl / 3, 0.2))
            lease = self._lease
            if lease is None:
                return
            try:
                reply = await self.etcd.call("lease keepalive", lambda c: c.refresh_lease(lease.id))  # noqa: B023
                if reply is not None and reply.TTL <= 0:
                    log.warning("etcd lease %x expired; keys bound to it are gone", lease.id)
                    self._lost(lease)
                    return
            except errors.RegistryUnavailable as e:  # etcd down: keep trying until TTL passes
                log.warning("lease keepalive failed: %s", e)

    def _lost(self, lease: Any) -> None:
        """The lease is gone (expired in etcd): the next use grants another."""
        if self._lease is lease:
            self._lease = None
        self.lease_lost.set()

    async def close(self, revoke: bool = True) -> None:
        lease, self._lease = self._lease, None
        if self._keepalive is not None:
            self._keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._keepalive
        if lease is not None and revoke:
            with contextlib.suppress(Exception):
                await self.etcd.call("lease revoke", lambda c: c.revoke_lease(lease.id))
        await self.etcd.close()

    # ---- versions ----------------------------------------------------------------------------
    def _k(self) -> tuple[str, str]:
        """(namespace, scope): the arguments of every `keys` function for this job."""
        return self.namespace, self.scope

    async def _leased(self, what: str, write: Callable[[int], Awaitable[T]]) -> T:
        """`write(lease)` under this identity's lease. A lease etcd no longer knows (it expired while the
        machine or etcd was slow: "requested lease not found") is replaced and the write tried once more,
        on every lease-bound path (versions, pins, holders, statuses, operations, endpoints): a slow
        machine costs a new lease, never the job. Every key of the dead lease is gone, so nothing is
        overwritten; the rollout re-advertises what it lost (`rollout.advertise`)."""
        lease = await self.lease_id()
        try:
            return await write(lease)
        except errors.RegistryUnavailable as e:
            if "lease not found" not in str(e).lower() or self._lease is None:
                raise
            log.warning("etcd lease %x is gone (%s): %s under a new lease", self._lease.id, e, what)
            self._lost(self._lease)
            return await write(await self.lease_id())

    async def register(self, index: VersionIndex, directory: str) -> int:
        """Register version `index.version` (shards + version record + latest) in one transaction, under
        a new lease if etcd forgot this one (`_leased`)."""
        return await self._leased(f"registering version {index.version}",
                                  lambda lease: self._register(index, directory, lease))

    async def _register(self, index: VersionIndex, directory: str, lease: int) -> int:
        ns, job = self._k()
        v = index.version
        tx = self.etcd.transactions
        ops = [
            tx.put(
                _b(keys.shard(ns, job, v, s.index)),
                _b(
                    json.dumps(
                        {
                            "holder": self.pod,
                            "file": s.file,
                            "bytes": s.nbytes,
                            "digest": s.digest,
                            "dir": directory,
                        }
                    )
                ),
                lease,
            )
            for s in index.shards
        ]
        record = {
            "version": v,
            "holder": self.pod,
            "dir": directory,
            "shards": len(index.shards),
            "tensors": len(index.tensors),
            "bytes": index.total_bytes,
            "algorithm": index.algorithm,
            "created": index.created,
            "adapter": index.adapter is not None,  # LoRA adapters only (adapters.py)
        }
        ops.append(tx.put(_b(keys.version(ns, job, v)), _b(json.dumps(record)), lease))
        ops.append(tx.put(_b(keys.latest(ns, job)), _b(str(v)), lease))
        ops.append(tx.put(_b(keys.holder(ns, job, v, self.pod)), _b(directory), lease))
        for _ in range(3):  # `latest` moved between the read and the write to an older version (a rollout-only
            # pod registering what it holds after a trainer's lease went, rollout/kept.py): read it again
            compare = [tx.version(_b(keys.version(ns, job, v))) == 0]
            cur = await self.latest()
            if cur is not None:
                if cur >= v:
                    raise errors.VersionExists(f"version {v} is not newer than the latest {cur}")
                compare.append(tx.value(_b(keys.latest(ns, job))) == _b(str(cur)))
            else:
                compare.append(tx.version(_b(keys.latest(ns, job))) == 0)
            ok, uncertain = await self.etcd.transaction("register", compare, ops)
            if not ok and uncertain:  # a first attempt on a member that then failed may have committed it
                got = await self.etcd.call("get version", lambda c: c.get(_b(keys.version(ns, job, v))))
                ok = got is not None and int(got.lease) == lease
            if ok:
                return v
        raise errors.VersionExists(f"version {v} (or a newer one) was registered concurrently")

    async def latest(self) -> int | None:
        got = await self.etcd.call("get latest", lambda c: c.get(_b(keys.latest(*self._k()))))
        return int(got.value) if got is not None else None

    async def version_record(self, v: int) -> dict[str, Any]:
        got = await self.etcd.call("get version", lambda c: c.get(_b(keys.version(*self._k(), v))))
        if got is None:
            raise errors.VersionNotFound(f"version {v} of job {self.namespace}/{self.scope} is not registered")
        return dict(json.loads(got.value))

    async def shard_records(self, v: int) -> list[dict[str, Any]]:
        rng = await self.etcd.call("get shards", lambda c: c.get_prefix(_b(keys.shards_prefix(*self._k(), v))))
        return [json.loads(kv.value) for kv in rng]

    async def versions(self) -> list[int]:
        prefix = _b(keys.versions_prefix(*self._k()))
        rng = await self.etcd.call("list versions", lambda c: c.get_prefix(prefix, keys_only=True))
        return sorted(keys.version_of(kv.key.decode()) for kv in rng)

    async def pin(self, v: int) -> None:
        """Hold version v against GC (lease-bound); VersionNotFound if it is not (or no longer) there."""
        ns, job = self._k()
        tx = self.etcd.transactions
        # a retry after a first attempt that did commit puts the same key again: no ambiguity
        ok, _ = await self._leased(f"pinning version {v}", lambda lease: self.etcd.transaction(
            "pin",
            compare=[tx.version(_b(keys.version(ns, job, v))) > 0],
            success=[tx.put(_b(keys.reader(ns, job, v, self.me)), b"1", lease)],
        ))
        if not ok:
            raise errors.VersionNotFound(f"version {v} of job {ns}/{job} is not registered")

    async def unpin(self, v: int) -> None:
        await self.etcd.call("unpin", lambda c: c.delete(_b(keys.reader(*self._k(), v, self.me))))

    async def readers(self, v: int) -> list[str]:
        prefix = _b(keys.readers_prefix(*self._k(), v))
        rng = await self.etcd.call("list readers", lambda c: c.get_prefix(prefix, keys_only=True))
        return [kv.key.decode().rsplit("/", 1)[-1] for kv in rng]

    async def gc(self, keep: int) -> list[int]:
        """Unregister versions older than the newest `keep` that no reader pins; returns them."""
        ns, job = self._k()
        tx = self.etcd.transactions
        removed = []
        for v in (await self.versions())[:-keep] if keep > 0 else await self.versions():
            rp = _b(keys.readers_prefix(ns, job, v))
            sp = _b(keys.shards_prefix(ns, job, v))
            hp = _b(keys.holder(ns, job, v, ""))
            vk = _b(keys.version(ns, job, v))
            ok, uncertain = await self.etcd.transaction(
                "gc",
                compare=[tx.version(rp, range_end=prefix_range_end(rp)) == 0],
                success=[
                    tx.delete(vk),
                    tx.delete(sp, range_end=prefix_range_end(sp)),
                    tx.delete(hp, range_end=prefix_range_end(hp)),
                ],
            )
            if not ok and uncertain:  # pinned since, or deleted by our own first attempt?
                ok = await self.etcd.call("get version", lambda c: c.get(vk)) is None  # noqa: B023
            if ok:
                removed.append(v)
        return removed

    async def watch_latest(self) -> AsyncIterator[int]:
        """Yield each new value of `latest` (starting with the current one, if any); the watch
        starts right after the revision of that read and survives a member loss."""
        key = _b(keys.latest(*self._k()))
        cur, revision = await self.etcd.revision(key)
        if cur is not None:
            yield int(cur.value)
        async for ev in self.etcd.watch("watch latest", key, revision + 1):
            if ev.kind == aetcd.rtypes.EventKind.PUT:
                yield int(ev.kv.value)

    # ---- holders (pods that serve a version to others; transports) ---------------------------
    async def add_holder(self, v: int, directory: str) -> None:
        """Announce that this pod holds version v complete (lease-bound: gone when the pod dies)."""
        key = _b(keys.holder(*self._k(), v, self.pod))
        await self._leased(f"holding version {v}",
                           lambda lease: self.etcd.call("add holder", lambda c: c.put(key, _b(directory), lease)))

    async def holders(self, v: int) -> list[str]:
        """Pods holding version v complete, in the order they announced it (publisher first)."""
        rng = await self.etcd.call("list holders", lambda c: c.get_prefix(_b(keys.holders_prefix(*self._k(), v))))
        return [kv.key.decode().rsplit("/", 1)[-1] for kv in sorted(rng, key=lambda kv: kv.create_revision)]

    async def list_ordered(self, prefix: str) -> list[tuple[str, int, dict[str, Any]]]:
        """(key, create revision, JSON value) of every record under `prefix`, oldest first."""
        rng = await self.etcd.call(f"list {prefix}", lambda c: c.get_prefix(_b(prefix)))
        return sorted(
            ((kv.key.decode(), int(kv.create_revision), dict(json.loads(kv.value))) for kv in rng),
            key=lambda t: t[1],
        )

    async def delete(self, key: str) -> None:
        await self.etcd.call(f"delete {key}", lambda c: c.delete(_b(key)))

    # ---- engine status and operations -------------------------------------------------------
    async def put_status(self, status: dict[str, Any]) -> None:
        key = _b(keys.engine(*self._k(), self.pod, self.role))
        await self._leased("status", lambda lease: self.etcd.call(
            "put status", lambda c: c.put(key, _b(json.dumps(status)), lease)))

    async def get_status(self, pod: str, role: str) -> dict[str, Any] | None:
        got = await self.etcd.call("get status", lambda c: c.get(_b(keys.engine(*self._k(), pod, role))))
        return None if got is None else dict(json.loads(got.value))

    async def put_op(self, op_id: str, record: dict[str, Any]) -> None:
        """Record an operation on this identity's lease (its history lives as long as the engine)."""
        key = _b(keys.op(*self._k(), self.pod, self.role, op_id))
        await self._leased("operation", lambda lease: self.etcd.call(
            "put op", lambda c: c.put(key, _b(json.dumps(record)), lease)))

    async def ops(self) -> list[dict[str, Any]]:
        """This identity's operations, oldest first (ids start with a nanosecond timestamp)."""
        prefix = _b(keys.op(*self._k(), self.pod, self.role, ""))
        rng = await self.etcd.call("list ops", lambda c: c.get_prefix(prefix))
        return [dict(json.loads(kv.value), id=kv.key.decode().rsplit("/", 1)[-1]) for kv in rng]

    async def get_op(self, op_id: str) -> dict[str, Any] | None:
        got = await self.etcd.call("get op", lambda c: c.get(_b(keys.op(*self._k(), self.pod, self.role, op_id))))
        return None if got is None else dict(json.loads(got.value))

    # ---- plain JSON records (progress, endpoints) --------------------------------------------
    async def put_json(self, key: str, value: dict[str, Any], lease: bool = False) -> None:
        """Store a JSON record; with `lease`, it vanishes when this identity's lease expires."""
        if not lease:
            await self.etcd.call(f"put {key}", lambda c: c.put(_b(key), _b(json.dumps(value))))
            return
        await self._leased(key, lambda lease_id: self.etcd.call(
            f"put {key}", lambda c: c.put(_b(key), _b(json.dumps(value)), lease_id)))

    async def get_json(self, key: str) -> dict[str, Any] | None:
        got = await self.etcd.call(f"get {key}", lambda c: c.get(_b(key)))
        return None if got is None else dict(json.loads(got.value))

    async def list_json(self, prefix: str) -> dict[str, dict[str, Any]]:
        """Every JSON record under `prefix`, keyed by its full key."""
        got = await self.etcd.call(f"list {prefix}", lambda c: c.get_prefix(_b(prefix)))
        return {kv.key.decode(): dict(json.loads(kv.value)) for kv in got}

