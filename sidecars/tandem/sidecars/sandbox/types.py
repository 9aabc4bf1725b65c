"""The code sandbox's limits, results and errors.

Role: the values `runner.py` (which re-exports them: import them from there) takes and returns,
kept apart so that the modules beside it (`program.py`, `sandbox_server.py`) share them without a cycle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Isolation = Literal["server", "namespaces", "basic"]


@dataclass(frozen=True)
class SandboxLimits:
    timeout_seconds: float = 5.0  # wall clock for the program and its tests
    memory_bytes: int = 1 << 30  # RLIMIT_AS
    file_bytes: int = 1 << 20  # RLIMIT_FSIZE: program output and any file it writes
    processes: int = 32  # RLIMIT_NPROC of the sandbox uid
    open_files: int = 64
    read_bytes: int = 1 << 20  # the most the parent reads back from the result channel
    tmpfs_bytes: int = 16 << 20  # size of each private tmpfs (namespaces mode)

    @property
    def cpu_seconds(self) -> int:
        return math.ceil(self.timeout_seconds) + 1


@dataclass(frozen=True)
class ExecResult:
    passed: int
    total: int
    status: Literal["ok", "error", "timeout", "killed", "output_limit"]
    seconds: float
    isolation: Isolation
    detail: str = ""
    output: str = ""  # what the program printed: runs that capture it only (`program.run_program`)

    @property
    def score(self) -> float:
        if self.total == 0:
            return 1.0 if self.status == "ok" else 0.0
        return self.passed / self.total


class SandboxError(RuntimeError):
    """The sandbox itself could not start (not a failure of the program)."""
