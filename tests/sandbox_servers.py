"""Real processes and sockets for the sandbox tests (tests/sandbox, tests/envs): a `sandbox_server` process,
and a TCP listener that counts the connections a sandboxed program manages to make (it should make none)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SANDBOX_UID = 10002


@contextmanager
def sandbox_server_process() -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    """(socket path, server process); the socket's directory is traversable by every user. As root the server
    starts as root and drops to uid 10002 itself, as `tandem run` does; otherwise it runs as this user."""
    sock_dir = Path(tempfile.mkdtemp(prefix="tandem-sandbox-sock-"))
    sock_dir.chmod(0o755)
    path = sock_dir / "sandbox.sock"
    log = open(sock_dir / "server.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "tandem.sidecars.sandbox.sandbox_server", "--socket", str(path),
                             "--user", str(SANDBOX_UID)], stdout=log, stderr=subprocess.STDOUT,
                            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                 "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        deadline = time.monotonic() + 60
        while not path.is_socket() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None and path.is_socket(), (sock_dir / "server.log").read_text()
        yield path, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(sock_dir, ignore_errors=True)


@contextmanager
def tcp_listener() -> Iterator[tuple[int, list[bool]]]:
    """(port on 127.0.0.1, one True per connection accepted)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    accepted: list[bool] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            accepted.append(True)
            conn.close()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1], accepted
    finally:
        stop.set()
        t.join()
        srv.close()
