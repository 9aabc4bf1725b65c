"""The one place that turns `checkpointEngine.transport` (auto|rdma|tcp) into a Transport, and
RDMA device discovery that never crashes (an empty list means "no RDMA here, use TCP").

Callers: node.py (`BroadcastNode`), bench/broadcast.py. `auto` picks RDMA when a device is usable
here — listed by the kernel, its verbs node (/dev/infiniband/uverbsN) mounted in this container,
Mooncake importable, its engine started — and otherwise uses TCP with a log line saying why; `rdma`
raises RdmaUnavailable for the same reasons (typed, never a crash, never a silent fallback — the
Mooncake engine itself would silently use TCP). Discovery order: sysfs (/sys/class/infiniband absent
or empty → none), then pyverbs when importable (Debian's python3-pyverbs raises PyverbsRDMAError from
get_device_list when there is no device: caught). A node's sysfs lists its HCAs in every container,
mounted or not: only /dev/infiniband (the RDMA device plugin, or a hostPath) makes them usable.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

from tandem.checkpoint_engine.transport.tcp import TcpTransport
from tandem.checkpoint_engine.transport.transport_interface import RdmaUnavailable, Transport

Kind = Literal["auto", "rdma", "tcp"]
log = logging.getLogger(__name__)

SYSFS = Path("/sys/class/infiniband")
DEV = Path("/dev/infiniband")


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


def mounted(devices: list[str], sysfs: Path = SYSFS, dev: Path = DEV) -> list[str]:
    """The devices whose verbs node (sysfs <dev>/device/infiniband_verbs/uverbsN) exists under `dev`."""
    usable = []
    for name in devices:
        try:
            nodes = [p.name for p in (sysfs / name / "device" / "infiniband_verbs").iterdir()]
        except OSError:
            nodes = []
        if any((dev / n).exists() for n in nodes):
            usable.append(name)
    return usable


def rdma_problem(sysfs: Path = SYSFS, dev: Path = DEV) -> tuple[list[str], str | None]:
    """(usable devices, None) or ([], why RDMA cannot be used here)."""
    devices = rdma_devices(sysfs)
    if not devices:
        return [], f"this machine has no RDMA device ({sysfs} lists none)"
    usable = mounted(devices, sysfs, dev)
    if not usable:
        return [], (f"RDMA device(s) {', '.join(devices)} are listed in {sysfs} but none has its verbs node in "
                    f"{dev}: the container does not mount it (an RDMA device plugin resource, or a hostPath "
                    "/dev/infiniband, provides it)")
    from tandem.checkpoint_engine.transport.rdma import mooncake_available

    if not mooncake_available():
        return [], (f"RDMA device(s) {', '.join(usable)} found but the Mooncake transfer engine is not "
                    "importable (mooncake-transfer-engine-cuda13 / -non-cuda, libibverbs1)")
    return usable, None


def make_transport(kind: str, *, host: str, metadata: str, sysfs: Path = SYSFS, dev: Path = DEV) -> Transport:
    """`host`: the address peers reach this pod on; `metadata`: the etcd endpoint (host:port or
    http://host:port) the RDMA engine publishes its memory segments in."""
    if kind == "tcp":
        return TcpTransport()
    if kind not in ("auto", "rdma"):
        raise ValueError(f"unknown transport {kind!r}: expected auto, rdma or tcp")
    usable, problem = rdma_problem(sysfs, dev)
    if problem is not None:
        if kind == "rdma":
            raise RdmaUnavailable(f"transport 'rdma' was asked for but {problem}")
        (log.info if not rdma_devices(sysfs) else log.warning)("transport auto: using TCP because %s", problem)
        return TcpTransport()
    from tandem.checkpoint_engine.transport.rdma import RdmaTransport

    try:
        return RdmaTransport(host=host, metadata=metadata, protocol="rdma", device=",".join(usable))
    except RdmaUnavailable as e:
        if kind == "rdma":
            raise
        log.warning("transport auto: using TCP because the RDMA engine did not start on %s: %s",
                    ",".join(usable), e)
        return TcpTransport()
