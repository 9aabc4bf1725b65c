"""Fixtures of the broadcast tests: etcd once it serves, a private /dev/shm dir, a `Pods` harness.

Callers: test_broadcast.py, test_netns.py (which builds its own namespaced `Pods`).
"""

from __future__ import annotations

import secrets
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from broadcast_pods import Pods, wait_etcd_ready  # noqa: E402


@pytest.fixture
def shm_base() -> Iterator[Path]:
    base = Path("/dev/shm") / f"tandem-bc-{secrets.token_hex(4)}"
    base.mkdir()
    yield base
    shutil.rmtree(base, ignore_errors=True)


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
