"""The one place that turns `checkpointEngine.transport` (auto|rdma|tcp) into a Transport.

Callers: node.py (`BroadcastNode`), bench/broadcast.py. `auto` picks RDMA when discovery.py
finds a device, else TCP; `rdma` without a device raises RdmaUnavailable (typed, never a crash,
never a silent fallback — the Mooncake engine itself would silently use TCP).
"""

from __future__ import annotations

from typing import Literal

from tandem.checkpoint_engine.transport.base import RdmaUnavailable, Transport
from tandem.checkpoint_engine.transport.discovery import rdma_devices
from tandem.checkpoint_engine.transport.tcp import TcpTransport

Kind = Literal["auto", "rdma", "tcp"]


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
