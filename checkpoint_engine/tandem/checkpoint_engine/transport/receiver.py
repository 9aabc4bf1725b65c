"""Receiver: pulls version v from other pods into this pod's shm dir, in a pipelined chain.

Caller: node.py (`BroadcastNode.receive`), i.e. a rollout pod's checkpoint engine before
`RolloutEngine.update(v)`. Steps: read v's shard records from etcd; announce `receiving/<v>/<me>`
(lease-bound; its create revision gives my place in the chain); pick an upstream (`plan`): the
nearest earlier receiver in the chain, else a complete holder (rendezvous-hashed, so pulls
spread over holders) — or, where the link model says a binary tree finishes first (`fanout`: small
versions such as LoRA adapters, or many receivers), my parent in the tree over the join order;
stream each shard into a layout temp dir (store.Incoming, which my own
holder server re-serves to the receiver after me while bytes arrive); check each shard's tensor
checksums as soon as it is complete, while the next one arrives (verify.py; the index is
checked against etcd's shard digests); on a dead or stalled upstream, re-plan from etcd and
resume at the same byte; on a corrupt shard, shun its sources and pull that shard again;
rename atomically; announce `holders/<v>/<me>`. Before the full pull, a pod that holds an older
version asks complete holders for v's shards as deltas against it (deltas.py; off: `delta=False`).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.etcd import keys
from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.checkpoint_engine.transport.deltas import DeltaStats, pull_deltas
from tandem.checkpoint_engine.transport.store import Incoming, LocalStore
from tandem.checkpoint_engine.transport.tcp import TcpTransport
from tandem.checkpoint_engine.transport.transport_interface import NoSource, Peer, PeerFailed, Transport
from tandem.checkpoint_engine.transport.verify import ShardVerifier
from tandem.checkpoint_engine.transport.wire import Connection
from tandem.checkpoint_engine.versions import layout

HOP_BYTES = 6 << 20  # bytes a forwarding hop holds in flight (bench/broadcast.py: 50 ms at 1 Gbit/s = 6.0 MB)
MAX_SHARD_ATTEMPTS = 3  # a shard still corrupt after this many pulls means the version itself is bad

log = logging.getLogger(__name__)


@dataclass
class ReceiveReport:
    version: int
    path: Path
    bytes: int
    seconds: float
    verify_s: float  # from the last byte received until every shard was verified (the rest overlaps)
    transfer_s: float = 0.0  # from the first upstream chosen to the last byte received
    upstreams: list[str] = field(default_factory=list)  # every peer pulled from, in order
    replans: int = 0
    shard_retries: int = 0  # shards pulled again after failing their checksums
    already_here: bool = False
    delta: DeltaStats | None = None  # the delta pass before the full pull (deltas.py); None: off


def _rank(me: str, holder: str) -> bytes:
    return hashlib.blake2b(f"{me}/{holder}".encode(), digest_size=8).digest()


def fanout(nbytes: int, receivers: int, hop_bytes: int = HOP_BYTES) -> int:
    """1 (a chain) or 2 (a binary tree): the tree only where a link model says it finishes at least a quarter
    sooner, counting times in bytes at one link's rate. Chain: the first receiver takes the version at the full
    rate, each further one adds one hop (min(nbytes, hop_bytes) in flight): nbytes + (receivers - 1) x hop.
    Tree: every sender feeds two children at half the rate each, each of its levels after the first adds a
    hop at that rate: 2 x nbytes + 2 x (depth - 1) x hop. The quarter covers what the model leaves out
    (a sender serving two streams, each level's set-up): on shaped 1 Gbit links with 8 receivers the chain
    was as fast or faster for 4 and 20 MiB versions (bench/broadcast.py --fan 1|2, in its docstring), and the
    rule keeps it there; it picks the tree from 16 receivers for versions of a few MiB (4 MiB: 64 vs 32) and
    for large versions only from about 128 (256 MiB: 1018 vs 584)."""
    if receivers < 2:
        return 1
    hop = min(nbytes, hop_bytes)
    depth = max(1, math.ceil(math.log2(receivers + 2)) - 1)  # levels of 2, 4, 8, ... receivers
    chain = nbytes + (receivers - 1) * hop
    tree = 2 * nbytes + 2 * (depth - 1) * hop
    return 2 if tree < 0.75 * chain else 1


def plan(me: str, chain: list[str], holders: list[str], bad: set[str], fan: int = 1) -> list[str]:
    """Upstream candidates for `me`, best first.

    `fan` 2 (`fanout`): a binary tree over the join order instead of the chain; receiver i (0-based) pulls
    from receiver i // 2 - 1, the first two from the holders; if its parent fails, from the parent's parent
    and so on up, then the holders, then any earlier receiver. What follows describes `fan` 1, the chain,
    where the ancestors are exactly the earlier receivers, nearest first.

    `chain`: pods receiving the version, in join order; `holders`: pods holding it complete.
    First the earlier receivers from nearest to farthest: normally the one just before me (a
    pipelined chain sender→r1→r2…: every pod sends the bytes once and receives them once, so N
    receivers cost one transfer plus N hops of pipeline delay, the optimum when every pod has
    the same link), and when it failed, the one before it, whose uplink the failed pod just
    freed (the chain closes over the gap). Then the complete holders, in an order hashed from
    my name (rendezvous hashing): late joiners and chain heads spread over the holders instead
    of all loading the publisher.
    """
    before = chain[: chain.index(me)] if me in chain else list(chain)
    ancestors, at = [], len(before)
    while at >= fan:  # my parent in the fan-ary tree over the join order, its parent, ...
        at = at // fan - 1
        ancestors.append(before[at])
    rest = [p for p in reversed(before) if p not in ancestors]
    out = ancestors + sorted(holders, key=lambda h: _rank(me, h)) + rest
    seen: set[str] = set()
    result = []
    for p in out:
        if p != me and p not in bad and p not in seen:
            seen.add(p)
            result.append(p)
    return result


class Receiver:
    def __init__(
        self,
        registry: SyncRegistry,
        store: LocalStore,
        transport: Transport,
        stall_timeout: float = 5.0,
        deadline: float = 600.0,
        delta: bool = True,
        *,
        key: bytes,
        fan: int | None = None,
    ) -> None:
        """`delta`: first ask holders for shards as deltas against the newest older local version;
        `key`: the job's shard key, proved to every holder server pulled from (auth.py); `fan`: 1 (chain)
        or 2 (binary tree) always, None: `fanout` of the version's size and the pods that take it."""
        self.fan = fan
        self.reg, self.store, self.transport = registry, store, transport
        self.key = key
        self.delta = delta
        self.pod = registry.pod
        self.stall_timeout, self.deadline = stall_timeout, deadline
        self._tcp = TcpTransport()

    # ---- etcd views -----------------------------------------------------------------------------
    def _peers(self) -> dict[str, Peer]:
        prefix = keys.transport_endpoint(self.reg.namespace, self.reg.scope, "")
        return {p.pod: p for p in (Peer.from_record(r, self.key) for r in self.reg.list_json(prefix).values())}

    def _candidates(self, v: int, bad: set[str], nbytes: int) -> list[Peer]:
        ns, job = self.reg.namespace, self.reg.scope
        chain = [k.rsplit("/", 1)[-1] for k, _, _ in self.reg.list_ordered(keys.receiving_prefix(ns, job, v))]
        holders = self.reg.holders(v)
        peers = self._peers()
        # the pods that will take v: every pod serving shards but the holders (the same count in every receiver)
        fan = self.fan if self.fan is not None else fanout(nbytes, max(len(chain), len(set(peers) - set(holders))))
        names = plan(self.pod, chain, holders, bad, fan)
        return [peers[n] for n in names if n in peers]

    # ---- receive --------------------------------------------------------------------------------
    def receive(self, v: int | None = None) -> ReceiveReport:
        t0 = time.perf_counter()
        if v is None:
            v = self.reg.latest()
            if v is None:
                raise errors.VersionNotFound("no version is registered yet")
        final = layout.version_dir(self.store.root, self.store.job, v)
        records = sorted(self.reg.shard_records(v), key=lambda r: str(r.get("file")))
        if not records:
            raise errors.VersionNotFound(f"version {v} is not registered")
        if self.store.complete_dir(v) is not None:
            self.reg.add_holder(v, str(final))
            idx = layout.read_index(final)
            return ReceiveReport(v, final, idx.total_bytes, time.perf_counter() - t0, 0.0, already_here=True)
        layout.clean_stale_temps(self.store.root, self.store.job)
        inc = self.store.begin(v)
        rkey = keys.receiving(self.reg.namespace, self.reg.scope, v, self.pod)
        report = ReceiveReport(v, final, 0, 0.0, 0.0)
        verifiers: list[ShardVerifier] = []
        try:
            self.reg.put_json(rkey, {"pod": self.pod, "since": time.time()}, lease=True)
            if self.delta:  # what it rebuilds is verified again below; the rest is pulled in full
                fetch = functools.partial(self._fetch_index, inc, v=v, records=records)
                report.delta = pull_deltas(self.reg, self.store, inc, v, fetch, self.stall_timeout, self.key)
            self._pull_all(inc, v, records, report, time.monotonic() + self.deadline, verifiers)
            index = inc.index
            if index is None or not verifiers or not verifiers[0].all_ok():  # _pull_all returns only then
                raise errors.TornVersion(f"version {v}: not every shard was verified")
            inc.finish(final)
        except BaseException:
            inc.abandon()
            self.store.drop(v)
            _quiet(lambda: self.reg.delete(rkey))
            raise
        finally:
            for ver in verifiers:
                ver.close()
        self.reg.add_holder(v, str(final))
        _quiet(lambda: self.reg.delete(rkey))
        report.bytes = index.total_bytes
        report.seconds = time.perf_counter() - t0
        return report

    def _pull_all(
        self,
        inc: Incoming,
        v: int,
        records: list[dict[str, object]],
        report: ReceiveReport,
        deadline: float,
        verifiers: list[ShardVerifier],
    ) -> None:
        """Pull every shard, each verified as soon as its last byte lands (verify.py); a shard
        that fails its checksums is pulled again, from another source, and its sources are
        shunned. Returns once every shard is verified."""
        bad: set[str] = set()
        sources: dict[int, set[str]] = defaultdict(set)
        tp = last_byte = time.perf_counter()
        while True:
            ver = verifiers[0] if verifiers else None
            if ver is not None:
                self._repull_failed(ver, inc, sources, bad, report)
                if ver.all_ok():
                    report.transfer_s = last_byte - tp
                    report.verify_s = time.perf_counter() - last_byte
                    return
            if time.monotonic() > deadline:
                raise NoSource(f"version {v}: not received within {self.deadline}s (tried {report.upstreams})")
            cands = self._candidates(v, bad, sum(int(str(r.get("bytes"))) for r in records))
            if not cands:
                if bad:  # every source failed once: they may have recovered (or new ones joined)
                    bad.clear()
                    time.sleep(min(1.0, self.stall_timeout / 4))
                    report.replans += 1
                    continue
                raise NoSource(f"version {v}: no live pod holds or receives it")
            peer = cands[0]
            report.upstreams.append(peer.pod)
            try:
                if inc.index is None:
                    self._fetch_index(inc, peer, v, records)
                index = inc.index
                if index is None:
                    raise PeerFailed("index not set")
                if ver is None:
                    ver = ShardVerifier(inc.tmp, index)
                    verifiers.append(ver)
                if not inc.addrs:
                    inc.addrs = [
                        self.transport.expose(inc.tmp / s.file, inc.dests[i].view())
                        if self.transport.needs_memory
                        else 0
                        for i, s in enumerate(index.shards)
                    ]
                transport = self.transport if self.transport.name in peer.transports else self._tcp
                for shard, s in enumerate(index.shards):
                    if ver.busy(shard):
                        continue
                    have = inc.avail[shard]
                    if have < s.nbytes:
                        sources[shard].add(peer.pod)
                        transport.pull(
                            peer,
                            self.store.job,
                            v,
                            shard,
                            have,
                            inc.dests[shard],
                            functools.partial(inc.advance, shard),
                            self.stall_timeout,
                        )
                    ver.submit(shard)
                last_byte = time.perf_counter()
                ver.wait(max(0.0, deadline - time.monotonic()))  # verdicts: all good, or a shard to redo
            except PeerFailed as e:
                log.warning("%s: upstream %s failed (%s); re-planning", self.pod, peer.pod, e)
                bad.add(peer.pod)
                report.replans += 1

    def _repull_failed(
        self, ver: ShardVerifier, inc: Incoming, sources: dict[int, set[str]], bad: set[str], report: ReceiveReport
    ) -> None:
        for shard, reason in ver.failed():
            if ver.attempts[shard] >= MAX_SHARD_ATTEMPTS:
                raise errors.ChecksumMismatch(f"shard {shard} failed its checks {ver.attempts[shard]} times: {reason}")
            log.warning("%s: shard %d from %s corrupt (%s); pulling it again", self.pod, shard, sources[shard], reason)
            bad |= sources.pop(shard, set())
            inc.reset(shard)
            report.shard_retries += 1

    def _fetch_index(self, inc: Incoming, peer: Peer, v: int, records: list[dict[str, object]]) -> None:
        conn = Connection(peer, timeout=self.stall_timeout)
        try:
            raw = conn.index(self.store.job, v, wait=self.stall_timeout)
        finally:
            conn.close()
        try:
            index = layout.VersionIndex.model_validate_json(raw)
        except ValueError as e:
            raise PeerFailed(f"{peer.pod} sent an unreadable index: {e}") from e
        got = [(s.file, s.nbytes, s.digest) for s in index.shards]
        want = [(str(r.get("file")), int(str(r.get("bytes"))), str(r.get("digest"))) for r in records]
        if index.version != v or got != want:
            raise PeerFailed(f"{peer.pod} serves an index of version {v} that differs from etcd's")
        inc.set_index(raw, index)


def _quiet(fn: object) -> None:
    try:
        fn()  # type: ignore[operator]
    except errors.CheckpointEngineError as e:
        log.warning("ignored: %s", e)
