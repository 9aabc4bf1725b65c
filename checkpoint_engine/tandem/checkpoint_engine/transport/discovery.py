"""RDMA device discovery that never crashes: an empty list means "no RDMA here, use TCP".

Caller: select.py (`auto` picks RDMA only when a device is found). Order: sysfs
(/sys/class/infiniband absent or empty → none), then pyverbs when importable (Debian's
python3-pyverbs raises PyverbsRDMAError from get_device_list when there is no device: caught).
"""

from __future__ import annotations

import logging
from pathlib import Path

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
        found = [
            dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name) for dev in d.get_device_list()
        ]
    except Exception as e:  # PyverbsRDMAError (no device / no kernel support) and friends
        log.info("pyverbs found no usable RDMA device: %s", e)
        return []
    return sorted(found)
