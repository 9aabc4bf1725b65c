"""Fixtures of the broadcast tests: a private /dev/shm base dir, and a `Pods` harness on loopback.

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
from broadcast_pods import Pods  # noqa: E402


@pytest.fixture
def shm_base() -> Iterator[Path]:
    base = Path("/dev/shm") / f"tandem-bc-{secrets.token_hex(4)}"
    base.mkdir()
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def pods(etcd_server: Any, shm_base: Path) -> Iterator[Pods]:
    p = Pods(etcd_server.endpoint, shm_base)
    yield p
    p.close()
