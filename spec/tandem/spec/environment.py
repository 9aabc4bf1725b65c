"""`rollout.environment`: multi-turn rollouts, in which the model may call tools before it answers.

Role: the spec of what a completion's turns are made of (tandem.sidecars.envs): `type: single` is one
reply (today's behaviour, the default when the field is absent); `tools` lets the model call the built-in
tools named in `tools` (the exact `calculator`) in the chat-template family's format (`toolCallFormat`), each
call answered with a tool message, until it answers without a call or reaches `maxTurns`. The limits bound
every trajectory: model turns, completion tokens of the whole trajectory (model and tool turns; each model
turn is also bounded by rollout.maxTokens), tokens of each tool message, seconds of each tool call.
Caller: models.Rollout (the job spec), the rollout sidecar (builds the environment), the trainer (limits).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from tandem.spec.base import Base, Rule

BUILT_IN_TOOLS = ("calculator",)


class Environment(Base):
    type: Literal["single", "tools"] = Field(default="single", description=(
        "single: one reply per completion. tools: the model may call `tools`, whose results come back as tool "
        "messages, over several turns; only the model's tokens train (the tool messages are masked)."))
    tools: Annotated[list[Literal["calculator"]], Field(max_length=16, description=(
        "Built-in tools the model may call (type tools): calculator evaluates arithmetic exactly."))] = Field(
        default_factory=list)
    tool_call_format: Literal["hermes", "llama3"] = Field(default="hermes", description=(
        "How replies write tool calls: hermes (<tool_call>{json}</tool_call>, Qwen and Hermes templates, and "
        "the system prompt added for templates that do not render tools) or llama3 (a JSON object)."))
    max_turns: Annotated[int, Field(ge=1, le=64, description="Model turns per trajectory.")] = 4
    max_total_tokens: Annotated[int, Field(ge=1, le=1_048_576, description=(
        "Completion tokens of a whole trajectory, model and tool turns together."))] = 1024
    max_tool_output_tokens: Annotated[int, Field(ge=1, le=65_536, description=(
        "Tokens of one tool message; a longer one is cut and says so."))] = 256
    tool_timeout_seconds: Annotated[float, Field(gt=0, le=3600, description=(
        "Seconds one tool call may take; a slower one is answered with a timeout error."))] = 10.0
    rules = (
        Rule("self.type != 'tools' || (has(self.tools) && size(self.tools) > 0)",
             "type tools needs at least one tool", ".tools", lambda e: e.type != "tools" or bool(e.tools)),
        Rule("self.type == 'tools' || !has(self.tools) || size(self.tools) == 0",
             "tools apply to type tools only", ".tools", lambda e: e.type == "tools" or not e.tools),
    )
