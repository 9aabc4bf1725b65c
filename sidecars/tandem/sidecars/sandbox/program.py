"""Run a program in the code sandbox and get back what it printed (stdout and stderr), not a score.

Role: the same sandbox as the `codeExec` reward (`runner.py`: the isolation mode of this process,
the same limits, confinement and deadline), with a plan of no tests and the harness's `capture` on: once
the program ends (normally, by an exception or SystemExit) the harness reads its output file, adds the
traceback the interpreter would print, keeps at most `max_output_chars` characters (the first and the
last, with a note of the cut between them) and reports them on the result channel as one hex line; in
"server" mode the server's JSON reply carries them. A program past its time limit, or killed, comes back
with status "timeout" or "killed" and no output. Caller: `tandem.sidecars.envs.python_tool` (the
rollout's `python` tool).
"""

from __future__ import annotations

from tandem.sidecars.sandbox.code_tests import TestPlan
from tandem.sidecars.sandbox.runner import ExecResult, Isolation, SandboxLimits, run_tests

# The most bytes one character of output takes on its way back: 8 as the hex of its UTF-8 on the result
# channel, 12 in the server's JSON reply (a character outside the BMP as two \u escapes); both are read
# under SandboxLimits.read_bytes, with REPLY_ROOM for the rest of the reply.
BYTES_PER_CHAR = 12
REPLY_ROOM = 4096


def max_output_chars_for(limits: SandboxLimits) -> int:
    """The most characters of output that can come back under `limits.read_bytes`."""
    return (limits.read_bytes - REPLY_ROOM) // BYTES_PER_CHAR


def run_program(code: str, limits: SandboxLimits | None = None, max_output_chars: int = 4000,
                isolation: Isolation | None = None) -> ExecResult:
    """Run `code` in the sandbox; `ExecResult.output` is what it printed, at most `max_output_chars`
    characters. Status: "ok" (it ran to the end, or exited with status 0), "error" (it raised, or exited
    with another status: the traceback or message ends the output), "timeout", "killed" or
    "output_limit". Raises `SandboxError` when the sandbox cannot start, ValueError when
    `max_output_chars` could not come back under `limits.read_bytes`."""
    lim = limits or SandboxLimits()
    if not 1 <= max_output_chars <= max_output_chars_for(lim):
        raise ValueError(f"max_output_chars must be 1 to {max_output_chars_for(lim)} (read_bytes "
                         f"{lim.read_bytes}), not {max_output_chars}")
    return run_tests(code, TestPlan(), lim, isolation, capture=max_output_chars)
