"""Delta updates over the broadcast: a receiver that holds an older version b asks complete
holders of v for each shard as a delta against b (delta.py), and pulls in full what they cannot.

Callers: holder_server.py answers {"op": "delta", "job", "v", "base", "shard"} with `DeltaSource.payload`
(header {"ok", "length"} + the payload; a holder that lacks v or b complete refuses); receiver.py
calls `pull_deltas` once the version's receive is announced and before its full pull, which then
fetches only the shards still missing. A shard rebuilt from a delta is proved by v's checksums
before its bytes count as present (downstream receivers stream it only then); a delta that is
corrupt, a base that differs or is damaged, or a holder that refuses leaves the shard to the
full pull, so a version is never torn and never slower to arrive than without deltas (minus
one round trip per refusing holder).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.etcd import keys
from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.checkpoint_engine.transport.store import Incoming, LocalStore
from tandem.checkpoint_engine.transport.transport_interface import Peer, PeerFailed
from tandem.checkpoint_engine.transport.wire import Connection, recv_exact, recv_msg, send_msg
from tandem.checkpoint_engine.versions import delta, layout

log = logging.getLogger(__name__)

CACHE_BYTES = 256 << 20  # encoded payloads kept per holder: N receivers cost one encode


@dataclass
class DeltaStats:
    """What the delta pass of one receive did."""

    base: int | None = None  # the local version deltas were asked against (None: none here)
    shards: int = 0  # shards rebuilt from deltas
    wire_bytes: int = 0  # payload bytes received for them
    shard_bytes: int = 0  # their size in full
    seconds: float = 0.0
    fallbacks: list[str] = field(default_factory=list)  # why shards (or all) went to the full pull


class DeltaSource:
    """Encodes (and caches) shard deltas of the complete versions in a holder's store."""

    def __init__(self, store: LocalStore, cache_bytes: int = CACHE_BYTES) -> None:
        self.store, self.cache_bytes = store, cache_bytes
        self._cache: OrderedDict[tuple[object, ...], bytes] = OrderedDict()
        self._busy: dict[tuple[object, ...], threading.Lock] = {}
        self._lock = threading.Lock()

    def payload(self, v: int, base: int, shard: int) -> bytes:
        pv, pb = self.store.complete_dir(v), self.store.complete_dir(base)
        if pv is None or pb is None:
            missing = v if pv is None else base
            raise errors.VersionNotFound(f"version {missing} is not complete here: no delta of {v} against {base}")
        iv, ib = layout.read_index(pv), layout.read_index(pb)
        key = (v, iv.created, base, ib.created, shard)  # a re-published number is another version
        with self._lock:
            lock = self._busy.setdefault(key, threading.Lock())
        try:
            with lock:  # concurrent askers of one delta wait for a single encode
                with self._lock:
                    hit = self._cache.get(key)
                    if hit is not None:
                        self._cache.move_to_end(key)
                        return hit
                if not 0 <= shard < len(iv.shards):
                    raise errors.VersionNotFound(f"version {v} has no shard {shard}")
                out = delta.encode(iv, shard, delta.open_shards(pv, iv)[shard], ib, delta.open_shards(pb, ib))
                with self._lock:
                    self._cache[key] = out
                    while sum(len(p) for p in self._cache.values()) > self.cache_bytes and len(self._cache) > 1:
                        self._cache.popitem(last=False)
                return out
        finally:
            with self._lock:
                self._busy.pop(key, None)


def local_base(store: LocalStore, v: int) -> int | None:
    """The newest complete version below `v` on this pod, the base of a delta."""
    older = [b for b in layout.list_versions(store.root, store.job) if b < v and store.complete_dir(b)]
    return older[-1] if older else None


