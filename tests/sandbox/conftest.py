"""Fixtures of the code sandbox's tests: a real sandbox server process (`tandem.sidecars.sandbox.sandbox_server`).

As root (these machines) the server starts as root and drops to uid 10002 itself, as `tandem run`
does; otherwise it runs as the current user.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_servers import sandbox_server_process


@pytest.fixture(scope="module")
def sandbox_server() -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    """(socket path, server process); the socket's directory is traversable by every user."""
    with sandbox_server_process() as server:
        yield server
