"""The driver counts the tool answers that reached the model (`TurnStats.tool_results`, the metric
`tool_results_mean`): appended to the context before a later model turn, errors left out; the answers of a
last turn's calls, or of a turn the budget ends, are not. A real ToolEnvironment and ToolBox, the driver's
own `_advance`, a stand-in tokenizer and renderer (token counts only) in place of vLLM's."""

from __future__ import annotations

import json
from typing import Any

from tandem.sidecars.envs.environments import ToolEnvironment
from tandem.sidecars.envs.multi_turn import Limits, MultiTurnDriver, Result, _State
from tandem.sidecars.envs.tools import ToolBox, calculator
from tandem.sidecars.envs.trajectory import Trajectory
from tandem.sidecars.rollout_engine.sampling import Completion
from tandem.sidecars.rollout_engine.turns import Turn

END = 2  # the stand-in template's end of turn


class Words:
    """A tokenizer of one token per word."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [7] * len(text.split())}

    def decode(self, ids: list[int]) -> str:
        return " ".join("w" for _ in ids)


class Renderer:
    end_of_turn = END

    def continuation_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        return [5] * sum(len(str(m.get("content", "")).split()) + 3 for m in messages)


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def replay(replies: list[str], limits: Limits) -> Result:
    """The trajectory the driver makes when the model writes `replies`, one per turn."""
    box = ToolBox([calculator])
    driver = MultiTurnDriver(engine=None, tokenizer=Words(), make_env=lambda: ToolEnvironment(box), limits=limits)
    env = ToolEnvironment(box, max_turns=limits.max_turns)
    state = _State(env, Renderer(), Result(Trajectory([1, 1]), env.stats))  # type: ignore[arg-type]
    turn = Turn((0, 0), [1, 1], limits.max_turn_tokens)
    try:
        for reply in replies:
            done = Completion(prompt_index=0, sample_index=0, prompt_token_ids=[1, 1], token_ids=[9, 9, END],
                              logprobs=[-1.0] * 3, text=reply, finish_reason="stop")
            following = driver._advance(state, turn, done, version=0)
            if not following:
                break
            [turn] = following
        return state.result
    finally:
        driver.close()
        box.close()


def test_only_answers_the_model_reads_count() -> None:
    result = replay([call("calculator", expression="6 * 7") + call("calculator", expression=["6 * 7"]),
                     call("calculator", expression="1 + 1"),
                     call("calculator", expression="2 + 2")],  # the last turn: nothing reads this answer
                    Limits(max_turns=3, max_turn_tokens=64, max_total_tokens=4096))
    stats = result.stats
    assert (result.finish, stats.turns, stats.tool_calls, stats.tool_errors) == ("answer", 3, 4, 1)
    assert stats.tool_results == 2  # "42" and "2"; the bad call's error and the last turn's "4" are not
    tool_messages = [m["content"] for m in result.messages if m["role"] == "tool"]
    assert tool_messages[0] == "42" and tool_messages[1].startswith("error: bad arguments for calculator")
    assert tool_messages[2:] == ["2"]


def test_answers_the_budget_cuts_off_do_not_count() -> None:
    result = replay([call("calculator", expression="6 * 7"), "done"],
                    Limits(max_turns=3, max_turn_tokens=4, max_total_tokens=6))
    assert result.finish == "budget" and result.stats.tool_calls == 1 and result.stats.tool_results == 0