def delta_peers(reg: SyncRegistry, v: int, key: bytes) -> list[Peer]:
    """Complete holders of `v` with an endpoint, spread by a hash of my name (not all on one);
    `key`: the job's shard key (auth.py) the connections to them prove."""
    prefix = keys.transport_endpoint(reg.namespace, reg.scope, "")
    peers = {p.pod: p for p in (Peer.from_record(r, key) for r in reg.list_json(prefix).values())}
    names = [h for h in reg.holders(v) if h != reg.pod and h in peers]
    names.sort(key=lambda h: hashlib.blake2b(f"{reg.pod}/{h}".encode(), digest_size=8).digest())
    return [peers[n] for n in names]


def pull_deltas(
    reg: SyncRegistry,
    store: LocalStore,
    inc: Incoming,
    v: int,
    fetch_index: Callable[[Peer], None],
    timeout: float,
    key: bytes,
) -> DeltaStats:
    """Rebuild what shards of `v` the holders can send as deltas against this pod's newest older
    version; the others stay empty for the full pull. Never raises for a delta that fails."""
    t0 = time.perf_counter()
    stats = DeltaStats(base=local_base(store, v))
    if stats.base is None:
        stats.fallbacks.append("no older version here: full shards")
        return stats
    try:
        base_path = store.complete_dir(stats.base)
        if base_path is None:
            raise errors.VersionNotFound(f"base version {stats.base} vanished")
        base_index = layout.read_index(base_path)
        base_shards = delta.open_shards(base_path, base_index)
    except errors.CheckpointEngineError as e:
        stats.fallbacks.append(f"base {stats.base} unusable: {e}")
        return stats
    given_up: set[int] = set()
    for peer in delta_peers(reg, v, key):
        try:
            if inc.index is None:
                fetch_index(peer)
            if _from_peer(peer, store.job, inc, v, stats, base_index, base_shards, given_up, timeout):
                break
        except PeerFailed as e:
            stats.fallbacks.append(f"{peer.pod}: {e}")
        except delta.BaseMismatch as e:  # the holders' base b is not ours: no delta will fit
            stats.fallbacks.append(str(e))
            break
    stats.seconds = time.perf_counter() - t0
    return stats


def _from_peer(
    peer: Peer,
    job: str,
    inc: Incoming,
    v: int,
    stats: DeltaStats,
    base_index: layout.VersionIndex,
    base_shards: list[np.ndarray],
    given_up: set[int],
    timeout: float,
) -> bool:
    """Ask `peer` for every shard still missing, all requests at once (the holder encodes shard
    i+1 while we decode shard i); True once none is left to try, False if it refused some."""
    index = inc.index
    if index is None:
        raise PeerFailed("index not set")
    todo = [i for i, s in enumerate(index.shards) if i not in given_up and inc.avail[i] < s.nbytes]
    conn = Connection(peer, timeout=timeout)
    refused = False
    try:
        try:
            for shard in todo:
                send_msg(conn.sock, {"op": "delta", "job": job, "v": v, "base": base_index.version, "shard": shard})
        except OSError as e:
            raise PeerFailed(f"{peer.pod}: delta requests failed: {e}") from e
        for shard in todo:
            try:
                reply = recv_msg(conn.sock)
                if not reply.get("ok"):
                    stats.fallbacks.append(f"{peer.pod} refused shard {shard}: {reply.get('error')}")
                    refused = True
                    continue
                payload = recv_exact(conn.sock, int(reply["length"]))
            except (OSError, KeyError, ValueError) as e:
                raise PeerFailed(f"{peer.pod}: delta of shard {shard} cut off: {e}") from e
            stats.wire_bytes += len(payload)
            nbytes = index.shards[shard].nbytes
            out = np.frombuffer(inc.dests[shard].view(), dtype=np.uint8)
            try:
                delta.decode(payload, index, shard, base_index, base_shards, out)
            except (delta.CorruptDelta, errors.ChecksumMismatch) as e:
                log.warning("delta of version %d shard %d from %s refused (%s): full shard", v, shard, peer.pod, e)
                stats.fallbacks.append(f"shard {shard}: {e}")
                given_up.add(shard)
                continue
            finally:
                del out
            inc.advance(shard, nbytes)
            stats.shards += 1
            stats.shard_bytes += nbytes
        return not refused
    finally:
        conn.close()
