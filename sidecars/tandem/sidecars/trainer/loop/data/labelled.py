"""KTO's labelled completions: each row's completion and label, checked and tokenized as the model's reply.

Role: the values of `dataset.completionField` and `dataset.labelField` read as what a KTO example
is: the completion as the assistant's reply to the rendered prompt, in the token ids the model would
have generated, and the label. Caller: `dataset.PromptDataset.load`, which renders the prompts and
puts the file, row and field in front of every ValueError raised here (as a DatasetError).

- Label: true (desirable) or false (undesirable); 1 and 0 (a numeric column) are read as those.
- Completion: a non-empty string, or TRL's conversational form, a list of one assistant message.
- Token ids (`reply_ids`): with the chat template, the text the template puts after the generation
  prompt when the conversation ends with the completion as the assistant's turn (so a template that
  trims or wraps the reply is followed), tokenized on its own, as vLLM continues a prompt, and cut
  after the first special token (the template's end of turn, e.g. `<|im_end|>`: vLLM's completions
  end with the stop token, and what the template writes after it is the next turn's). A template
  that renders the prompt differently inside the conversation, and a plain prompt, get the
  completion's own ids. Either way a reply without a special token at its end gets the EOS token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Labelled:
    """One row's completion and label (KTO's example, beside the row's `Prompt`)."""

    text: str  # the completion as written
    desirable: bool
    token_ids: list[int] | None = None  # the reply's ids, ending with the end of turn / EOS; None: no tokenizer


def label(value: Any) -> bool:
    """A row's label: true/false, or 1/0."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    shown = "missing or null" if value is None else f"got {value!r}"
    raise ValueError(f"must be true (desirable) or false (undesirable), or 1/0; {shown}")


def completion(value: Any) -> str:
    """A row's completion: a non-empty string, or a list of one assistant message with string content."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], dict):
        message = value[0]
        if message.get("role") != "assistant" or not isinstance(message.get("content"), str):
            raise ValueError("a messages list must hold one message with role 'assistant' and string content")
        value = message["content"]
    if value is None:
        raise ValueError("missing or null")
    if not isinstance(value, str):
        raise ValueError(f"must be a string or a list of one assistant message, got {type(value).__name__}")
    if not value.strip():
        raise ValueError("empty string")
    return value


def reply_ids(tokenizer: Any, prompt_text: str, conversation: str | None, reply: str) -> list[int]:
    """The completion's token ids as the model would generate them after `prompt_text` (see the module
    docstring); `conversation` is the templated prompt + reply, None without a chat template."""
    tail = reply
    if conversation is not None and conversation.startswith(prompt_text):
        tail = conversation[len(prompt_text):]
    ids = [int(i) for i in tokenizer(tail, add_special_tokens=False)["input_ids"]]
    eos = tokenizer.eos_token_id
    stops = special_ids(tokenizer) | ({int(eos)} if eos is not None else set())
    first = next((j for j, t in enumerate(ids) if t not in stops), None)
    if first is None:
        raise ValueError("the completion has no text tokens")
    end = next((j for j in range(first, len(ids)) if ids[j] in stops), None)
    if end is not None:
        return ids[:end + 1]
    if eos is None:
        raise ValueError("the tokenizer has no eos_token to end the completion with")
    return [*ids, int(eos)]


def special_ids(tokenizer: Any) -> set[int]:
    """The tokenizer's special tokens: the named ones (bos, eos, ...) and every added token marked special
    (a chat template's turn markers such as <|im_end|> often are only the latter)."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return {int(i) for i in getattr(tokenizer, "all_special_ids", [])} | {
        int(i) for i, token in added.items() if getattr(token, "special", False)}
