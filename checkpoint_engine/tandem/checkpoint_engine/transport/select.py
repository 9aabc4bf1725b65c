"""The one place that turns `checkpointEngine.transport` (auto|rdma|tcp) into a Transport, and
RDMA device discovery that never crashes (an empty list means "no RDMA here, use TCP").

Callers: node.py (`BroadcastNode`), bench/broadcast.py. `auto` picks RDMA when `rdma_devices`
finds a device, else TCP; `rdma` without a device raises RdmaUnavailable (typed, never a crash,
never a silent fallback — the Mooncake engine itself would silently use TCP). Discovery order:
sysfs (/sys/class/infiniband absent or empty → none), then pyverbs when importable (Debian's
python3-pyverbs raises PyverbsRDMAError from get_device_list when there is no device: caught).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

from tandem.checkpoint_engine.transport.base import RdmaUnavailable, Transport
from tandem.checkpoint_engine.transport.tcp import TcpTransport

Kind = Literal["auto", "rdma", "tcp"]
log = logging.getLogger(__name__)

SYSFS = Path("/sys/class/infiniband")


def rdma_devices(sysfs: Path = SYSFS) -> list[str]:
    """Names of the RDMA devices the kernel exposes (e.g. ["mlx5_0"]); [] when there are none."""
    try:
        names = sorted(p.name for p in sysfs.iterdir()) if sysfs.is_dir() else []
    except OSError as e:
        log.info("cannot list %s: %s", sysfs, e)
        names = []
    if not names:
        return []
    try:
        import pyverbs.device as d  # type: ignore[import-not-found]
    except ImportError:
        return names  # sysfs is enough to say a device exists
    try:
        found = [dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name) for dev in d.get_device_list()]
    except Exception as e:  # PyverbsRDMAError (no device / no kernel support) and friends
        log.info("pyverbs found no usable RDMA device: %s", e)
        return []
    return sorted(found)


def make_transport(kind: str, *, host: str, metadata: str) -> Transport:
    """`host`: the address peers reach this pod on; `metadata`: the etcd endpoint (host:port or
    http://host:port) the RDMA engine publishes its memory segments in."""
    if kind == "tcp":
        return TcpTransport()
    if kind not in ("auto", "rdma"):
        raise ValueError(f"unknown transport {kind!r}: expected auto, rdma or tcp")
    devices = rdma_devices()
    if not devices:
        if kind == "rdma":
            raise RdmaUnavailable("transport 'rdma' was asked for but this machine has no RDMA device")
        return TcpTransport()
    from tandem.checkpoint_engine.transport.rdma import RdmaTransport, mooncake_available

    if not mooncake_available():
        if kind == "rdma":
            raise RdmaUnavailable(
                "transport 'rdma': RDMA devices found but the Mooncake transfer engine is not importable"
            )
        return TcpTransport()
    return RdmaTransport(host=host, metadata=metadata, protocol="rdma", device=",".join(devices))
