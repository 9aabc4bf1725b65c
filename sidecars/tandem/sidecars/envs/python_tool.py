"""The built-in `python` tool: the model's program runs in the code sandbox and what it printed comes back.

Role: `make_python_tool(...)` makes the function `python(code)` that `tools.Tool.of` turns into the tool
schema named "python" (its docstring is the description the model reads: a fresh interpreter per call,
the standard library only, no network, the time limit). Each call runs the program with
`sandbox.program.run_program`, in the sandbox and isolation mode of the `codeExec` reward (in a pod,
the pod's sandbox server), and answers with its stdout and stderr as the program wrote them (the
traceback's last lines when it raised; the first and last characters of longer output), or with an
error line when it timed out or was killed. A sandbox that cannot start raises `SandboxError`, which
`tools.ToolBox` turns into an error message for the model. Caller: `envs.factory` (the built-in tools of
rollout.environment), tests.
"""

from __future__ import annotations

from collections.abc import Callable

from tandem.sidecars.sandbox.program import max_output_chars_for, run_program
from tandem.sidecars.sandbox.runner import ExecResult, Isolation, SandboxLimits

NO_OUTPUT = "(no output: print what you want to see)"
DESCRIPTION = """Runs a Python program in a sandbox and returns what it printed (stdout and stderr).

    Each call starts a fresh Python 3 interpreter: nothing is kept between calls, so the program must
    define and import everything it uses, and print the results you want to see. Only the standard
    library is available, there is no network, and files can be written only in the working directory.
    The program is stopped after {timeout:g} seconds. When it raises, the output ends with the traceback.

    Args:
        code: The complete Python program to run, e.g. "print(sum(range(10)))".
    """


def answer(result: ExecResult, timeout_seconds: float) -> str:
    """The tool's reply for one run: the output, or an error line after it when the run did not finish."""
    output = result.output
    if result.status == "ok":
        return output or NO_OUTPUT
    if result.status == "error":  # the traceback ends the output; a bare exit with a failure status prints nothing
        return output or "error: the program exited with a failure status and printed nothing"
    if result.status == "timeout":
        problem = f"timed out after {timeout_seconds:g} s"
    elif result.status == "killed":
        problem = f"the program was killed or exited abruptly ({result.detail}); its output is lost"
    else:
        problem = "the program wrote more than the sandbox reads back"
    separator = "\n" if output and not output.endswith("\n") else ""
    return f"{output}{separator}error: {problem}"


def make_python_tool(timeout_seconds: float = 5.0, max_output_chars: int = 2000,
                     isolation: Isolation | None = None) -> Callable[[str], str]:
    """The `python` tool: programs get `timeout_seconds` of wall clock (and the sandbox's other default
    limits), replies at most `max_output_chars` characters (keep it within the ToolBox's own cap, whose
    default is 2000, so that a traceback at the end is never cut). `isolation`: the sandbox's mode
    (default: this process's, `sandbox.isolation_mode()`)."""
    limits = SandboxLimits(timeout_seconds=timeout_seconds)
    if not 1 <= max_output_chars <= max_output_chars_for(limits):
        raise ValueError(f"max_output_chars must be 1 to {max_output_chars_for(limits)}, not {max_output_chars}")

    def python(code: str) -> str:
        return answer(run_program(code, limits, max_output_chars, isolation), timeout_seconds)

    python.__doc__ = DESCRIPTION.format(timeout=timeout_seconds)
    return python
