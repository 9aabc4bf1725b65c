"""Tools from Python functions (schemas by transformers), run with timeouts and caps; the calculator; the tool
environment's turns: a malformed call, a timeout and a raising tool each answer the model, nothing crashes."""

from __future__ import annotations

import threading
import time

import pytest

from tandem.sidecars.envs.environments import SingleTurn, ToolEnvironment
from tandem.sidecars.envs.toolcalls import ToolCall
from tandem.sidecars.envs.tools import Tool, ToolBox, ToolError, calculator


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def test_schema_from_signature_and_docstring() -> None:
    tool = Tool.of(calculator)
    fn = tool.schema["function"]
    assert tool.name == "calculator" and fn["parameters"]["required"] == ["expression"]
    assert fn["parameters"]["properties"]["expression"]["type"] == "string"
    assert "arithmetic" in fn["description"]

    def undocumented(x: int) -> int:
        return x

    with pytest.raises(ToolError, match="'undocumented' cannot be a tool"):
        Tool.of(undocumented)
    with pytest.raises(ToolError, match="two tools are named 'add'"):
        ToolBox([add, add])


@pytest.mark.parametrize(("expression", "want"), [
    ("123456789 * 987654321", "121932631112635269"), ("(2 + 3) ** 10 - -1", "9765626"), ("7 / 2", "3.5"),
    ("7 // 2 + 7 % 2", "4"), ("2 ** 0.5", repr(2 ** 0.5)),
])
def test_calculator_is_exact(expression: str, want: str) -> None:
    assert calculator(expression) == want


@pytest.mark.parametrize(("expression", "words"), [
    ("__import__('os').system('id')", "only numbers"), ("x + 1", "only numbers"), ("2 ** 100000", "exponent"),
    ("1 +", "not an arithmetic expression"), ("True + 1", "only numbers"),
    ("(10 ** 999) ** 999", "too large"), (" * ".join(["(9 ** 999)"] * 6), "too large"),
])
def test_calculator_refuses_anything_else(expression: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        calculator(expression)


def test_every_failure_is_an_answer_to_the_model() -> None:
    release = threading.Event()

    def slow(seconds: float) -> str:
        """Sleep.

        Args:
            seconds: How long.
        """
        release.wait(seconds)
        return "done"

    def broken(x: int) -> int:
        """Fail.

        Args:
            x: Anything.
        """
        raise KeyError(x)

    box = ToolBox([add, slow, broken, calculator], timeout_seconds=0.5, max_output_chars=20)
    try:
        assert box.run(ToolCall("add", {"a": 2, "b": 3})).content == "5"
        assert "no tool named 'sub'" in box.run(ToolCall("sub", {})).content
        bad = box.run(ToolCall("add", {"a": 1, "c": 2}))
        assert bad.error and "unknown c" in bad.content and "missing b" in bad.content
        raised = box.run(ToolCall("broken", {"x": 7}))
        assert raised.error and "broken raised KeyError: 7" in raised.content
        start = time.monotonic()
        late = box.run(ToolCall("slow", {"seconds": 30}))
        assert late.error and "timed out after 0.5 s" in late.content and time.monotonic() - start < 10
        long = box.run(ToolCall("calculator", {"expression": "9 ** 99"}))
        assert not long.error and long.content.startswith("29512665430652752148") and "more characters cut" in \
            long.content
    finally:
        release.set()
        box.close()


def test_tool_environment_turns() -> None:
    env = ToolEnvironment(ToolBox([calculator]), max_turns=3)
    assert env.tools()[0]["function"]["name"] == "calculator"
    assert env.reset({"prompt": "x"}, [{"role": "user", "content": "What is 123 * 456?"}])[0]["role"] == "user"
    first = env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "123 * 456"}}</tool_call>')
    assert not first.done and first.messages == [{"role": "tool", "name": "calculator", "content": "56088"}]
    second = env.step("<tool_call>{calculator: 1}</tool_call>")  # malformed: an error turn, not a crash
    assert not second.done and second.messages[0]["content"].startswith("error: the tool call is not valid JSON")
    final = env.step("123 * 456 = 56088")
    assert final.done and final.messages == [] and final.reward is None
    assert (env.stats.turns, env.stats.tool_calls, env.stats.tool_errors, env.stats.per_turn) == (3, 2, 1, [1, 1, 0])
    capped = ToolEnvironment(ToolBox([calculator]), max_turns=1)
    assert capped.step('<tool_call>{"name": "calculator", "arguments": {"expression": "1"}}</tool_call>').done
    single = SingleTurn()
    assert single.step("anything").done and single.tools() == []
