"""Token ids of a multi-turn conversation, built turn by turn without re-tokenizing what the model wrote.

Role: token-in, token-out. The first prompt is the chat template's rendering of the row's messages (with the
tools' schemas). After each model turn, which vLLM ended with the template's end-of-turn token, the tokens
that follow — the rest of that turn as the template writes it (ChatML's newline after `<|im_end|>`), the
environment's messages (tool results) and the next generation prompt — come from `continuation_ids`, which
renders them after a fixed stand-in conversation and keeps the difference: the model's own tokens are never
decoded and encoded again, so what trains is exactly what was sampled. A template that rewrites earlier
turns when later ones are added (some strip reasoning from past turns) cannot be extended this way and is
refused naming why. Templates that ignore `tools` (SmolLM2's, many small models') get the schemas in a
system message in the Hermes format, the one `toolcalls` parses by default.
Caller: the rollout's multi-turn driver and its OpenAI endpoint, one `ChatRenderer` per set of tools
(`Renderers`; it holds no conversation).
"""

from __future__ import annotations

import json
import threading
from typing import Any

Message = dict[str, Any]
STAND_IN: list[Message] = [{"role": "user", "content": "."}, {"role": "assistant", "content": "."}]


def text_of(content: Any) -> str:
    """A message's content as text: OpenAI content parts joined, None as empty."""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def call_arguments(function: dict[str, Any]) -> Any:
    """A tool call's arguments: OpenAI sends them as a JSON string; an unreadable one stays as it came."""
    args = function.get("arguments", {})
    if isinstance(args, str):
        try:
            return json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return args
    return args or {}


class TemplateError(ValueError):
    """The chat template cannot be extended turn by turn."""


def hermes_tool_prompt(tools: list[dict[str, Any]]) -> str:
    """The tools and how to call them, for templates that do not render `tools` themselves."""
    schemas = "\n".join(json.dumps(t, sort_keys=True) for t in tools)
    return ("You can call functions to help answer. Their signatures, one JSON object per line, are between "
            f"<tools> and </tools>:\n<tools>\n{schemas}\n</tools>\nTo call one, reply with a JSON object "
            "holding its name and arguments between <tool_call> and </tool_call>, e.g.\n<tool_call>\n"
            '{"name": "<function name>", "arguments": {"<argument>": <value>}}\n</tool_call>\n'
            "Each result comes back in a message of its own; answer when you have what you need.")


class ChatRenderer:
    def __init__(self, tokenizer: Any, tools: list[dict[str, Any]] | None = None) -> None:
        self.tok, self.tools = tokenizer, list(tools or [])
        if tokenizer.eos_token_id is None:
            raise TemplateError("the tokenizer has no end-of-turn (eos) token")
        self.end_of_turn = int(tokenizer.eos_token_id)
        probe = [{"role": "user", "content": "."}]
        self.native_tools = bool(self.tools) and self._text(probe, True, self.tools) != self._text(probe, True, None)
        self._after_turn = self._suffix_after_turn()

    def _text(self, messages: list[Message], generation: bool, tools: list[dict[str, Any]] | None) -> str:
        return str(self.tok.apply_chat_template(messages, tools=tools, tokenize=False,
                                                add_generation_prompt=generation))

    def _ids(self, messages: list[Message], generation: bool) -> list[int]:
        if self.tools and not self.native_tools:
            if messages and messages[0]["role"] == "system":
                messages = [{"role": "system", "content": f"{messages[0]['content']}\n\n"
                             f"{hermes_tool_prompt(self.tools)}"}, *messages[1:]]
            else:
                messages = [{"role": "system", "content": hermes_tool_prompt(self.tools)}, *messages]
        text = self._text(messages, generation, self.tools if self.native_tools else None)
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def _suffix_after_turn(self) -> list[int]:
        """What the template writes after an assistant turn's end-of-turn token (ChatML: a newline)."""
        ids = self._ids(STAND_IN, False)
        if self.end_of_turn not in ids:
            raise TemplateError(f"the chat template does not end an assistant turn with the eos token "
                                f"{self.tok.convert_ids_to_tokens(self.end_of_turn)!r}")
        return ids[len(ids) - ids[::-1].index(self.end_of_turn):]

    def prompt_ids(self, messages: list[Message]) -> list[int]:
        """The first prompt: `messages` (a system prompt, the user's question) and the generation prompt."""
        return self._ids(messages, True)

    def continuation_ids(self, new_messages: list[Message]) -> list[int]:
        """The tokens after a model turn that ended with the end-of-turn token: the rest of that turn, then
        `new_messages` (tool results, observations), then the generation prompt of the next model turn."""
        before = self._ids(STAND_IN, False)
        after = self._ids(STAND_IN + new_messages, True)
        if after[:len(before)] != before:
            raise TemplateError("the chat template renders earlier turns differently once later ones follow; "
                                "its conversations cannot be extended token by token")
        return self._after_turn + after[len(before):]


class Renderers:
    """One `ChatRenderer` per set of tools, made on first use (thread-safe)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self._made: dict[str, ChatRenderer] = {}
        self._lock = threading.Lock()

    def get(self, tools: list[dict[str, Any]] | None) -> ChatRenderer:
        key = json.dumps(tools or [], sort_keys=True)
        with self._lock:
            if key not in self._made:
                self._made[key] = ChatRenderer(self.tok, tools or [])
            return self._made[key]
