"""Format checker: does a completion have the required structure? (1.0 or 0.0)

Role: the `format` rule-based reward, driven by the spec's `Reward.pattern`. Callers:
`rewards.combine`.

Semantics: `re.fullmatch(pattern, completion.strip(), re.DOTALL)` — the WHOLE completion (without
surrounding whitespace) must match, and `.` also matches newlines. Fullmatch rather than search,
so that a pattern states the structure of the completion, not just a fragment that may appear
anywhere; write `.*X.*` for "contains X". Patterns are compiled once and cached.
"""

from __future__ import annotations

import functools
import re


@functools.lru_cache(maxsize=64)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.DOTALL)


def format_match(completion: str, pattern: str) -> float:
    """1.0 when the stripped completion fully matches `pattern` (DOTALL), else 0.0."""
    return 1.0 if _compiled(pattern).fullmatch(completion.strip()) else 0.0


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """The compiled pattern (raises re.error for an invalid one, like the spec validator)."""
    return _compiled(pattern)
