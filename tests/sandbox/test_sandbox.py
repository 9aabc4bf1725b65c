"""Code executor: pass fractions, and escapes refused (network, writes, fork bomb, loops, output, memory).

Each escape runs in every isolation mode available here ("namespaces" needs root and unshare;
"server" goes through a real sandbox server process running as uid 10002, see conftest.py) and
must score 0 within a few seconds without touching the host. tests/sandbox/test_sandbox_nonroot.py
runs the trainer side as a non-root user too.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
from test_code_formats import within_one_limit

from sandbox_servers import tcp_listener
from tandem.sidecars.rewards.code_exec import code_exec_reward, extract_code
from tandem.sidecars.sandbox.confine import landlock_abi
from tandem.sidecars.sandbox.runner import (
    HARNESS,
    SOCKET_ENV,
    Isolation,
    SandboxLimits,
    harness_command,
    isolation_mode,
    run_tests,
)

MODES = ["basic", "server"] + (["namespaces"] if isolation_mode() == "namespaces" else [])
FAST = SandboxLimits(timeout_seconds=2.0)


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> Iterator[Isolation]:
    if request.param != "server":
        yield cast(Isolation, request.param)
        return
    path, _ = request.getfixturevalue("sandbox_server")
    os.environ[SOCKET_ENV] = str(path)  # what the pod env contract gives the trainer
    try:
        yield "server"
    finally:
        del os.environ[SOCKET_ENV]


def test_namespaces_available_as_root() -> None:
    import os

    if os.geteuid() != 0:
        pytest.skip("not root: only the basic isolation can run")
    assert isolation_mode() == "namespaces"


def test_pass_fraction(mode: Isolation) -> None:
    code = "def add(a, b):\n    return a + b if a < 10 else 0\n"
    tests = ["assert add(1, 2) == 3", "assert add(20, 1) == 21", "assert add(-1, 1) == 0",
             "assert add(3, 3) == 6"]
    r = run_tests(code, tests, FAST, isolation=mode)
    assert (r.passed, r.total, r.status) == (3, 4, "ok") and r.score == 0.75


def test_program_error_scores_zero(mode: Isolation) -> None:
    r = run_tests("def f(:\n", ["assert True"], FAST, isolation=mode)
    assert r.status == "error" and r.score == 0.0
    r = run_tests("raise SystemExit(0)", ["assert True"], FAST, isolation=mode)
    assert r.score == 0.0


def test_io_cases(mode: Isolation) -> None:
    stdio = {"inputs": ["2\n", "3\n", "4\n"], "outputs": ["4", "6", "9"]}
    r = run_tests("print(2 * int(input()))", stdio, FAST, isolation=mode)
    assert (r.passed, r.total, r.status) == (2, 3, "ok")
    call = {"fn_name": "twice", "inputs": [[1], [[1, 2]]], "outputs": [2, [[1, 2, 1, 2]]]}
    r = run_tests("def twice(x):\n    return x * 2\n", call, FAST, isolation=mode)
    assert (r.passed, r.total) == (2, 2)


def test_harness_given_as_source() -> None:
    """Where the sandbox user cannot read the checkout (under /root), the harness runs from `-c` source."""
    command = (*harness_command()[:4], "-c", HARNESS.read_text())
    # what is checked is the harness, not its speed: a limit a loaded machine's interpreter start never reaches
    r = run_tests("def sq(x):\n    return x * x\n", ["assert sq(3) == 9", "assert sq(2) == 5"],
                  SandboxLimits(timeout_seconds=60.0), isolation="basic", command=command)
    assert (r.passed, r.total, r.status) == (1, 2, "ok")


def test_reward_extracts_fenced_code_and_test_forms() -> None:
    completion = "Here you go:\n```python\ndef sq(x):\n    return x * x\n```\nDone."
    assert extract_code(completion).strip().startswith("def sq")
    assert code_exec_reward(completion, "assert sq(3) == 9\nassert sq(-2) == 4", 3.0) == 1.0
    assert code_exec_reward(completion, '["assert sq(2) == 4", "assert sq(2) == 5"]', 3.0) == 0.5
    assert code_exec_reward(completion, "for i in range(3):\n    assert sq(i) == i * i\nassert sq(1) == 2", 3.0) == 0.5


def test_network_refused(mode: Isolation) -> None:
    with tcp_listener() as (port, accepted):
        code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\nconnected = 1\n"
        r = run_tests(code, ["assert connected"], FAST, isolation=mode)
        assert r.score == 0.0 and within_one_limit(r, mode), r
        time.sleep(0.3)
        assert accepted == []


def test_writes_outside_refused(mode: Isolation, tmp_path: Path) -> None:
    outside = tmp_path / "escaped.txt"
    home_dir = Path.home() / ".cache" / "tandem"
    home_dir.mkdir(parents=True, exist_ok=True)
    outside2 = home_dir / f"sandbox-escape-{mode}.txt"
    outside2.unlink(missing_ok=True)
    for target in (outside, outside2, Path("/tmp") / f"tandem-escape-{mode}.txt"):
        target.unlink(missing_ok=True)
        code = f"open({str(target)!r}, 'w').write('pwned')\nwrote = True\n"
        r = run_tests(code, ["assert wrote"], FAST, isolation=mode)
        if target.parent == Path("/tmp") and mode == "namespaces" and not landlock_abi():
            assert r.score == 1.0  # allowed, but into a private tmpfs that vanishes
        else:
            assert r.score == 0.0
        assert not target.exists()
    ok = run_tests("open('scratch.txt', 'w').write('fine')\nwrote = open('scratch.txt').read()",
                   ["assert wrote == 'fine'"], FAST, isolation=mode)
    assert ok.score == 1.0  # its own work dir is writable


def test_fork_bomb_contained(mode: Isolation) -> None:
    t0 = time.monotonic()
    r = run_tests("import os\nwhile True:\n    os.fork()\n", ["assert True"], FAST, isolation=mode)
    assert r.score == 0.0 and time.monotonic() - t0 < 8


def test_infinite_loop_killed(mode: Isolation) -> None:
    r = run_tests("while True:\n    pass\n", ["assert True"], SandboxLimits(timeout_seconds=1.0),
                  isolation=mode)
    assert r.status == "timeout" and r.score == 0.0 and within_one_limit(r, mode), r


def test_timeout_keeps_tests_passed_before() -> None:
    r = run_tests("def f():\n    while True: pass\n", ["assert 1", "assert 2", "assert f()"],
                  SandboxLimits(timeout_seconds=1.0))
    assert r.status == "timeout" and r.passed == 2 and r.score == pytest.approx(2 / 3)


def test_huge_output_contained(mode: Isolation) -> None:
    t0 = time.monotonic()
    r = run_tests("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", ["assert True"], FAST,
                  isolation=mode)
    assert r.score == 0.0 and time.monotonic() - t0 < 8
    # flooding every inherited descriptor (the result channel included) hits the read cap
    flood = "import os\nwhile True:\n    for fd in range(3, 12):\n        try: os.write(fd, b'y' * 65536)\n" \
            "        except OSError: pass\n"
    r = run_tests(flood, ["assert True"], FAST, isolation=mode)
    assert r.score == 0.0 and r.status in ("output_limit", "error", "timeout")


def test_huge_memory_contained(mode: Isolation) -> None:
    r = run_tests("x = bytearray(8 * 1024 ** 3)\n", ["assert len(x) > 0"], FAST, isolation=mode)
    assert r.score == 0.0 and within_one_limit(r, mode), r


def test_no_leftover_processes_or_dirs() -> None:
    run_tests("import os, time\nif os.fork() == 0:\n    time.sleep(60)\n", [], FAST)
    time.sleep(0.5)
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert "sandbox/harness.py" not in ps
    assert not list(Path("/tmp").glob("tandem-sbx-*"))
