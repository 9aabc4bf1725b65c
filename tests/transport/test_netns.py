"""Broadcast across "pods" that are network namespaces with their own addresses on one machine.

Each pod runs in its own namespace (emunet.py: veth pairs to a bridge that exists only for this
test, addresses from 198.18.0.0/15, unshaped here). etcd listens on the bridge's address. Also:
what a killed run leaves behind is swept by the next network. Skipped, with the
reason, where namespaces cannot be created (no root, no CAP_NET_ADMIN).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from broadcast_pods import Pods, same_bytes, wait_for
from emunet import EmulatedNetwork, NetError

from tandem.checkpoint_engine.etcd import keys
from tandem.checkpoint_engine.etcd.local_etcd import LocalEtcd
from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.checkpoint_engine.transport.rdma import mooncake_available

NAMES = ["pub", "r1", "r2", "late"]
SLOW = ("--mib", "48", "--max-rate", str(24 << 20))


@pytest.fixture
def net() -> Iterator[EmulatedNetwork]:
    try:
        n = EmulatedNetwork(NAMES, rate=None)
    except NetError as e:
        pytest.skip(f"cannot create network namespaces here ({e})")
    try:
        yield n
    finally:
        n.close()


def _receiving(reg: SyncRegistry, pods: Pods) -> list[str]:
    return [k.rsplit("/", 1)[-1] for k, _, _ in reg.list_ordered(keys.receiving_prefix("test", reg.scope, 1))]


def _run(net: EmulatedNetwork, etcd: LocalEtcd, shm_base: Path, transport: str) -> None:
    pods = Pods(etcd.endpoint, shm_base, netns=net.pods)
    try:
        t = ("--transport", transport)
        pub = pods.start("publish", "pub", *SLOW, *t)
        r1 = pods.start("receive", "r1", "--wait-go", *SLOW, *t)
        r2 = pods.start("receive", "r2", "--wait-go", *SLOW, *t)
        pub.event(), r1.event(), r2.event()
        reg = SyncRegistry(etcd.endpoint, "test", pods.job, "observer", "test").connect()
        try:
            r1.go()
            wait_for(lambda: _receiving(reg, pods) == ["r1"], 30, "r1 receiving")
            r2.go()
            ev1, ev2 = r1.event(90), r2.event(90)
        finally:
            reg.close()
        assert ev1["event"] == ev2["event"] == "done", (ev1, ev2)
        want = "rdma" if transport == "mooncake-tcp" else "tcp"
        assert ev2["transport"] == want and ev2["transport_bytes"] == ev2["bytes"], ev2
        assert ev2["upstreams"][0] == "r1", ev2  # a chain pub → r1 → r2 across namespaces
        ref = pods.version_dir(pub)
        same_bytes(ref, pods.version_dir(r1))
        same_bytes(ref, pods.version_dir(r2))
        late = pods.start("receive", "late", "--version", "0", *t)
        late.event()
        ev = late.event(90)
        assert ev["event"] == "done", ev
        same_bytes(ref, pods.version_dir(late))
    finally:
        pods.close()


@pytest.mark.etcd
def test_tcp_chain_across_namespaces(net: EmulatedNetwork, bridge_etcd: LocalEtcd, shm_base: Path) -> None:
    _run(net, bridge_etcd, shm_base, "tcp")


@pytest.mark.etcd
@pytest.mark.skipif(not mooncake_available(), reason="Mooncake transfer engine not importable")
def test_mooncake_chain_across_namespaces(net: EmulatedNetwork, bridge_etcd: LocalEtcd, shm_base: Path) -> None:
    """The RDMA class itself, over Mooncake's TCP protocol (no RDMA device on these machines)."""
    _run(net, bridge_etcd, shm_base, "mooncake-tcp")


def test_a_network_left_by_a_dead_owner_is_swept() -> None:
    """A bench or test killed mid-run leaves its namespaces; the next network's construction
    (emunet.sweep) deletes them, and never those of a live owner."""
    try:
        left = EmulatedNetwork(["a", "b"], rate="1gbit")
    except NetError as e:
        pytest.skip(f"cannot create network namespaces here ({e})")
    dead = subprocess.Popen(["true"])
    dead.wait()
    rec = json.loads(left._record.read_text())
    left._record.write_text(json.dumps({**rec, "pid": dead.pid}))
    live = EmulatedNetwork(["c"], rate=None)  # sweeps on construction
    try:
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
        assert not any(ns in names for ns in left.namespaces), names
        assert all(ns in names for ns in live.namespaces), names
        assert not left._record.exists()
    finally:
        live.close()
        left.close()
