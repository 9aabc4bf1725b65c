"""The user's own tool functions as the model meets them: `async def` tools awaited on the box's one event loop
(concurrently, cancelled at their timeout), arguments checked against the signature's types (a wrong type is
an error message to the model and the function is not called), results that are not strings sent as JSON,
and functions that cannot be tools refused at load, saying why."""

from __future__ import annotations

import asyncio
import functools
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import date
from typing import Any, Literal

import pytest

from tandem.sidecars.envs.environments import ToolEnvironment
from tandem.sidecars.envs.toolcalls import ToolCall
from tandem.sidecars.envs.tools import Tool, ToolBox, ToolError

CALLS: list[Any] = []  # what the functions below were called with


async def shout(word: str) -> str:
    """Says a word loudly, after a pause.

    Args:
        word: The word.
    """
    await asyncio.sleep(0.01)
    CALLS.append(("shout", word, id(asyncio.get_running_loop())))
    return word.upper()


def describe(word: str, times: int = 1, loud: bool = False, scale: float = 1.0,
             pair: tuple[int, int] = (0, 0), mode: Literal["plain", "fancy"] = "plain",
             scores: list[int] | None = None, day: date | None = None) -> dict[str, Any]:
    """Describes what it was given.

    Args:
        word: A word.
        times: How many times.
        loud: Whether loud.
        scale: A factor.
        pair: Two integers.
        mode: The style.
        scores: Some integers.
        day: A date.
    """
    CALLS.append(("describe", word, times, loud, scale, pair, mode, scores, day))
    return {"word": word * times, "loud": loud, "scale": scale, "pair": pair, "mode": mode, "scores": scores,
            "day": day, "note": "naïve"}


@pytest.fixture(autouse=True)
def _fresh_calls() -> None:
    CALLS.clear()


def run(box: ToolBox, name: str, **arguments: Any) -> tuple[str, bool]:
    result = box.run(ToolCall(name, arguments))
    return result.content, result.error


def test_an_async_tool_is_awaited_on_one_loop_of_the_box() -> None:
    box = ToolBox([shout])
    try:
        assert Tool.of(shout).awaited and not Tool.of(describe).awaited
        assert run(box, "shout", word="tandem") == ("TANDEM", False)
        assert run(box, "shout", word="again") == ("AGAIN", False)
        loops = {loop for _, _, loop in CALLS}
        assert [w for _, w, _ in CALLS] == ["tandem", "again"] and len(loops) == 1  # one loop, kept
        env = ToolEnvironment(box)
        step = env.step('<tool_call>{"name": "shout", "arguments": {"word": "hi"}}</tool_call>')
        assert step.messages == [{"role": "tool", "name": "shout", "content": "HI"}]
        assert (env.stats.tool_calls, env.stats.tool_errors) == (1, 0)
    finally:
        box.close()


def test_async_calls_from_several_threads_run_at_once_and_a_late_one_is_cancelled() -> None:
    gate: dict[str, asyncio.Event] = {}
    cancelled = threading.Event()

    async def meet(side: str) -> str:
        """Waits at a gate for the other side.

        Args:
            side: first waits, second opens.
        """
        event = gate.setdefault("gate", asyncio.Event())
        if side == "second":
            event.set()
            return "opened"
        await event.wait()
        return "met"

    async def stall(seconds: float) -> str:
        """Sleeps.

        Args:
            seconds: How long.
        """
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "woke"

    box = ToolBox([meet, stall], timeout_seconds=5.0)
    try:
        with ThreadPoolExecutor(2) as pool:  # as the driver's environment workers call it
            first = pool.submit(run, box, "meet", side="first")
            time.sleep(0.1)
            second = pool.submit(run, box, "meet", side="second")
            # "first" can only finish while "second" runs beside it: the calls share the loop, concurrently
            assert first.result(timeout=10) == ("met", False) and second.result(timeout=10) == ("opened", False)
        box.timeout_seconds = 0.3
        late = run(box, "stall", seconds=60)
        assert late == ("error: stall timed out after 0.3 s", True)
        assert cancelled.wait(5), "the timed-out coroutine was not cancelled"
    finally:
        box.close()


def test_a_plain_wrapper_of_an_async_function_is_awaited_too() -> None:
    def logged(fn: Callable[..., Awaitable[str]]) -> Callable[..., Awaitable[str]]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Awaitable[str]:  # a plain def: returns the coroutine
            return fn(*args, **kwargs)
        return wrapper

    box = ToolBox([logged(shout)])
    try:
        assert not box.tools["shout"].awaited  # found only when the call returns a coroutine
        assert run(box, "shout", word="wrapped") == ("WRAPPED", False)
    finally:
        box.close()


