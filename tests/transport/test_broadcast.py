"""Broadcast across "pods" on loopback: separate processes, each with its own shm dir, real etcd.

Covers: version v reaches every receiver byte-exact through a pipelined chain; a receiver killed
mid-transfer does not stop the one after it; a publisher killed mid-transfer is replaced by
another holder; a late joiner gets the current version. Also the pure chain planner, the
transport choice and RDMA discovery ("no device" is an answer, never a crash; on machines with
an RDMA device the no-device case is skipped, saying why).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from broadcast_pods import Pods, same_bytes, wait_for

from tandem.checkpoint_engine.etcd import keys
from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.checkpoint_engine.transport import RdmaUnavailable, make_transport, plan
from tandem.checkpoint_engine.transport.receiver import fanout
from tandem.checkpoint_engine.transport.tcp import TcpTransport
from tandem.checkpoint_engine.transport.transport_choice import rdma_devices

HAS_RDMA = bool(rdma_devices())

# 48 MiB in 16 MiB shards, streams capped at 24 MiB/s: about 2 s per version, time to kill things
SLOW = ("--mib", "48", "--max-rate", str(24 << 20))


def test_plan_is_a_chain_closing_over_gaps_then_spread_holders() -> None:
    chain = ["r1", "r2", "r3"]
    assert plan("r1", chain, ["pub"], set()) == ["pub"]
    assert plan("r3", chain, ["pub"], set()) == ["r2", "r1", "pub"]
    assert plan("r3", chain, ["h", "pub"], {"r2"})[:1] == ["r1"]  # r2 failed: r1's uplink is free
    assert plan("late", [], ["pub", "r1"], {"pub"}) == ["r1"]
    assert plan("r1", chain, [], {"r1"}) == []
    holders = [f"h{i}" for i in range(8)]
    firsts = {plan(f"late{i}", [], holders, set())[0] for i in range(32)}
    assert len(firsts) >= 4, firsts  # chain heads and late joiners spread over the holders
    assert plan("x", [], holders, set()) == plan("x", [], list(reversed(holders)), set())  # order-free


def test_plan_as_a_binary_tree_falls_back_through_ancestors_then_holders() -> None:
    chain = [f"r{i}" for i in range(8)]
    parents = {me: plan(me, chain, ["pub"], set(), fan=2)[0] for me in chain}
    assert parents == {"r0": "pub", "r1": "pub", "r2": "r0", "r3": "r0", "r4": "r1", "r5": "r1", "r6": "r2",
                       "r7": "r2"}
    served = [list(parents.values()).count(p) for p in ["pub", *chain]]
    assert max(served) == 2  # no uplink feeds more than two receivers
    assert plan("r7", chain, ["pub"], set(), fan=2) == ["r2", "r0", "pub", "r6", "r5", "r4", "r3", "r1"]
    assert plan("r7", chain, ["pub"], {"r2"}, fan=2)[:2] == ["r0", "pub"]  # the parent failed: its parent
    for me in chain:  # fan 1 is the chain
        assert plan(me, chain, ["pub"], set(), fan=1) == plan(me, chain, ["pub"], set())


def test_fanout_follows_the_link_model() -> None:
    mib = 1 << 20
    assert fanout(256 * mib, 8) == 1 and fanout(256 * mib, 64) == 1  # pipelined: each hop adds a few MB
    assert fanout(256 * mib, 128) == 2  # 127 hops against 6 levels
    assert fanout(4 * mib, 8) == 1 and fanout(20 * mib, 8) == 1  # measured: the chain is as fast at 8
    assert fanout(4 * mib, 16) == 2 and fanout(20 * mib, 16) == 2  # small versions, more receivers
    assert fanout(1 * mib, 1) == 1 and fanout(1 * mib, 2) == 1  # nothing to gain


def test_discovery_without_sysfs_or_with_an_empty_one(tmp_path: Path) -> None:
    assert rdma_devices(tmp_path / "absent") == []
    (tmp_path / "empty").mkdir()
    assert rdma_devices(tmp_path / "empty") == []


def test_tcp_is_always_available() -> None:
    assert isinstance(make_transport("tcp", host="127.0.0.1", metadata="127.0.0.1:2379"), TcpTransport)


@pytest.mark.skipif(HAS_RDMA, reason="this machine has an RDMA device")
def test_auto_falls_back_to_tcp_and_rdma_refuses_without_a_device() -> None:
    assert make_transport("auto", host="127.0.0.1", metadata="127.0.0.1:2379").name == "tcp"
    with pytest.raises(RdmaUnavailable, match="no RDMA device"):
        make_transport("rdma", host="127.0.0.1", metadata="127.0.0.1:2379")


def test_unknown_transport_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown transport"):
        make_transport("udp", host="127.0.0.1", metadata="127.0.0.1:2379")


def _receiving(reg: SyncRegistry, pods: Pods) -> list[str]:
    return [k.rsplit("/", 1)[-1] for k, _, _ in reg.list_ordered(keys.receiving_prefix("test", reg.scope, 1))]


def _registry(pods: Pods, etcd: Any) -> SyncRegistry:
    return SyncRegistry(etcd.endpoint, "test", pods.job, "observer", "test").connect()


@pytest.mark.etcd
def test_chain_reaches_every_receiver_byte_exact_and_late_joiner(pods: Pods, etcd: Any) -> None:
    pub = pods.start("publish", "pub", "--mib", "40", "--max-rate", str(64 << 20))
    pub.event()
    rs = [pods.start("receive", f"r{i}", "--mib", "40", "--max-rate", str(64 << 20)) for i in range(3)]
    done = []
    for r in rs:
        assert r.event()["event"] == "ready"
    for r in rs:
        ev = r.event(90)
        assert ev["event"] == "done", ev
        done.append(ev)
        same_bytes(pods.version_dir(pub), pods.version_dir(r))
    firsts = {ev["pod"]: ev["upstreams"][0] for ev in done}
    # pipelined chain: somebody pulled from a receiver rather than from the publisher
    assert any(up.startswith("r") for up in firsts.values()), firsts
    reg = _registry(pods, etcd)
    try:
        assert set(reg.holders(1)) == {"pub", "r0", "r1", "r2"}
        assert reg.list_ordered(keys.receiving_prefix("test", reg.scope, 1)) == []
    finally:
        reg.close()
    late = pods.start("receive", "late", "--version", "0")
    late.event()
    ev = late.event(90)
    assert ev["event"] == "done", ev
    same_bytes(pods.version_dir(pub), pods.version_dir(late))


@pytest.mark.etcd
def test_receiver_killed_mid_transfer_does_not_stall_the_next(pods: Pods, etcd: Any) -> None:
    pub = pods.start("publish", "pub", *SLOW)
    pub.event()
    reg = _registry(pods, etcd)
    try:
        r1 = pods.start("receive", "r1", "--wait-go", *SLOW)
        r2 = pods.start("receive", "r2", "--wait-go", *SLOW)
        r1.event(), r2.event()
        r1.go()
        wait_for(lambda: _receiving(reg, pods) == ["r1"], 30, "r1 receiving")
        r2.go()
        wait_for(lambda: _receiving(reg, pods) == ["r1", "r2"], 30, "r2 receiving")
        time.sleep(0.5)
        r1.kill()  # mid-transfer: r2 streams from r1 at this point
        ev = r2.event(90)
    finally:
        reg.close()
    assert ev["event"] == "done", ev
    assert ev["upstreams"][0] == "r1" and ev["replans"] >= 1, ev
    same_bytes(pods.version_dir(pub), pods.version_dir(r2))


@pytest.mark.etcd
def test_sender_killed_mid_transfer_is_replaced_by_a_holder(pods: Pods, etcd: Any) -> None:
    pub = pods.start("publish", "pub", *SLOW)
    ref = pods.version_dir(pub)
    pub.event()
    holder = pods.start("receive", "holder", "--mib", "48")
    holder.event()
    assert holder.event(90)["event"] == "done"
    reg = _registry(pods, etcd)
    try:
        r1 = pods.start("receive", "r1", "--wait-go", *SLOW)
        r2 = pods.start("receive", "r2", "--wait-go", *SLOW)
        r1.event(), r2.event()
        r1.go()
        wait_for(lambda: _receiving(reg, pods) == ["r1"], 30, "r1 receiving")
        r2.go()
        wait_for(lambda: _receiving(reg, pods) == ["r1", "r2"], 30, "r2 receiving")
        time.sleep(0.5)
        pub.kill()
        evs = [r1.event(90), r2.event(90)]
    finally:
        reg.close()
    for ev in evs:
        assert ev["event"] == "done", ev
    assert any("holder" in ev["upstreams"] for ev in evs), evs
    for r in (r1, r2, holder):
        same_bytes(ref, pods.version_dir(r))


@pytest.mark.etcd
def test_in_process_nodes_receive_then_prune_unregistered_versions(etcd: Any, shm_base: Path) -> None:
    """Two nodes in one process (the API as a pod's engine calls it): receive, then prune what
    the publisher's GC unregistered; the next version lands in the pruned one's files."""
    import torch

    from tandem.checkpoint_engine.service.publisher import Publisher
    from tandem.checkpoint_engine.transport import BroadcastNode
    from tandem.checkpoint_engine.versions import layout

    job = "prune"
    a = SyncRegistry(etcd.endpoint, "test", job, "pub", "trainer", timeout=15).connect()
    b = SyncRegistry(etcd.endpoint, "test", job, "rx", "rollout", timeout=15).connect()
    na = BroadcastNode(a, shm_base / "pub", transport="tcp", token="test-token").start()
    nb = BroadcastNode(b, shm_base / "rx", transport="tcp", token="test-token").start()
    try:
        pub = Publisher(shm_base / "pub", job, a, keep=1, shard_bytes=1 << 20)
        for v in (1, 2):
            pub.publish(v, [(f"w{i}", torch.full((300_000 + i,), v + i, dtype=torch.uint8)) for i in range(5)])
            rep = nb.receive_latest()
            assert rep.version == v and rep.upstreams == ["pub"]
            same_bytes(layout.version_dir(shm_base / "pub", job, v), rep.path)
        assert nb.receive(2).already_here
        assert a.versions() == [2]  # keep=1: version 1 was unregistered once nobody pinned it
        assert nb.prune(keep=1) == [1]
        assert layout.list_versions(shm_base / "rx", job) == [2]
        # version 1's shard files became spares: version 3 is received into them, bit-exact
        spare = layout.job_dir(shm_base / "rx", job) / ".spare"
        inodes = {f.stat().st_ino for f in spare.iterdir()}
        assert len(inodes) == len(layout.read_index(rep.path).shards) == 2
        pub.publish(3, [(f"w{i}", torch.full((300_000 + i,), 3 + i, dtype=torch.uint8)) for i in range(5)])
        rep = nb.receive(3)
        same_bytes(layout.version_dir(shm_base / "pub", job, 3), rep.path)
        assert {f.stat().st_ino for f in rep.path.glob("shard-*")} <= inodes
        assert not any(spare.iterdir())
    finally:
        na.close()
        nb.close()
        a.close()
        b.close()
