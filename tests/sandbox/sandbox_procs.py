"""Process helpers of the sandbox tests: whose a process is, and waiting for a condition (never a fixed sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

SANDBOX_UID = 10002


def uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for pid {pid}")


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def uid_or_none(pid: int) -> int | None:
    """`uid_of(pid)`, or None when the process is gone."""
    try:
        return uid_of(pid)
    except (OSError, AssertionError):
        return None
