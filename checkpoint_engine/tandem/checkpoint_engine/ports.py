"""Free TCP ports for processes that bind them later: chosen below the kernel's ephemeral range.

Role: `tandem run` and the tests pick ports for servers that other processes start seconds later
(sidecar APIs, torch rendezvous, etcd, the control plane). A port from the ephemeral range — what
binding port 0 returns — can be taken in that window by any process that binds port 0 or opens an
outgoing connection, and vLLM's workers and every HTTP client do so constantly: measured in CI as
"[Errno 98] address already in use" on a trainer API port. Below the range only explicit binds
land, so a port that binds now stays free unless someone chooses it on purpose. Ports are not
handed out twice by one process. Callers: `local_etcd` (re-exported as `free_port`), the trainer's
rendezvous, `tandem.cli.local`, the transports' tests, tests/operator/controlplane.py.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

LOWEST = 10_000
_handed: set[int] = set()
_lock = threading.Lock()


def ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32_768, 60_999  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))  # noqa: S104 - the servers bind every interface
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port nobody listens on now, outside the ephemeral range when there is room below it."""
    low, _ = ephemeral_range()
    rng = random.SystemRandom()
    with _lock:
        if low - LOWEST > 1000:
            for _ in range(500):
                port = rng.randint(LOWEST, low - 1)
                if port not in _handed and _bindable(port):
                    _handed.add(port)
                    return port
        with socket.socket() as s:  # no room below the range: the kernel's choice
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        _handed.add(port)
        return port
