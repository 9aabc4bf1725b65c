"""Broadcast across "pods" that are network namespaces with their own addresses on one machine.

Each pod runs in its own namespace (`ip netns`), joined by veth pairs to a bridge that exists only
for this test, with addresses from 198.18.0.0/15 (reserved for benchmarking networks: nothing
outside this machine is addressed). etcd listens on the bridge's address. Skipped, with the
reason, where namespaces cannot be created (no root, no CAP_NET_ADMIN).
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from broadcast_pods import Pods, same_bytes, wait_for

from conftest import wait_etcd_ready
from tandem.checkpoint_engine import keys
from tandem.checkpoint_engine.local_etcd import LocalEtcd
from tandem.checkpoint_engine.sync_registry import SyncRegistry
from tandem.checkpoint_engine.transport.rdma import mooncake_available

NAMES = ["pub", "r1", "r2", "late"]
SLOW = ("--mib", "48", "--max-rate", str(24 << 20))


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Net:
    """A bridge plus one namespace per pod; `addr[pod]` is the pod's address."""

    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.octet = 100 + secrets.randbelow(100)
        self.bridge = f"tb{tag}"
        self.gw = f"198.18.{self.octet}.1"
        self.ns: dict[str, tuple[str, str]] = {}
        self._links: list[str] = []
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gw}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, pod in enumerate(NAMES):
            ns, host_end, addr = f"tdm{tag}{i}", f"tv{tag}{i}", f"198.18.{self.octet}.{10 + i}"
            _ip("netns", "add", ns)
            self.ns[pod] = (ns, addr)
            _ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self._links.append(host_end)
            _ip("link", "set", host_end, "master", self.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def close(self) -> None:
        for ns, _ in self.ns.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for link in self._links:
            subprocess.run(["ip", "link", "del", link], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


@pytest.fixture
def net() -> Iterator[Net]:
    if shutil.which("ip") is None:
        pytest.skip("iproute2 (`ip`) is not installed")
    try:
        n = Net()
    except subprocess.CalledProcessError as e:
        pytest.skip(f"cannot create network namespaces here ({' '.join(e.cmd)}: {e.stderr.strip()})")
    try:
        yield n
    finally:
        n.close()


@pytest.fixture
def bridge_etcd(net: Net) -> Iterator[LocalEtcd]:
    tmp = Path(tempfile.mkdtemp(prefix="tandem-etcd-ns-"))
    etcd = LocalEtcd(tmp / "data")
    etcd.host, etcd.endpoint = net.gw, f"http://{net.gw}:{etcd.port}"
    try:
        etcd.start()
        wait_etcd_ready(etcd.endpoint)
        yield etcd
    finally:
        etcd.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _receiving(reg: SyncRegistry, pods: Pods) -> list[str]:
    return [k.rsplit("/", 1)[-1] for k, _, _ in reg.list_ordered(keys.receiving_prefix("test", pods.job, 1))]


def _run(net: Net, etcd: LocalEtcd, shm_base: Path, transport: str) -> None:
    pods = Pods(etcd.endpoint, shm_base, netns=net.ns)
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
def test_tcp_chain_across_namespaces(net: Net, bridge_etcd: LocalEtcd, shm_base: Path) -> None:
    _run(net, bridge_etcd, shm_base, "tcp")


@pytest.mark.etcd
@pytest.mark.skipif(not mooncake_available(), reason="Mooncake transfer engine not importable")
def test_mooncake_chain_across_namespaces(net: Net, bridge_etcd: LocalEtcd, shm_base: Path) -> None:
    """The RDMA class itself, over Mooncake's TCP protocol (no RDMA device on these machines)."""
    _run(net, bridge_etcd, shm_base, "mooncake-tcp")
