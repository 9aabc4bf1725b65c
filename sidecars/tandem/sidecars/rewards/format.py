"""Format checker: does a completion have the required structure? (1.0 or 0.0)

Role: the `format` rule-based reward, driven by the spec's `Reward.pattern`. Callers:
`rewards.combine` (which compiles each pattern once, at `RewardSet` creation, so a bad one fails the
job's start naming its field rather than every sample).

Semantics: the WHOLE completion (without surrounding whitespace) must match, and `.` also matches
newlines (`fullmatch`, RE2's dot_nl). Fullmatch rather than search, so that a pattern states the
structure of the completion, not just a fragment that may appear anywhere; write `.*X.*` for
"contains X". Patterns are compiled once and cached.

Dialect: RE2 (`tandem.spec.pattern.compile_re2`, the google-re2 library), the dialect the API server
checks the pattern in (CEL's `matches`, Go's regexp) and `tandem validate` compiles it in: a pattern the
job was admitted with compiles here, and means the same (`\\d` is an ASCII digit, as in Go; no
backreferences or look-around, which no side accepts).

Time: the pattern is the user's and the completion the policy's. RE2 matches in time linear in the
completion's length, with no backtracking, so no pattern can hang the reward: `(a|aa)+$` or `(a+)+$`
against a long run of a's takes as long as any other pattern of its size.
"""

from __future__ import annotations

import functools
from typing import Any

from tandem.spec.pattern import compile_re2


class PatternError(ValueError):
    """A format pattern that does not compile; the message names the field."""


@functools.lru_cache(maxsize=64)
def _compiled(pattern: str) -> Any:
    try:
        return compile_re2(pattern)
    except (TypeError, ValueError) as e:
        raise PatternError(f"pattern {pattern!r}: not a valid RE2 regular expression: {e}") from None


def compile_pattern(pattern: str, field: str = "pattern") -> Any:
    """The compiled pattern; PatternError naming `field` (e.g. spec.rewards[1].pattern) when invalid."""
    try:
        return _compiled(pattern)
    except PatternError as e:
        raise PatternError(f"{field}: {e}") from None


def format_match(completion: str, pattern: str) -> float:
    """1.0 when the stripped completion fully matches `pattern` (RE2, `.` matching newlines), else 0.0."""
    return 1.0 if _compiled(pattern).fullmatch(completion.strip()) else 0.0
