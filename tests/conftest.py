"""Session-wide fixtures shared by every test folder: a real etcd server and free ports.

Heavier shared fixtures live beside their users (tests/operator/conftest.py starts the Kubernetes
control plane; tests/checkpoint_engine/conftest.py shares one vLLM engine per session).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class EtcdServer:
    endpoint: str
    host: str
    port: int
    data_dir: Path
    binary: str
    proc: subprocess.Popen[bytes]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def start(self) -> None:
        """(Re)start on the same port and data dir; waits until it answers."""
        self.stop()
        self.proc = _spawn_etcd(self.binary, self.data_dir, self.port)
        _wait_port(self.host, self.port)


def _spawn_etcd(binary: str, data_dir: Path, port: int) -> subprocess.Popen[bytes]:
    peer = free_port()
    log = open(data_dir.parent / f"etcd-{port}.log", "ab")  # noqa: SIM115 - lives with the process
    return subprocess.Popen(
        [binary, "--data-dir", str(data_dir), "--name", "tandem-test",
         "--listen-client-urls", f"http://127.0.0.1:{port}", "--advertise-client-urls", f"http://127.0.0.1:{port}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"tandem-test=http://127.0.0.1:{peer}"],
        stdout=log, stderr=subprocess.STDOUT,
    )


def _wait_port(host: str, port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"etcd did not listen on {host}:{port} within {timeout}s")


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    """A real etcd (Debian's etcd-server) on a free loopback port, private data dir."""
    binary = shutil.which("etcd")
    if binary is None:
        pytest.skip("etcd binary not installed (scripts/setup.sh installs Debian's etcd-server)")
    tmp = Path(tempfile.mkdtemp(prefix="tandem-etcd-"))
    port = free_port()
    server = EtcdServer(f"http://127.0.0.1:{port}", "127.0.0.1", port, tmp / "data", binary,
                        _spawn_etcd(binary, tmp / "data", port))
    _wait_port("127.0.0.1", port)
    os.environ.setdefault("TANDEM_TEST_ETCD", server.endpoint)
    yield server
    server.stop()
    shutil.rmtree(tmp, ignore_errors=True)
