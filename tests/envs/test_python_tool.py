"""The `python` tool on the real code sandbox: what a program prints comes back exactly, a traceback ends
a raising program's output, a loop times out and says so, sockets and writes outside the work dir are
refused (the error shows in the output), long output keeps its end; its schema; the ToolBox running it.

Each runs in every isolation mode available here, as tests/sandbox/test_sandbox.py does: "basic",
"namespaces" (root with unshare) and "server", through a real sandbox server process (as root it drops
to uid 10002 itself, as `tandem run` does).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from sandbox_servers import sandbox_server_process, tcp_listener
from tandem.sidecars.envs.python_tool import NO_OUTPUT, make_python_tool
from tandem.sidecars.envs.toolcalls import ToolCall
from tandem.sidecars.envs.tools import Tool, ToolBox
from tandem.sidecars.sandbox.confine import landlock_abi
from tandem.sidecars.sandbox.program import run_program
from tandem.sidecars.sandbox.runner import SOCKET_ENV, Isolation, SandboxLimits, isolation_mode, run_tests

MODES = ["basic", "server"] + (["namespaces"] if isolation_mode() == "namespaces" else [])

REFUSED = ("PermissionError: ", "OSError: ")  # a traceback's last line: seccomp's EPERM, the audit hooks


@pytest.fixture(scope="module")
def sandbox_server() -> Iterator[Path]:
    """A real `sandbox_server` process; its socket's directory is traversable by every user."""
    with sandbox_server_process() as (path, _):
        yield path


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> Iterator[Isolation]:
    if request.param != "server":
        yield cast(Isolation, request.param)
        return
    path = request.getfixturevalue("sandbox_server")
    os.environ[SOCKET_ENV] = str(path)  # what the pod env contract gives the rollout
    try:
        yield "server"
    finally:
        del os.environ[SOCKET_ENV]


def test_prints_come_back_exactly(mode: Isolation) -> None:
    python = make_python_tool(timeout_seconds=5.0, isolation=mode)
    code = ("import sys\nprint('first line')\nprint('  spaced\\tand tabbed  ')\nprint()\n"
            "print('unicode: é ✓ 😀 中文')\nprint('to stderr', file=sys.stderr)\nprint('last', end='')\n")
    assert python(code) == "first line\n  spaced\tand tabbed  \n\nunicode: é ✓ 😀 中文\nto stderr\nlast"
    assert python("x = 1") == NO_OUTPUT
    assert python("import sys\nprint('bye')\nsys.exit(0)") == "bye\n"
    assert python("import sys\nprint('bye')\nsys.exit('goodbye message')") == "bye\ngoodbye message\n"


def test_raising_program_ends_with_its_traceback(mode: Isolation) -> None:
    python = make_python_tool(timeout_seconds=5.0, isolation=mode)
    out = python("def half(x):\n    return x / 0\nprint('before')\nhalf(3)\n")
    lines = out.splitlines()
    assert lines[0] == "before" and lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "ZeroDivisionError: division by zero"
    assert '  File "<solution>", line 2, in half' in lines and "    return x / 0" in lines  # its own frames only
    assert "sandbox/harness.py" not in out
    assert python("def f(:\n").splitlines()[-1] == "SyntaxError: invalid syntax"


def test_infinite_loop_times_out(mode: Isolation) -> None:
    python = make_python_tool(timeout_seconds=1.0, isolation=mode)
    t0 = time.monotonic()
    out = python("print('started')\nwhile True:\n    pass\n")
    assert out.endswith("error: timed out after 1 s") and time.monotonic() - t0 < 6


def test_network_refused(mode: Isolation) -> None:
    with tcp_listener() as (port, accepted):
        python = make_python_tool(timeout_seconds=2.0, isolation=mode)
        out = python(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
                     "print('connected')\n")
        assert "connected" not in out.splitlines() and out.splitlines()[-1].startswith(REFUSED)
        time.sleep(0.3)
        assert accepted == []


def test_writes_outside_refused(mode: Isolation, tmp_path: Path) -> None:
    python = make_python_tool(timeout_seconds=2.0, isolation=mode)
    home_dir = Path.home() / ".cache" / "tandem"
    home_dir.mkdir(parents=True, exist_ok=True)
    for target in (tmp_path / "escaped.txt", home_dir / f"python-tool-escape-{mode}.txt",
                   Path("/tmp") / f"tandem-tool-escape-{mode}.txt"):
        target.unlink(missing_ok=True)
        out = python(f"open({str(target)!r}, 'w').write('pwned')\nprint('wrote')\n")
        if target.parent == Path("/tmp") and mode == "namespaces" and not landlock_abi():
            assert out == "wrote\n"  # allowed, but into a private tmpfs that vanishes
        else:
            # refused: by Landlock, the audit hooks or (namespaces) a private /tmp without the test's dir
            assert "wrote" not in out.splitlines() and out.splitlines()[-1].startswith(REFUSED + ("FileNotFoundError",))
        assert not target.exists()
    assert python("open('scratch.txt', 'w').write('fine')\nprint(open('scratch.txt').read())") == "fine\n"


def test_long_output_keeps_its_start_and_end(mode: Isolation) -> None:
    python = make_python_tool(timeout_seconds=5.0, max_output_chars=300, isolation=mode)
    out = python("for i in range(10000):\n    print(i)\nraise ValueError('the end')\n")
    assert len(out) <= 300 and out.startswith("0\n1\n2\n") and "characters cut" in out
    assert out.endswith("ValueError: the end\n")


def test_schema_named_python_with_a_code_string() -> None:
    tool = Tool.of(make_python_tool(timeout_seconds=3.0))
    fn = tool.schema["function"]
    assert tool.name == "python" and fn["name"] == "python"
    assert fn["parameters"]["required"] == ["code"] and list(fn["parameters"]["properties"]) == ["code"]
    assert fn["parameters"]["properties"]["code"]["type"] == "string"
    assert fn["description"].startswith("Runs a Python program in a sandbox and returns what it printed")
    assert "3 seconds" in fn["description"]


def test_toolbox_runs_it_and_reports_a_sandbox_that_cannot_start() -> None:
    box = ToolBox([make_python_tool(timeout_seconds=3.0)], timeout_seconds=15.0)
    try:
        r = box.run(ToolCall("python", {"code": "print(6 * 7)"}))
        assert (r.content, r.error) == ("42\n", False)
        r = box.run(ToolCall("python", {"code": "1 / 0"}))
        assert not r.error and r.content.endswith("ZeroDivisionError: division by zero\n")
    finally:
        box.close()
    assert SOCKET_ENV not in os.environ
    broken = ToolBox([make_python_tool(isolation="server")])  # no server named: the sandbox cannot start
    try:
        r = broken.run(ToolCall("python", {"code": "print(1)"}))
        assert r.error and r.content.startswith("error: python raised SandboxError") and SOCKET_ENV in r.content
    finally:
        broken.close()


def test_output_bound_and_scoring_unchanged() -> None:
    with pytest.raises(ValueError, match="max_output_chars"):
        make_python_tool(max_output_chars=1 << 20)
    with pytest.raises(ValueError, match="max_output_chars"):
        run_program("print(1)", SandboxLimits(read_bytes=8192), max_output_chars=1000)
    r = run_tests("print('not captured')\nx = 1", ["assert x == 1"], SandboxLimits(timeout_seconds=2.0))
    assert (r.passed, r.total, r.status, r.output) == (1, 1, "ok", "")
