"""Format checker: does a completion have the required structure? (1.0 or 0.0)

Role: the `format` rule-based reward, driven by the spec's `Reward.pattern`. Callers:
`rewards.combine` (which compiles each pattern once, at `RewardSet` creation, so a bad one fails the
job's start naming its field rather than every sample).

Semantics: the WHOLE completion (without surrounding whitespace) must match, and `.` also matches
newlines (`fullmatch` with DOTALL). Fullmatch rather than search, so that a pattern states the
structure of the completion, not just a fragment that may appear anywhere; write `.*X.*` for
"contains X". Patterns are compiled once and cached.

Time limit: the pattern is the user's and the completion the policy's, and a backtracking engine can
spend exponential time on a pattern like `(a|aa)+$` against a long run of a's. Matching therefore
uses the `regex` module (re's syntax, its VERSION0 default) with its `timeout`: a match that runs
past `MATCH_TIMEOUT_SECONDS` scores 0.0, as a completion that does not match. The module checks its
clock between backtracking steps, so a match stops within a small multiple of the limit (measured:
~2x, 1 s asked, 2.1 s taken on `(a|aa)+$`). It also recognises many nested quantifiers
(`(a+)+$`) and fails them at once.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import regex

log = logging.getLogger(__name__)
MATCH_TIMEOUT_SECONDS = 0.5


class PatternError(ValueError):
    """A format pattern that does not compile; the message names the field."""


@functools.lru_cache(maxsize=64)
def _compiled(pattern: str) -> Any:
    try:
        return regex.compile(pattern, regex.DOTALL)
    except (regex.error, TypeError, ValueError) as e:
        raise PatternError(f"pattern {pattern!r}: not a valid regular expression: {e}") from None


def compile_pattern(pattern: str, field: str = "pattern") -> Any:
    """The compiled pattern; PatternError naming `field` (e.g. spec.rewards[1].pattern) when invalid."""
    try:
        return _compiled(pattern)
    except PatternError as e:
        raise PatternError(f"{field}: {e}") from None


def format_match(completion: str, pattern: str, timeout: float = MATCH_TIMEOUT_SECONDS) -> float:
    """1.0 when the stripped completion fully matches `pattern` (DOTALL) within `timeout` seconds, else 0.0."""
    try:
        return 1.0 if _compiled(pattern).fullmatch(completion.strip(), timeout=timeout) else 0.0
    except TimeoutError:
        log.warning("format pattern %r: no answer within %gs on a %d-character completion: scored 0",
                    pattern, timeout, len(completion))
        return 0.0
