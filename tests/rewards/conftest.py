"""Fixtures of the reward tests: a real sandbox server process (`tandem.sidecars.rewards.sandbox_server`).

As root (these machines) the server starts as root and drops to uid 10002 itself, as `tandem run`
does; otherwise it runs as the current user.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_procs import SANDBOX_UID, wait_for


@pytest.fixture(scope="module")
def sandbox_server() -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    """(socket path, server process); the socket's directory is traversable by every user."""
    sock_dir = Path(tempfile.mkdtemp(prefix="tandem-sandbox-sock-"))
    sock_dir.chmod(0o755)
    path = sock_dir / "sandbox.sock"
    log = open(sock_dir / "server.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "tandem.sidecars.rewards.sandbox_server", "--socket", str(path),
                             "--user", str(SANDBOX_UID)], stdout=log, stderr=subprocess.STDOUT,
                            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                 "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        wait_for(lambda: path.is_socket() or proc.poll() is not None, 60, "the sandbox server's socket")
        assert proc.poll() is None, (sock_dir / "server.log").read_text()
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
