"""Transport choice and RDMA discovery: "no device" is an answer, never a crash.

Runs without etcd. On machines with an RDMA device the no-device assertions are skipped (said why).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.checkpoint_engine.transport import RdmaUnavailable, make_transport
from tandem.checkpoint_engine.transport.discovery import rdma_devices
from tandem.checkpoint_engine.transport.tcp import TcpTransport

HAS_RDMA = bool(rdma_devices())


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
