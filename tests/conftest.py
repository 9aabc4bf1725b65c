"""Session-wide fixtures shared by every test folder: a real etcd server and free ports.

Heavier shared fixtures live beside their users (tests/operator/conftest.py starts the Kubernetes
control plane; tests/checkpoint_engine/conftest.py shares one vLLM engine per session).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tandem.checkpoint_engine.local_etcd import EtcdNotFound, LocalEtcd, free_port

__all__ = ["EtcdServer", "free_port"]


class EtcdServer(LocalEtcd):
    """The session's etcd; `stop()`/`start()` restart it on the same port and data."""


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    """A real etcd (Debian's etcd-server) on a free loopback port, private data dir."""
    tmp = Path(tempfile.mkdtemp(prefix="tandem-etcd-"))
    try:
        server = EtcdServer(tmp / "data")
    except EtcdNotFound as e:
        pytest.skip(str(e))
    server.start()
    os.environ.setdefault("TANDEM_TEST_ETCD", server.endpoint)
    yield server
    server.stop()
    shutil.rmtree(tmp, ignore_errors=True)
