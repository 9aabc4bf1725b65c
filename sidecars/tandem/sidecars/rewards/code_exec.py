"""The codeExec reward: the completion's last fenced Python block run against the dataset's tests in the
code sandbox (`tandem.sidecars.sandbox`), scored by the fraction that pass.

Callers: `rewards.combine` (the `codeExec` reward), tests and benchmarks.
"""

from __future__ import annotations

import re

from tandem.sidecars.sandbox.runner import run_tests
from tandem.sidecars.sandbox.types import SandboxLimits

_FENCED = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_OPEN_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n", re.IGNORECASE)

def extract_code(completion: str) -> str:
    """The last fenced ```python (or bare ```) block of a completion; the rest after an unclosed last
    fence (a completion cut at the token limit); else the whole text."""
    blocks = _FENCED.findall(completion)
    if blocks:
        return str(blocks[-1])
    opening = list(_OPEN_FENCE.finditer(completion))
    return completion[opening[-1].end():] if opening else completion


def code_exec_reward(completion: str, tests: object, timeout_seconds: float = 5.0) -> float:
    """Pass fraction of the completion's code (see `extract_code`) against `tests` (a dataset answer field)."""
    return run_tests(extract_code(completion), tests, SandboxLimits(timeout_seconds=timeout_seconds)).score
