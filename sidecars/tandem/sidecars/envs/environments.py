"""The environment contract of a multi-turn rollout, and the two built-in environments.

Role: an environment turns a dataset row into the conversation's first messages (`reset`) and each model
reply into what comes next (`step`): messages to append (tool results, an environment's observation), a
reward of its own for that turn if it has one (the trajectory's `environment` reward is the sum over its
turns; None throughout: the job's other rewards judge the final answer alone), and whether the
trajectory is over. A vision-language job's row comes to `reset` with its pictures (`pictures`: RGB PIL images),
and an environment may answer with pictures of its own: content parts `{"type": "image", "image": <PIL image>}`
(or an `image_url`; a tool that returns a picture is answered so), which reach the model's next turn
(`env_pictures`). `SingleTurn` is today's task: one reply, done.
`ToolEnvironment` runs the tool calls of each reply (`toolcalls.parse` in the template family's style,
`tools.ToolBox`) and answers each with a `tool` message; a reply without calls is the final answer; a malformed
call is answered with its error as the tool's message; the trajectory ends at `max_turns` replies. Stats per
trajectory (turns, calls, tool errors, tool seconds, and the answers that reached the model) feed the metrics.
Caller: the rollout's multi-turn driver (one environment per trajectory, `reset` then `step` per reply).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tandem.sidecars.envs import toolcalls
from tandem.sidecars.envs.tools import ToolBox

Message = dict[str, Any]


@dataclass
class Step:
    messages: list[Message]  # appended to the conversation before the model's next turn
    done: bool
    reward: float | None = None  # the environment's own reward for this turn (None: none); a trajectory's is the sum


@dataclass
class TurnStats:
    turns: int = 0
    tool_calls: int = 0  # every call the replies made, malformed ones included
    tool_errors: int = 0  # calls that gave an error: malformed, unknown tool, raised, timed out
    tool_seconds: float = 0.0
    per_turn: list[int] = field(default_factory=list)  # calls made in each reply
    # answers that reached the model: in its context before a later turn (the driver counts them; a call in
    # the last turn runs, but nothing reads its answer), errors the environment counted left out
    tool_results: int = 0


class Environment(Protocol):
    stats: TurnStats

    def tools(self) -> list[dict[str, Any]]:
        """The tool schemas the chat template renders (empty: no tools)."""
        ...

    def reset(self, row: Mapping[str, Any], messages: list[Message]) -> list[Message]:
        """The conversation's first messages for `row` (whose prompt rendered as `messages`)."""
        ...

    def step(self, reply: str) -> Step:
        ...


class SingleTurn:
    """One reply, judged by the job's rewards."""

    def __init__(self) -> None:
        self.stats = TurnStats()

    def tools(self) -> list[dict[str, Any]]:
        return []

    def reset(self, row: Mapping[str, Any], messages: list[Message]) -> list[Message]:
        self.stats = TurnStats()
        return list(messages)

    def step(self, reply: str) -> Step:
        self.stats.turns += 1
        self.stats.per_turn.append(0)
        return Step([], done=True)


class ToolEnvironment:
    """Replies may call the tools of `box`; each call's result comes back as a `tool` message."""

    def __init__(self, box: ToolBox, *, style: toolcalls.Style = "hermes", max_turns: int = 4) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.box, self.style, self.max_turns = box, style, max_turns
        self.stats = TurnStats()

    def tools(self) -> list[dict[str, Any]]:
        return self.box.schemas()

    def reset(self, row: Mapping[str, Any], messages: list[Message]) -> list[Message]:
        self.stats = TurnStats()
        return list(messages)

    def step(self, reply: str) -> Step:
        self.stats.turns += 1
        parsed = toolcalls.parse(reply, self.style)
        self.stats.per_turn.append(len(parsed.calls) + len(parsed.errors))
        if not parsed.any:
            return Step([], done=True)  # a final answer
        out: list[Message] = []
        for error in parsed.errors:  # a malformed call is a call that failed: errors never exceed calls
            self.stats.tool_calls += 1
            self.stats.tool_errors += 1
            out.append({"role": "tool", "content": f"error: {error}"})
        for call in parsed.calls:
            result = self.box.run(call)
            self.stats.tool_calls += 1
            self.stats.tool_errors += int(result.error)
            self.stats.tool_seconds += result.seconds
            content: Any = [{"type": "image", "image": p} for p in result.pictures] or result.content
            out.append({"role": "tool", "name": call.name, "content": content})
        return Step(out, done=self.stats.turns >= self.max_turns)
