"""`rollout.environment`: multi-turn rollouts, in which the model may call tools before it answers.

Role: the spec of what a completion's turns are made of (tandem.sidecars.envs):
- `single`: one reply (today's behaviour, the default when the field is absent);
- `tools`: the model may call `tools` (the built-in `calculator` and sandboxed `python`, or the user's own
  functions as `package.module:function`, whose signatures and docstrings become the tool schemas) in the
  chat-template family's format (`toolCallFormat`), each call answered with a tool message, until it
  answers without a call or reaches `maxTurns`;
- `custom`: the user's environment class (`entryPoint: package.module:Class`, built with `kwargs`; reset and
  step, see tandem.sidecars.envs.environments.Environment), which may also give its own reward;
- `agent`: the user's agent (`entryPoint: package.module:function`), any code that speaks the OpenAI chat
  API, called with the rollout's OpenAI-compatible endpoint for one trajectory; every call it makes is
  served by the live vLLM and recorded, tokens and log-probs, for training.
Module paths resolve in the image or in `pythonPath` (directories, e.g. on one of the job's volumes). The
limits bound every trajectory: model turns, completion tokens of the whole trajectory (model and tool turns;
each model turn is also bounded by rollout.maxTokens), tokens of each tool message, seconds of each tool call.
Caller: rollout.Rollout (the job spec), the rollout sidecar (builds the environment), the trainer (limits).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from tandem.spec.strict_model import Base, Rule

BUILT_IN_TOOLS = ("calculator", "python")
ENTRY_POINT = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
TOOL = r"^(calculator|python|[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*)$"
DOTTED = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$"


def _tool_words(value: Any) -> Any:
    """`value`, or the reason a string the TOOL pattern refuses is not a tool, in words (the verdict is the
    pattern's, as in the API server; `package.module.function`, a dot for the colon, gets the fix)."""
    if not isinstance(value, str) or re.fullmatch(TOOL, value):
        return value
    if re.fullmatch(DOTTED, value):
        module, _, name = value.rpartition(".")
        raise ValueError(f"{value!r} is not a tool; did you mean {module}:{name}? (a user tool is "
                         "package.module:function, a colon before the function)")
    raise ValueError(f"{value!r} is not a tool: calculator, python, or package.module:function")


ToolName = Annotated[str, Field(pattern=TOOL, max_length=256), BeforeValidator(_tool_words)]  # the pattern: the CRD's


class Environment(Base):
    type: Literal["single", "tools", "custom", "agent"] = Field(default="single", description=(
        "single: one reply per completion. tools: the model may call `tools`, whose results come back as tool "
        "messages, over several turns; only the model's tokens train (the tool messages are masked). custom: "
        "the environment class `entryPoint`. agent: the agent function `entryPoint`, driving the rollout's "
        "OpenAI-compatible endpoint."))
    tools: Annotated[list[ToolName], Field(max_length=16, description=(
        "Tools the model may call (type tools): calculator (exact arithmetic), python (a program run in the "
        "codeExec sandbox; what it prints comes back), or package.module:function, a function with type hints "
        "and a docstring."))] = Field(default_factory=list)
    entry_point: Annotated[str | None, Field(pattern=ENTRY_POINT, max_length=256, description=(
        "package.module:Name (types custom and agent): the environment class, or the agent function called as "
        "fn(base_url=..., api_key=..., row=..., **kwargs) for each trajectory, returning its reward or None."))] = None
    kwargs: dict[str, Any] = Field(default_factory=dict, description=(
        "Keyword arguments for the environment class or the agent function."),
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})
    python_path: Annotated[list[Annotated[str, Field(pattern=r"^/", max_length=1024)]], Field(
        max_length=16, description="Absolute directories searched for entryPoint and tool modules first (e.g. on "
        "one of the job's volumes).")] = Field(default_factory=list)
    tool_call_format: Literal["hermes", "llama3"] = Field(default="hermes", description=(
        "How replies write tool calls: hermes (<tool_call>{json}</tool_call>, Qwen and Hermes templates, and "
        "the system prompt added for templates that do not render tools) or llama3 (a JSON object)."))
    max_turns: Annotated[int, Field(ge=1, le=64, description=(
        "Model turns per trajectory (agent: calls; an agent's calls beyond it are refused)."))] = 4
    max_total_tokens: Annotated[int, Field(ge=1, le=1_048_576, description=(
        "Completion tokens of a whole trajectory, model and tool turns together."))] = 1024
    max_tool_output_tokens: Annotated[int, Field(ge=1, le=65_536, description=(
        "Tokens of one tool message; a longer one is cut and says so."))] = 256
    max_pictures: Annotated[int, Field(ge=0, le=64, description=(
        "Pictures the environment may answer with in one trajectory (vision-language models; each also meets "
        "dataset.images' maxPixels and resize); one more is refused, counted, and the model reads that it "
        "was."))] = 4
    tool_timeout_seconds: Annotated[float, Field(gt=0, le=3600, description=(
        "Seconds one tool call may take; a slower one is answered with a timeout error."))] = 10.0
    trajectory_timeout_seconds: Annotated[float, Field(gt=0, le=86_400, description=(
        "Seconds one agent trajectory (type agent) may take: its calls after that are refused, and what it "
        "made until then trains."))] = 600.0
    rules = (
        Rule("self.type != 'tools' || (has(self.tools) && size(self.tools) > 0)",
             "type tools needs at least one tool", ".tools", lambda e: e.type != "tools" or bool(e.tools)),
        Rule("self.type == 'tools' || !has(self.tools) || size(self.tools) == 0",
             "tools apply to type tools only", ".tools", lambda e: e.type == "tools" or not e.tools),
        Rule("!(self.type in ['custom', 'agent']) || has(self.entryPoint)",
             "types custom and agent need an entryPoint (package.module:Name)", ".entryPoint",
             lambda e: e.type not in ("custom", "agent") or e.entry_point is not None),
        Rule("self.type in ['custom', 'agent'] || !has(self.entryPoint)",
             "entryPoint applies to types custom and agent only", ".entryPoint",
             lambda e: e.type in ("custom", "agent") or e.entry_point is None),
    )
