"""A 3-member etcd loses the member every client talks to (and the leader) in the middle of a run.

Real etcd members on loopback (`LocalEtcdCluster`), the real Publisher, SyncRegistry and
BroadcastNode (TCP) given all three endpoints. While versions are published, located, synced to
another "pod" (pinned, shard records read, pulled over TCP, checked against the recorded digests),
garbage-collected and watched, member 0 — the leader, which every client talks to — is killed
with SIGKILL. Everything must go on on the two others: no call fails, the writer keeps its lease
(longer than its TTL after the kill), the watch misses no version and repeats none, a pinned
version survives GC, and every version etcd lists has all its shard records.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.etcd.local_etcd import EtcdNotFound, LocalEtcdCluster
from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.checkpoint_engine.service.publisher import Publisher
from tandem.checkpoint_engine.transport import BroadcastNode
from tandem.checkpoint_engine.versions import layout, version_writer

pytestmark = pytest.mark.etcd

KILL_AT = 4  # member 0 dies once this version is registered, while the loop goes on
TTL = 10  # the sidecars' default lease TTL


@pytest.fixture
def cluster() -> Iterator[LocalEtcdCluster]:
    root = Path(tempfile.mkdtemp(prefix="tandem-etcd3-"))
    try:
        c = LocalEtcdCluster(root, 3)
    except EtcdNotFound as e:
        pytest.skip(str(e))
    try:
        c.start(timeout=120)
        yield c
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


def tensors(v: int) -> list[tuple[str, torch.Tensor]]:
    return [(f"layer{i}.weight", torch.full((64, 64), float(v * 10 + i))) for i in range(4)]


def make_leader(c: LocalEtcdCluster, member: int) -> bool:
    """Move raft leadership to `member` with etcdctl (so that killing it forces an election)."""
    ctl = shutil.which("etcdctl")
    if ctl is None:
        return False
    env = {"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"}

    def status() -> list[dict[str, Any]]:
        out = subprocess.run([ctl, "--endpoints", ",".join(c.endpoints), "endpoint", "status", "-w", "json"],
                             env=env, capture_output=True, check=True, timeout=60).stdout
        return list(json.loads(out))

    st = status()
    target = st[member]["Status"]["header"]["member_id"]
    leader = st[0]["Status"]["leader"]
    if leader != target:
        at = next(s["Endpoint"] for s in st if s["Status"]["header"]["member_id"] == leader)
        subprocess.run([ctl, "--endpoints", at, "move-leader", f"{target:x}"],
                       env=env, capture_output=True, check=True, timeout=60)
    deadline = time.monotonic() + 60
    while status()[member]["Status"]["leader"] != target:
        assert time.monotonic() < deadline, "leadership did not move"
        time.sleep(0.2)
    return True


def test_member_loss_mid_run(cluster: LocalEtcdCluster) -> None:
    job = f"job-{uuid.uuid4().hex[:8]}"
    shm = Path("/dev/shm") / f"tandem-test-{uuid.uuid4().hex[:8]}"
    shm.mkdir()
    eps = cluster.endpoints
    leader_killed = make_leader(cluster, 0)  # before any client exists: the move disturbs no request
    writer = SyncRegistry(eps, "test", job, "pod0", "trainer", ttl=TTL).connect()
    reader = SyncRegistry(eps, "test", job, "pod1", "rollout", ttl=TTL).connect()
    watcher = SyncRegistry(eps, "test", job, "pod2", "watch", ttl=TTL).connect()
    pub = Publisher(shm / "pub", job, writer, keep=2)
    serving = BroadcastNode(writer, shm / "pub", transport="tcp", token="test-token").start()
    receiving = BroadcastNode(reader, shm / "rx", transport="tcp", token="test-token").start()
    seen: list[int] = []
    killed_at = 0.0
    try:
        async def watch() -> None:  # one watch for the whole run, across the member loss
            async for v in watcher.reg.watch_latest():
                seen.append(v)
                if v >= target:
                    return

        pub.publish(1, tensors(1))
        reader.pin(1)  # held across the member loss: GC must leave version 1 alone
        n_after = 0
        target = 10**9  # the last version: fixed once the run has gone on long enough after the kill
        watching = threading.Thread(target=lambda: watcher._run(watch(), timeout=600), daemon=True)
        watching.start()
        _wait(lambda: seen == [1], "the watcher saw version 1")
        assert {r.reg.etcd.current for r in (writer, reader, watcher)} == {eps[0]}
        lease = writer.reg._lease.id

        v = 1
        slowest = 0.0  # the longest publish+sync+list round after the kill (the failover pause)
        while v < target:
            v += 1
            t0 = time.monotonic()
            report = pub.publish(v, tensors(v))
            assert report.version == v
            if v == KILL_AT:
                threading.Thread(target=cluster.members[0].kill, daemon=True).start()  # lands mid-operation
                killed_at = time.monotonic()
            sync(reader, receiving, v)
            versions = writer.versions()
            assert versions == sorted({1, v - 1, v}), f"pinned 1 and the newest two, GC took the rest: {versions}"
            if killed_at:
                slowest = max(slowest, time.monotonic() - t0)
                n_after += 1
                # run on for longer than a lease TTL: the keepalive must have moved to a live member
                if n_after >= 3 and time.monotonic() - killed_at > TTL * 1.5 and target > v:
                    target = v + 1
        reader.unpin(1)
        assert pub.gc() == [1], "unpinned, version 1 goes at the next GC"
        watching.join(120)
        assert not watching.is_alive(), f"the watcher did not see version {target}: {seen}"

        assert cluster.members[0].proc is None, "member 0 was killed"
        assert writer.reg._lease is not None and writer.reg._lease.id == lease, "the writer's lease survived"
        assert not writer.reg.lease_lost.is_set()
        for r in (writer, reader, watcher):
            assert r.reg.etcd.current != eps[0] and r.reg.etcd.failovers >= 1, (r.role, r.reg.etcd.current)
        assert seen == list(range(1, target + 1)), f"the watch lost or repeated versions: {seen}"
        for version in writer.versions():  # nothing torn: every listed version has all its shards
            rec = writer.version_record(version)
            assert len(writer.shard_records(version)) == rec["shards"] > 0
        assert writer.versions() == [target - 1, target]
        assert killed_at and n_after >= 3, f"the run went on for {n_after} versions after the kill, not 3"
        print(f"leader killed: {leader_killed}; versions published after the kill: {n_after}; "
              f"longest round after it: {slowest:.2f} s")
    finally:
        for node in (receiving, serving):
            node.close()
        for r in (watcher, reader):
            r.close()
        pub.close()
        shutil.rmtree(shm, ignore_errors=True)


def sync(reader: SyncRegistry, node: BroadcastNode, v: int) -> None:
    """What a rollout pod does with version v: pin it, locate its shards, pull them from the
    holder over TCP, check them against the records, let the version go."""
    reader.pin(v)
    try:
        rec = reader.version_record(v)
        shards = reader.shard_records(v)
        assert len(shards) == rec["shards"] > 0, f"version {v} is torn: {len(shards)} of {rec['shards']} shards"
        got = node.receive(v)
        assert got.version == v
        index = layout.read_index(Path(got.path))
        assert sorted(s["digest"] for s in shards) == sorted(s.digest for s in index.shards)
        layout.MappedVersion(Path(got.path), index).verify_checksums()
    finally:
        reader.unpin(v)
    node.prune(keep=1)


def _wait(cond: Any, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def test_a_dead_first_endpoint_is_skipped(etcd_server: Any, job: str) -> None:
    """The first listed member is down from the start (nothing listens there): the registry
    connects through the next one, comma-separated lists included."""
    from tandem.checkpoint_engine.etcd.local_etcd import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    reg = SyncRegistry(f"{dead}, {etcd_server.endpoint}", "test", job, "pod0", "trainer", timeout=2.0).connect()
    try:
        assert reg.endpoints == [dead, etcd_server.endpoint]
        assert reg.endpoint == etcd_server.endpoint, "after connect, the member that answered"
        reg.put_json(f"/tandem/test/{job}/probe", {"ok": True}, lease=True)
        assert reg.get_json(f"/tandem/test/{job}/probe") == {"ok": True}
    finally:
        reg.close()


def test_a_transaction_whose_answer_was_lost_is_not_reported_as_a_conflict(
    etcd_server: Any, job: str, shm_root: Path
) -> None:
    """A register/gc transaction that etcd committed but whose answer never came back (the member
    died right after) is retried; the retry's guard then fails, and the registry must recognise its
    own committed attempt instead of reporting a concurrent writer (or a pinned version)."""
    import aetcd.exceptions

    writer = SyncRegistry(etcd_server.endpoint, "test", job, "pod0", "trainer", timeout=2.0).connect()
    other = SyncRegistry(etcd_server.endpoint, "test", job, "pod1", "trainer", timeout=2.0).connect()
    try:
        client = writer.reg.etcd._client(0)
        real = client.transaction
        lost: list[bool] = []

        async def commit_then_lose_answer(*args: Any, **kw: Any) -> Any:
            result = await real(*args, **kw)
            if not lost:
                lost.append(True)
                raise aetcd.exceptions.ConnectionFailedError("Stream removed (injected after commit)")
            return result

        client.transaction = commit_then_lose_answer
        reps = [version_writer.write_version(shm_root, job, v, tensors(v), shard_bytes=8192) for v in (1, 2, 3)]
        assert writer.register(reps[0].index, str(reps[0].path)) == 1 and lost == [True]
        assert len(writer.shard_records(1)) == writer.version_record(1)["shards"] == len(reps[0].index.shards)
        with pytest.raises(errors.VersionExists):  # a real conflict is still one
            other.register(reps[0].index, str(reps[0].path))

        for r in reps[1:]:
            writer.register(r.index, str(r.path))
        lost.clear()
        assert writer.gc(keep=2) == [1] and lost == [True], "gc's own committed deletion counts as collected"
        assert writer.versions() == [2, 3]
    finally:
        writer.close()
        other.close()
