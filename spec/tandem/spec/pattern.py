"""The one dialect of a `format` reward's pattern: RE2.

Role: a pattern means the same to the API server, to `tandem validate` and to the reward that matches it.
The API server checks it with CEL's `matches` (Go's regexp package, RE2 syntax): `CEL_RULE` on the
`pattern` field of the CRD fails its evaluation, and so refuses the job naming spec.rewards[i].pattern,
when the pattern does not compile. `tandem validate` (the spec's validator) and the reward
(`tandem.sidecars.rewards.format`) compile it with the RE2 library itself (google-re2), through
`compile_re2`. So Python's own `re` extensions that RE2 lacks (backreferences such as `(a)\\1`,
lookahead `(?=x)`, lookbehind `(?<=x)`) are refused everywhere, rather than accepted by one side and
refused by the other. RE2 matches in time linear in the completion's length: no pattern can hang the reward.

The two implementations differ in a few corners. `\\C` (any single byte) is the RE2 library's and not Go's:
`compile_re2` refuses it too. Left: a nesting deeper than 1000 groups (Go refuses it) and a Unicode script
newer than Go's tables (`\\p{Nag_Mundari}`) pass `tandem validate` and not the API server.

No ratcheting: the API server does not excuse a rule's evaluation error on an unchanged value (and a rule
under `rewards`, a plain list, has no `oldSelf`), so a job stored before this rule with a pattern RE2
refuses takes no update, a finalizer's removal included, until its pattern is changed to one RE2 compiles.
Callers: `tandem.spec.rewards.Reward` (validation, CRD), `tandem.sidecars.rewards.format` (matching).
"""

from __future__ import annotations

from typing import Any

import re2

# On the CRD's `pattern` string (a null pattern is not evaluated). `matches` compiles `self` as a regular
# expression and its evaluation fails when that does not compile; the conditional passes that failure on
# (an `||` would not: CEL's `error || true` is true). The API server then answers
# "spec.rewards[i].pattern: Invalid value: "string": error parsing regexp: <why> evaluating rule: <MESSAGE>".
CEL_RULE = '"".matches(self) ? true : true'
MESSAGE = "not a valid RE2 regular expression"


def _options() -> Any:
    options = re2.Options()
    options.dot_nl = True  # `.` also matches a newline (a completion has many)
    options.log_errors = False  # the error is raised, not also logged to stderr
    return options


def _any_byte_escape(pattern: str) -> bool:
    """`pattern` has a `\\C` outside a literal `\\Q...\\E` span."""
    i = 0
    while i < len(pattern):
        if pattern.startswith("\\Q", i):
            end = pattern.find("\\E", i + 2)
            if end < 0:
                return False
            i = end + 2
        elif pattern[i] == "\\":
            if pattern[i + 1:i + 2] == "C":
                return True
            i += 2
        else:
            i += 1
    return False


def compile_re2(pattern: str) -> Any:
    """`pattern` compiled by RE2, `.` matching newlines too; ValueError with RE2's reason when it does not compile."""
    if _any_byte_escape(pattern):
        raise ValueError("invalid escape sequence: \\C (any byte: the RE2 library has it, the API server's Go "
                         "regexp does not)")
    try:
        return re2.compile(pattern, _options())
    except re2.error as e:
        reason = e.args[0] if e.args else e
        raise ValueError(reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)) from None
