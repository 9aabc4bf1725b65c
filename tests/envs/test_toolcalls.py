"""Tool calls parsed from replies in the Hermes/Qwen and Llama 3 formats, malformed ones as error messages."""

from __future__ import annotations

import pytest

from tandem.sidecars.envs.toolcalls import ToolCall, parse


def test_hermes_calls_among_text() -> None:
    reply = ('Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*34"}}\n'
             '</tool_call>\nand\n<tool_call>{"name": "lookup", "arguments": "{\\"key\\": \\"a;b\\"}"}</tool_call>')
    got = parse(reply)
    assert got.calls == [ToolCall("calculator", {"expression": "12*34"}), ToolCall("lookup", {"key": "a;b"})]
    assert got.errors == [] and got.any


def test_a_reply_without_calls_is_a_final_answer() -> None:
    for style in ("hermes", "llama3"):
        got = parse("The answer is 408.", style)  # type: ignore[arg-type]
        assert not got.any


@pytest.mark.parametrize(("reply", "words"), [
    ("<tool_call>{'name': 'calculator'}</tool_call>", "not valid JSON"),
    ('<tool_call>["calculator"]</tool_call>', 'a JSON object with a "name"'),
    ('<tool_call>{"name": "calculator", "arguments": [1, 2]}</tool_call>', "must be a JSON object, got list"),
    ('<tool_call>{"name": "calculator", "arguments": "{oops"}</tool_call>', "a string that is not JSON"),
    ('<tool_call>{"name": "calculator", "arguments": {}}', "without its </tool_call>"),
])
def test_malformed_hermes_calls_become_errors(reply: str, words: str) -> None:
    got = parse(reply)
    assert got.calls == [] and len(got.errors) == 1 and words in got.errors[0], got.errors
    assert got.any  # answered with the error, not taken as a final answer


def test_good_and_bad_calls_in_one_reply_keep_both() -> None:
    got = parse('<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{bad</tool_call>')
    assert got.calls == [ToolCall("a", {})] and len(got.errors) == 1


def test_llama3_json_calls() -> None:
    assert parse('{"name": "calculator", "parameters": {"expression": "2+2"}}', "llama3").calls == [
        ToolCall("calculator", {"expression": "2+2"})]
    got = parse('<|python_tag|>{"name": "a", "parameters": {"s": "x;}{"}}; {"name": "b", "parameters": {}}',
                "llama3")
    assert got.calls == [ToolCall("a", {"s": "x;}{"}), ToolCall("b", {})] and not got.errors
    bad = parse('{"name": "a", "parameters": {', "llama3")
    assert bad.calls == [] and "not valid JSON" in bad.errors[0]
    assert "must be a JSON object" in parse("<|python_tag|>print(1)", "llama3").errors[0]
