"""Tool calls in a model's reply, parsed in the format of the model's chat-template family.

Role: a reply may ask for tools; how it writes the call depends on how the model was trained. `hermes`
(Hermes, Qwen 2/2.5/3, SmolLM3 and most open models' templates): each call is a JSON object
`{"name": ..., "arguments": {...}}` between `<tool_call>` and `</tool_call>`, text around them allowed.
`llama3`: the whole reply (after an optional `<|python_tag|>`) is one JSON object `{"name": ...,
"parameters": {...}}`, or several joined by `;`. A call that cannot be read is not an exception for the
caller to catch: `parse` returns it as an error message, which the environment hands back to the model as
the tool's answer, so a malformed call costs the model a turn, never the rollout.
Caller: `environments.ToolEnvironment`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

Style = Literal["hermes", "llama3"]
OPEN, CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.S)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class Parsed:
    """The calls of one reply and, for each one that could not be read, why (in order of appearance)."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def any(self) -> bool:
        return bool(self.calls or self.errors)


def _call(body: str, args_key: str) -> ToolCall | str:
    """One JSON call, or why it is not one."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return f"the tool call is not valid JSON ({e.msg} at character {e.pos}): {body.strip()[:200]}"
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return f'a tool call must be a JSON object with a "name" string and "{args_key}": {body.strip()[:200]}'
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return f'"{args_key}" of the call to {obj["name"]} is a string that is not JSON: {args[:200]}'
    if not isinstance(args, dict):
        return f'"{args_key}" of the call to {obj["name"]} must be a JSON object, got {type(args).__name__}'
    return ToolCall(obj["name"], args)


def _add(out: Parsed, got: ToolCall | str) -> None:
    if isinstance(got, ToolCall):
        out.calls.append(got)
    else:
        out.errors.append(got)


def parse(reply: str, style: Style = "hermes") -> Parsed:
    """The tool calls of `reply` (none: a final answer)."""
    out = Parsed()
    if style == "hermes":
        for match in _BLOCK.finditer(reply):
            _add(out, _call(match.group(1), "arguments"))
        rest = _BLOCK.sub("", reply)
        if OPEN in rest:
            out.errors.append(f"a {OPEN} without its {CLOSE}: write each call as {OPEN}"
                              '{"name": ..., "arguments": {...}}' + CLOSE)
        return out
    text = reply.strip()
    tagged = text.startswith(PYTHON_TAG)
    text = text.removeprefix(PYTHON_TAG).strip()
    if not text.startswith("{"):
        if tagged:
            out.errors.append(f"after {PYTHON_TAG} a tool call must be a JSON object")
        return out
    for part in _split_objects(text):
        _add(out, _call(part, "parameters"))
    return out


def without_calls(reply: str, style: Style = "hermes") -> str:
    """The reply's text besides its tool calls (an OpenAI message's content next to its tool_calls)."""
    if style == "hermes":
        return _BLOCK.sub("", reply).strip()
    return ""  # llama3: a reply with calls is nothing but calls


def _split_objects(text: str) -> list[str]:
    """`{...}; {...}` -> its objects (a `;` inside a string or an object does not split)."""
    parts, depth, start, quoted, escaped = [], 0, 0, False, False
    for i, ch in enumerate(text):
        if quoted:
            escaped, quoted = (not escaped and ch == "\\"), quoted and not (ch == '"' and not escaped)
            continue
        if ch == '"':
            quoted = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == ";" and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in (p.strip() for p in parts) if p]
