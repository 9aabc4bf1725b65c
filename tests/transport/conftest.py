"""Fixtures of the broadcast tests: etcd once it serves, a `Pods` harness (the private /dev/shm dir, `shm_base`,
is tests/conftest.py's).

Callers: test_broadcast.py, test_netns.py and test_shaped_fanout.py (which build their own
namespaced `Pods` and a `net` fixture, an emunet.EmulatedNetwork; `bridge_etcd` serves it).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from broadcast_pods import Pods, wait_etcd_ready  # noqa: E402
from emunet import EmulatedNetwork  # noqa: E402

from tandem.checkpoint_engine.etcd.local_etcd import LocalEtcd  # noqa: E402


@pytest.fixture
def etcd(etcd_server: Any) -> Any:
    """The session's etcd, once it serves requests."""
    wait_etcd_ready(etcd_server.endpoint)
    return etcd_server


@pytest.fixture
def pods(etcd: Any, shm_base: Path) -> Iterator[Pods]:
    p = Pods(etcd.endpoint, shm_base)
    yield p
    p.close()


@pytest.fixture
def bridge_etcd(net: EmulatedNetwork) -> Iterator[LocalEtcd]:
    """A private etcd on the emulated network's bridge address, reachable from every namespace."""
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
