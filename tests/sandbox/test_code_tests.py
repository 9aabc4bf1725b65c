"""Reading code datasets' test formats: what counts as a test, I/O cases, and errors naming the key at fault.

No sandbox here (pure parsing); the programs run in test_code_formats.py.
"""

from __future__ import annotations

import json

import pytest

from tandem.sidecars.rewards.code_exec import extract_code
from tandem.sidecars.sandbox.code_tests import TestFormatError, parse_tests

HUMANEVAL_TEST = '''
METADATA = {"author": "jt", "dataset": "test"}


def check(candidate):
    assert candidate(2) == 4
    assert candidate(3) == 9
    assert candidate(-1) == 1
'''


def test_setup_statements_never_count() -> None:
    plan = parse_tests(HUMANEVAL_TEST + "\ncheck(f)\n")
    assert plan.kind == "snippets" and plan.total == 1  # METADATA and the def are setup
    assert [s.counted for s in plan.sources] == [(2,)]
    plan = parse_tests("import math\nx = 3\ny: int = 2\nx += 1\nprint(f(x))\nf(1)\nassert f(x) == 16\n"
                       "for i in range(3):\n    assert f(i) == i * i\n"
                       "if True:\n    def g():\n        assert False\n")
    assert plan.total == 2  # the assert and the loop; the assert inside a nested def is not a test


def test_calls_of_test_defined_functions_count() -> None:
    plan = parse_tests("def test_a():\n    assert f(1)\n\ndef helper(x):\n    return x\n\ntest_a()\n"
                       "helper(2)\nsorted([1])\nif __name__ == '__main__':\n    test_a()\n")
    assert plan.total == 3  # test_a(), helper(2) (a test-defined function), the if block; not sorted()


@pytest.mark.parametrize("encode", [lambda d: d, json.dumps, str])  # value, JSON, Python repr
def test_humaneval_entry_point_adds_the_check_call(encode: object) -> None:
    plan = parse_tests(encode({"test": HUMANEVAL_TEST, "entry_point": "square", "task_id": "X/0"}))  # type: ignore[operator]
    assert plan.total == 1
    assert plan.sources[-1].code == "check(square)" and plan.sources[-1].counted == (0,)
    # the call is not added twice when the tests already make it
    plan = parse_tests({"test": HUMANEVAL_TEST + "check(square)\n", "entry_point": "square"})
    assert plan.total == 1 and all(s.code != "check(square)" for s in plan.sources)


def test_mbpp_columns() -> None:
    row = {"test_list": ["assert f(1) == 1", "assert f(2) == 4", "assert f(3) == 9"],
           "test_setup_code": "import math\nLIMIT = 10", "challenge_test_list": ["assert f(10) == 100"],
           "test_imports": ["import re"], "text": "square a number"}
    plan = parse_tests(row)
    assert plan.total == 4
    assert [s.name for s in plan.sources][:2] == ["test_imports[0]", "test_setup_code"]
    assert [len(s.counted) for s in plan.sources] == [0, 0, 1, 1, 1, 1]
    assert parse_tests(str(row)).total == 4  # the trainer's dataset passes str(dict)
    assert parse_tests(str(row["test_list"])).total == 3


def test_io_formats() -> None:
    apps = {"input_output": json.dumps({"inputs": ["1 2\n", ["3 4", "5 6"]], "outputs": ["3\n", ["7", "11"]]})}
    plan = parse_tests(apps)
    assert plan.kind == "stdio" and plan.total == 2
    assert plan.cases[1].input == "3 4\n5 6" and plan.cases[1].output == "7\n11"
    contests = parse_tests({"input": ["1\n"], "output": ["2\n"], "is_valid": True})
    assert contests.kind == "stdio" and contests.cases[0].output == "2\n"
    lcb = parse_tests(json.dumps([{"input": "1", "output": "2", "testtype": "stdin"}] * 3))
    assert lcb.kind == "stdio" and lcb.total == 3
    call = parse_tests({"inputs": [[1, 2], 5], "outputs": [[3], 6], "fn_name": "add"})
    assert call.kind == "call" and call.cases[1].input == [5] and call.job(2.0)["fn_name"] == "add"


@pytest.mark.parametrize(
    ("answer", "names"),
    [
        (None, "missing"),
        (42, "got int"),
        ({"task_id": 3}, "got keys ['task_id']"),
        ({"inputs": ["1"], "outputs": []}, "inputs has 1 items but outputs has 0"),
        ({"inputs": [], "outputs": []}, "inputs is empty"),
        ({"inputs": "1", "outputs": ["2"]}, "must be lists"),
        ({"inputs": ["1"], "outputs": ["2"], "fn_name": "not a name"}, "fn_name"),
        ({"test": HUMANEVAL_TEST, "entry_point": "f(x)"}, "entry_point"),
        ({"test_list": ["assert f(1) == 1", "assert f(("]}, "test_list[1] is not valid Python"),
        ({"test_list": [1, 2]}, "test_list must be test code"),
        ({"test": "assert 1", "inputs": ["1"], "outputs": ["1"]}, "not both"),
        ({"input_output": "nonsense"}, "input_output must be a dict"),
        (HUMANEVAL_TEST, "entry_point"),  # check defined, never called, no entry point: say so
        ("x = f(3)\nprint(x)", "no test found"),
        ([{"input": "1"}], "input and output"),
    ],
)
def test_errors_name_what_is_wrong(answer: object, names: str) -> None:
    with pytest.raises(TestFormatError) as err:
        parse_tests(answer)
    assert names in str(err.value) and "codeExec tests" in str(err.value)


def test_empty_tests_mean_the_program_only_has_to_run() -> None:
    assert parse_tests([]).total == 0 and parse_tests("").total == 0 and parse_tests("[]").total == 0


def test_extract_code_fences() -> None:
    assert extract_code("```python3\nx = 1\n```") == "x = 1\n"
    assert extract_code("text\n```Python\na = 1\n```\nmore\n```\nb = 2\n```\nend") == "b = 2\n"
    assert extract_code("Sure:\n```python\ndef f():\n    return 1\n") == "def f():\n    return 1\n"  # cut off
    assert extract_code("def f(): return 1") == "def f(): return 1"
