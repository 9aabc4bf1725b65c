"""Code rewards on real datasets' test formats, run in the sandbox: correct, wrong, crashing and slow programs.

HumanEval (`check(candidate)` + entry point), MBPP (assert lists + setup code), stdin/stdout cases
(APPS, CodeContests) and call-based cases (`fn_name`), in every isolation mode available here.
"""

from __future__ import annotations

import json
import pwd
import subprocess
import time
from pathlib import Path
from typing import cast

import pytest

from tandem.sidecars.rewards import RewardInput, RewardSet
from tandem.sidecars.rewards.code_exec import code_exec_reward
from tandem.sidecars.sandbox.runner import Isolation, SandboxLimits, isolation_mode, run_tests
from tandem.sidecars.sandbox.types import ExecResult
from tandem.spec.rewards import Reward

MODES = ["basic"] + (["namespaces"] if isolation_mode() == "namespaces" else [])
FAST = SandboxLimits(timeout_seconds=3.0)
SLOW_LIMIT = SandboxLimits(timeout_seconds=1.0)
BOUND = 1.0 + 5.0  # one time limit plus the interpreter's startup allowance

HUMANEVAL = '''
METADATA = {
    "author": "jt",
    "dataset": "test",
}


def check(candidate):
    assert candidate(2) == 4
    assert candidate(3) == 9
    assert candidate(-1) == 1

'''


def within_one_limit(r: ExecResult, mode: Isolation) -> bool:
    """The slow run ended within one time limit plus the startup allowance, on top of what a run that ends at
    once costs on this machine now (measured right after it: spawning the sandbox from a large test process and
    reaping it took 6 s more than the bound once, with both cores busy under `make test`)."""
    quick = run_tests("def f(x):\n    return x * x\n", HUMANEVAL + "check(f)\n", FAST, isolation=mode)
    assert quick.status == "ok", quick
    return r.seconds < BOUND + quick.seconds


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> Isolation:
    return cast(Isolation, request.param)


def test_the_reported_humaneval_case(mode: Isolation) -> None:
    tests = HUMANEVAL + "check(f)\n"  # one string: setup, the check function, the call
    wrong = run_tests("def f(x):\n    return None\n", tests, FAST, isolation=mode)
    assert (wrong.passed, wrong.total, wrong.score) == (0, 1, 0.0)  # was 0.67: setup counted as passing
    right = run_tests("def f(x):\n    return x * x\n", tests, FAST, isolation=mode)
    assert (right.passed, right.total, right.score) == (1, 1, 1.0)


@pytest.mark.parametrize(
    ("program", "score", "status"),
    [
        ("def square(x):\n    return x ** 2\n", 1.0, "ok"),
        ("def square(x):\n    return x * 2\n", 0.0, "ok"),  # right for 2 only: the check fails as a whole
        ("def square(x):\n    raise RuntimeError('boom')\n", 0.0, "ok"),
        ("def square(x:\n", 0.0, "error"),
    ],
)
def test_humaneval_with_entry_point(mode: Isolation, program: str, score: float, status: str) -> None:
    row = {"task_id": "HumanEval/0", "test": HUMANEVAL, "entry_point": "square"}
    for answer in (row, json.dumps(row)):
        r = run_tests(program, answer, FAST, isolation=mode)
        assert (r.score, r.status, r.total) == (score, status, 1)


def test_humaneval_timeout(mode: Isolation) -> None:
    r = run_tests("def square(x):\n    while True:\n        pass\n", {"test": HUMANEVAL, "entry_point": "square"},
                  SLOW_LIMIT, isolation=mode)
    assert r.status == "timeout" and r.score == 0.0 and within_one_limit(r, mode), r


MBPP = {
    "test_setup_code": "import math\nEPS = 1e-9",
    "test_list": ["assert area(1) == math.pi", "assert abs(area(2) - 4 * math.pi) < EPS", "assert area(0) == 0"],
}


@pytest.mark.parametrize(
    ("program", "passed"),
    [
        ("import math\ndef area(r):\n    return math.pi * r * r\n", 3),
        ("import math\ndef area(r):\n    return math.pi * r\n", 2),  # right for 0 and 1 only
        ("def area(r):\n    return 1 / r\n", 0),  # crashes on 0, wrong elsewhere
        ("def area(r):\n    return None\n", 0),
    ],
)
def test_mbpp_asserts_count_setup_does_not(mode: Isolation, program: str, passed: int) -> None:
    r = run_tests(program, MBPP, FAST, isolation=mode)
    assert (r.passed, r.total, r.status) == (passed, 3, "ok") and r.score == pytest.approx(passed / 3)


def test_mbpp_timeout_keeps_asserts_passed_before(mode: Isolation) -> None:
    program = "import math\ndef area(r):\n    while r == 0:\n        pass\n    return math.pi * r * r\n"
    r = run_tests(program, MBPP, SLOW_LIMIT, isolation=mode)
    assert (r.passed, r.total, r.status) == (2, 3, "timeout") and within_one_limit(r, mode), r


STDIO = {"inputs": ["1 2\n", "3 4\n", "10 -5\n", "0 0\n"], "outputs": ["3\n", "7\n", "5\n", "0"]}