@pytest.mark.parametrize(("arguments", "says"), [
    ({"word": ["x"]}, 'word: Input should be a valid string (got array ["x"])'),
    ({"word": "x", "loud": "no"}, 'loud: Input should be a valid boolean (got string "no")'),
    ({"word": "x", "times": "3"}, 'times: Input should be a valid integer (got string "3")'),
    ({"word": "x", "times": 2.5}, "times: Input should be a valid integer (got number 2.5)"),
    ({"word": "x", "loud": 1}, "loud: Input should be a valid boolean (got integer 1)"),
    ({"word": "x", "mode": "bold"}, "mode: Input should be 'plain' or 'fancy' (got string \"bold\")"),
    ({"word": "x", "scores": [1, "two"]}, 'scores[1]: Input should be a valid integer (got string "two")'),
    ({"word": "x", "pair": [1]}, "pair[1]: Field required"),
    ({"word": "x", "day": 20240102}, "day: Input should be a valid date"),
    ({"word": None}, "word: Input should be a valid string (got null null)"),
])
def test_an_argument_of_the_wrong_type_is_an_error_for_the_model(arguments: dict[str, Any], says: str) -> None:
    box = ToolBox([describe])
    try:
        content, error = run(box, "describe", **arguments)
        assert error and content.startswith("error: bad arguments for describe: ") and says in content, content
        assert CALLS == []  # the function never saw it
    finally:
        box.close()


def test_arguments_of_the_schemas_types_reach_the_function_as_python_values() -> None:
    box = ToolBox([describe])
    try:
        content, error = run(box, "describe", word="ab", times=2, loud=False, scale=3, pair=[1, 2], mode="fancy",
                             scores=[4, 5], day="2024-01-02")
        assert not error, content
        # an integer is a number (3 -> 3.0), an array fills the tuple, a string the date: as the schema says
        assert CALLS == [("describe", "ab", 2, False, 3.0, (1, 2), "fancy", [4, 5], date(2024, 1, 2))]
        assert run(box, "describe", word="x")[1] is False and CALLS[-1][2:4] == (1, False)  # defaults kept
    finally:
        box.close()


@dataclass
class Point:
    x: int
    y: float


class Opaque:
    pass


@pytest.mark.parametrize(("value", "want"), [
    ({"a": 1, "b": [True, None], "c": "naïve"}, {"a": 1, "b": [True, None], "c": "naïve"}),
    ([1, 2.5, "x"], [1, 2.5, "x"]), (None, None), (True, True), (42, 42), ((1, 2), [1, 2]),
    (Point(1, 2.5), {"x": 1, "y": 2.5}), ({"when": date(2024, 1, 2)}, {"when": "2024-01-02"}),
])
def test_a_result_that_is_not_a_string_reaches_the_model_as_json(value: Any, want: Any) -> None:
    def give() -> Any:
        """Gives a value."""
        return value

    box = ToolBox([give])
    try:
        content, error = run(box, "give")
        assert not error and json.loads(content) == want, content
        assert "'" not in content  # not Python's repr
    finally:
        box.close()


def test_a_result_json_cannot_hold_is_an_error_and_a_string_is_sent_as_it_is() -> None:
    def opaque() -> Any:
        """Gives an object."""
        return Opaque()

    def text() -> str:
        """Gives text."""
        return "{'already': 'text'}"

    box = ToolBox([opaque, text])
    try:
        content, error = run(box, "opaque")
        assert error and content.startswith("error: opaque returned a value of type Opaque, which JSON cannot"), content
        assert run(box, "text") == ("{'already': 'text'}", False)
    finally:
        box.close()


async def _chunks(word: str) -> AsyncIterator[str]:
    """Yields parts.

    Args:
        word: A word.
    """
    yield word


def _spread(word: str, *more: str) -> str:
    """Takes more.

    Args:
        word: A word.
        more: More words.
    """
    return word


def _only_positional(word: str, /) -> str:
    """Positional.

    Args:
        word: A word.
    """
    return word


def _opaque_argument(thing: Opaque) -> str:
    """Takes an object.

    Args:
        thing: The object.
    """
    return "x"


@pytest.mark.parametrize(("fn", "says"), [
    (_chunks, "'_chunks' cannot be a tool: it yields; a tool returns its answer"),
    (_spread, "'_spread' cannot be a tool: *more cannot be sent by name"),
    (_only_positional, "'_only_positional' cannot be a tool: word cannot be sent by name"),
    (_opaque_argument, "'_opaque_argument' cannot be a tool: its argument types cannot be checked"),
])
def test_a_function_that_cannot_take_a_json_call_is_refused_at_load(fn: Callable[..., Any], says: str) -> None:
    with pytest.raises(ToolError) as refused:
        ToolBox([fn])
    assert says in str(refused.value)
