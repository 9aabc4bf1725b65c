"""Token-in, token-out on real chat templates: a two-turn tool conversation built turn by turn (the model's
tokens as sampled, the environment's from `continuation_ids`) is exactly transformers' rendering of the whole
conversation, for SmolLM2's ChatML template (which ignores `tools`: the Hermes system block carries them)
and for a template that renders tools itself; the trajectory's mask, log-probs and turn starts follow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tandem.sidecars.envs.chat import ChatRenderer, TemplateError, hermes_tool_prompt
from tandem.sidecars.envs.tools import Tool, calculator
from tandem.sidecars.envs.trajectory import Trajectory

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "123 * 456"}}\n</tool_call>'
# A ChatML template that renders tools itself (as Qwen's do), written for this test.
NATIVE = ("{% if tools %}<|im_start|>system\nTOOLS {{ tools | length }}: {% for t in tools %}{{ t.function.name }}"
          "{% endfor %}<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
          "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    from tandem.cli import pretrained

    return AutoTokenizer.from_pretrained(Path(pretrained.fetch("smollm2-135m")))


def _conversation(renderer: ChatRenderer, tokenizer: Any) -> tuple[Trajectory, list[dict[str, Any]]]:
    """Question -> a tool call -> its result -> the answer, built as the rollout builds it."""
    question = [{"role": "user", "content": "What is 123 * 456?"}]
    traj = Trajectory(renderer.prompt_ids(question))
    first = tokenizer(CALL, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]  # as vLLM samples
    traj.add_model(first, [-0.5] * len(first), version=3)
    result = [{"role": "tool", "content": calculator("123 * 456")}]
    traj.add_env(renderer.continuation_ids(result))
    second = tokenizer("123 * 456 = 56088.", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    traj.add_model(second, [-0.25] * len(second), version=4)
    messages = question + [{"role": "assistant", "content": CALL}] + result + \
        [{"role": "assistant", "content": "123 * 456 = 56088."}]
    return traj, messages


@pytest.mark.parametrize("native", [False, True], ids=["smollm2-template", "tools-in-template"])
def test_turn_by_turn_tokens_are_the_whole_conversations(tokenizer: Any, native: bool) -> None:
    if native:
        tokenizer = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
        tokenizer.chat_template = NATIVE
    tools = [Tool.of(calculator).schema]
    renderer = ChatRenderer(tokenizer, tools)
    assert renderer.native_tools is native
    traj, messages = _conversation(renderer, tokenizer)
    if native:
        whole = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
        assert "TOOLS 1: calculator" in whole
    else:
        whole = tokenizer.apply_chat_template(
            [{"role": "system", "content": hermes_tool_prompt(tools)}, *messages], tokenize=False)
    want = tokenizer(whole, add_special_tokens=False)["input_ids"]
    got = traj.prompt_ids + traj.completion_ids
    assert got == want[:len(got)]  # token for token what transformers renders for the whole conversation
    assert tokenizer.decode(want[len(got):]) == "\n"  # ... up to the template's newline after the last turn
    n1 = len(traj.segments[0].ids)
    env = len(traj.segments[1].ids)
    assert traj.expanded(None).mask == [1] * n1 + [0] * env + [1] * len(traj.segments[2].ids)
    assert traj.turn_starts == [0, n1 + env] and traj.model_turns == 2
    assert traj.expanded(None).logprobs[:n1] == [-0.5] * n1 and traj.expanded(None).logprobs[n1:n1 + env] == [0.0] * env
    assert traj.versions[0] == 3 and traj.versions[-1] == 4 and traj.versions[n1] is None
    assert "56088" in tokenizer.decode(traj.segments[1].ids)


def test_templates_that_cannot_be_extended_are_refused(tokenizer: Any) -> None:
    rewriting = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    # drops every assistant turn but the last (as templates that strip past reasoning do)
    rewriting.chat_template = ("{% for m in messages %}{% if m.role != 'assistant' or loop.last %}<|im_start|>"
                               "{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
                               "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    with pytest.raises(TemplateError, match="renders earlier turns differently"):
        ChatRenderer(rewriting).continuation_ids([{"role": "tool", "content": "1"}])
    with pytest.raises(ValueError, match="one log-prob per token"):
        Trajectory([1]).add_model([1, 2], [0.0], version=0)