@pytest.mark.parametrize(
    ("program", "passed"),
    [
        ("a, b = map(int, input().split())\nprint(a + b)\n", 4),
        ("import sys\nnums = sys.stdin.buffer.read().split()\nsys.stdout.write(f'  {sum(map(int, nums))}  \\n')\n"
         "sys.exit(0)\n", 4),  # binary stdin, extra whitespace, a clean exit
        ("print(sum(map(int, open(0).read().split())))\n", 4),  # reading fd 0 directly
        ("a, b = map(int, input().split())\nprint(a - b)\n", 1),  # only 0 0 is right
        ("a, b = map(int, input().split())\nprint(a + b)\nif a == 3:\n    raise SystemExit(1)\n", 3),
        ("a, b = map(int, input().split())\nprint(a + b)\nif a == 3:\n    print(1 // 0)\n", 3),  # crash after output
        ("a, b = map(int, input().split())\nif b < 0:\n    import os\n    os._exit(3)\nprint(a + b)\n", 3),
    ],
)
def test_stdin_stdout_cases(mode: Isolation, program: str, passed: int) -> None:
    r = run_tests(program, STDIO, FAST, isolation=mode)
    assert (r.passed, r.total, r.status) == (passed, 4, "ok") and r.score == pytest.approx(passed / 4)


def test_stdin_stdout_program_that_fails_to_compile(mode: Isolation) -> None:
    r = run_tests("print(\n", {"input_output": json.dumps(STDIO)}, FAST, isolation=mode)
    assert (r.score, r.status) == (0.0, "error")


def test_stdin_stdout_timeout_fails_that_case_and_the_rest(mode: Isolation) -> None:
    program = "a, b = map(int, input().split())\nwhile a == 3:\n    pass\nprint(a + b)\n"
    r = run_tests(program, STDIO, SLOW_LIMIT, isolation=mode)
    assert (r.passed, r.total, r.status) == (1, 4, "timeout") and "case 1" in r.detail
    assert within_one_limit(r, mode), r  # one time limit, not one per remaining case


CALL = {"inputs": [[1, 2], [3, 4], [-2, 2]], "outputs": [[3], [7], [0]], "fn_name": "add"}


@pytest.mark.parametrize(
    ("program", "passed"),
    [
        ("def add(a, b):\n    return a + b\n", 3),
        ("class Solution:\n    def add(self, a, b):\n        return a + b\n", 3),  # LeetCode style
        ("def add(a, b):\n    return [a + b]\n", 3),  # APPS writes [value]; either form is accepted
        ("def add(a, b):\n    return a * b if a > 0 else a + b\n", 1),
        ("def add(a, b):\n    if a == 3:\n        raise ValueError\n    return a + b\n", 2),
        ("def add(a, b):\n    return {a + b}\n", 0),  # not JSON: never equal
        ("def plus(a, b):\n    return a + b\n", 0),  # no such function
        ("import sys\nsys.exit(2)\ndef add(a, b):\n    return a + b\n", 0),
    ],
)
def test_call_based_cases(mode: Isolation, program: str, passed: int) -> None:
    r = run_tests(program, CALL, FAST, isolation=mode)
    assert (r.passed, r.total) == (passed, 3) and r.score == pytest.approx(passed / 3)


def test_call_based_timeout(mode: Isolation) -> None:
    program = "def add(a, b):\n    while a < 0:\n        pass\n    return a + b\n"
    r = run_tests(program, CALL, SLOW_LIMIT, isolation=mode)
    assert (r.passed, r.status) == (2, "timeout") and within_one_limit(r, mode), r
    looping_module = "while True:\n    pass\ndef add(a, b):\n    return a + b\n"
    r = run_tests(looping_module, CALL, SLOW_LIMIT, isolation=mode)
    assert (r.passed, r.status) == (0, "timeout") and within_one_limit(r, mode), r


def _sandbox_uid_processes() -> int:
    """Processes (zombies included) of the uid the sandbox drops to: they share its RLIMIT_NPROC."""
    try:
        uid = pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return 0
    count = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            uids = next(ln for ln in status.read_text().splitlines() if ln.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        count += int(uids.split()[1]) == uid
    return count


def test_io_cases_stay_contained(mode: Isolation) -> None:
    fork_bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    r = run_tests(fork_bomb, STDIO, SLOW_LIMIT, isolation=mode)
    assert r.score == 0.0, r
    # the killed bomb's processes linger until the host's init reaps them; then forking works again
    deadline = time.monotonic() + 30
    while _sandbox_uid_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert within_one_limit(r, mode), r  # its quick run once the bomb's processes are gone
    stray = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\nprint(sum(map(int, input().split())))\n"
    r = run_tests(stray, STDIO, FAST, isolation=mode)
    assert r.score == 1.0
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert "sandbox/harness.py" not in ps and "time.sleep(60)" not in ps


def test_reward_function_and_reward_set_on_dataset_rows() -> None:
    completion = "Here is my solution:\n```python3\ndef add(a, b):\n    return a + b\n```\nIt adds."
    assert code_exec_reward(completion, json.dumps(CALL), 3.0) == 1.0
    assert code_exec_reward(completion, {"test_list": ["assert add(1, 1) == 2", "assert add(1, 1) == 3"]}, 3.0) == 0.5
    rs = RewardSet([Reward.model_validate({"type": "codeExec", "timeoutSeconds": 3})])
    rows = [str({"test": "def check(candidate):\n    assert candidate(2, 2) == 4\n", "entry_point": "add"}),
            json.dumps({"inputs": ["2 2\n"], "outputs": ["4\n"]})]
    items = [RewardInput("p", completion, rows[0]), RewardInput("p", "```python\nprint(4)\n```", rows[1]),
             RewardInput("p", "```python\nprint(5)\n```", rows[1])]
    assert rs.score_rules(items) == {"codeExec": [1.0, 1.0, 0.0]}
