"""`checkpointEngine.transport: auto` falls back to TCP, saying why, wherever RDMA cannot work; `rdma`
refuses for the same reasons. A node's sysfs lists its HCAs in every container, so a listed device
is not enough: its verbs node must be mounted (/dev/infiniband/uverbsN) and Mooncake's engine (the
real one installed here) must start on it. The sysfs and /dev trees are built in tmp_path.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tandem.checkpoint_engine.etcd.local_etcd import LocalEtcd
from tandem.checkpoint_engine.transport import RdmaUnavailable, make_transport
from tandem.checkpoint_engine.transport.tcp import TcpTransport
from tandem.checkpoint_engine.transport.transport_choice import mounted


def node(tmp_path: Path, *, devices: tuple[str, ...] = ("mlx5_0",), mount: bool = False) -> tuple[Path, Path]:
    sysfs, dev = tmp_path / "sys", tmp_path / "dev"
    dev.mkdir()
    for i, name in enumerate(devices):
        (sysfs / name / "device" / "infiniband_verbs" / f"uverbs{i}").mkdir(parents=True)
        if mount:
            (dev / f"uverbs{i}").touch()
    sysfs.mkdir(exist_ok=True)
    return sysfs, dev


def test_listed_but_not_mounted_falls_back_to_tcp_saying_why(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sysfs, dev = node(tmp_path, devices=("mlx5_0", "mlx5_1"))
    assert mounted(["mlx5_0", "mlx5_1"], sysfs, dev) == []
    with caplog.at_level(logging.INFO, logger="tandem.checkpoint_engine.transport.transport_choice"):
        transport = make_transport("auto", host="127.0.0.1", metadata="127.0.0.1:2379", sysfs=sysfs, dev=dev)
    assert isinstance(transport, TcpTransport)
    [record] = [r for r in caplog.records if "using TCP" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "mlx5_0, mlx5_1" in record.getMessage() and "does not mount" in record.getMessage()
    with pytest.raises(RdmaUnavailable, match="does not mount"):
        make_transport("rdma", host="127.0.0.1", metadata="127.0.0.1:2379", sysfs=sysfs, dev=dev)


def test_no_device_is_tcp_with_an_info_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sysfs, dev = node(tmp_path, devices=())
    with caplog.at_level(logging.INFO, logger="tandem.checkpoint_engine.transport.transport_choice"):
        assert make_transport("auto", host="127.0.0.1", metadata="127.0.0.1:2379", sysfs=sysfs, dev=dev).name == "tcp"
    assert any(r.levelno == logging.INFO and "has no RDMA device" in r.getMessage() for r in caplog.records)
    with pytest.raises(RdmaUnavailable, match="no RDMA device"):
        make_transport("rdma", host="127.0.0.1", metadata="127.0.0.1:2379", sysfs=sysfs, dev=dev)


@pytest.mark.etcd
def test_mounted_device_whose_engine_cannot_start_falls_back(tmp_path: Path, etcd_server: LocalEtcd,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """Listed and mounted, but no such HCA behind it: Mooncake's real engine fails to start on it."""
    from tandem.checkpoint_engine.transport.rdma import mooncake_available

    if not mooncake_available():
        pytest.skip("the Mooncake transfer engine is not importable here (pip mooncake-transfer-engine-non-cuda)")
    sysfs, dev = node(tmp_path, devices=("mlx5_9",), mount=True)
    assert mounted(["mlx5_9"], sysfs, dev) == ["mlx5_9"]
    with caplog.at_level(logging.INFO, logger="tandem.checkpoint_engine.transport.transport_choice"):
        transport = make_transport("auto", host="127.0.0.1", metadata=etcd_server.endpoint, sysfs=sysfs, dev=dev)
    assert isinstance(transport, TcpTransport)
    assert any("RDMA engine did not start on mlx5_9" in r.getMessage() for r in caplog.records), caplog.text
    with pytest.raises(RdmaUnavailable):
        make_transport("rdma", host="127.0.0.1", metadata=etcd_server.endpoint, sysfs=sysfs, dev=dev)
