"""The rollout's OpenAI-compatible endpoint on a real vLLM (SmolLM2-135M-Instruct), driven by the real
`openai` client, and agent trajectories recorded from it for training.

An agent that calls twice (the model's reply, then a tool result) yields one trajectory whose tokens are
the first prompt, the model's ids as sampled, the template's own tokens for the tool turn, and the second
reply: the reply it got back as text is never re-tokenized, the loss mask covers the model's tokens only,
and the recorded log-probs equal transformers' log-probs of the same ids. An agent that rewrites its history
starts a new chain (the earlier calls counted, not trained); calls past maxTurns or for an unknown trajectory
are refused with 409; an agent that raises keeps what it made. Tool calls in a reply come back as OpenAI
`tool_calls` (that check stands the engine loop in for vLLM: SmolLM2 rarely writes a call when asked).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import torch

from tandem.checkpoint_engine.ports import free_port
from tandem.sidecars.envs.agent import AgentDriver
from tandem.sidecars.envs.chat import ChatRenderer
from tandem.sidecars.envs.recorder import Recorder
from tandem.sidecars.envs.tools import Tool, calculator
from tandem.sidecars.rollout.openai_api import Chat, _for_template
from tandem.sidecars.rollout_engine.sampling import Completion, SamplingOptions
from tandem.sidecars.rollout_engine.turns import Turn, TurnLoop

pytestmark = [pytest.mark.vllm]
TOKEN = "test-token"
GREEDY = SamplingOptions(temperature=0.0, max_tokens=96)
QUESTION = [{"role": "user", "content": "What is 617 * 2? Use the calculator tool."}]
TOOLS = [Tool.of(calculator).schema]


@pytest.fixture(scope="module")
def served(engine: Any, tokenizer: Any) -> Iterator[tuple[str, Recorder]]:
    """The rollout app (control API, OpenAI endpoint) on a real port; agents reach it over HTTP."""
    from tandem.sidecars.rollout.http_app import build_app
    from tandem.sidecars.serve import start_server

    recorder = Recorder(max_calls=3, max_turn_tokens=96, max_total_tokens=512)
    chat = Chat(TurnLoop(engine), tokenizer, recorder, model="smollm2", max_tokens=96)
    port = free_port()
    server, thread = start_server(build_app(engine, TOKEN, None, chat), port, "openai-test")
    yield f"http://127.0.0.1:{port}", recorder
    server.should_exit = True
    thread.join(timeout=60)


def client(base_url: str) -> Any:
    import openai

    return openai.OpenAI(base_url=base_url, api_key=TOKEN, max_retries=0, timeout=300)


def two_calls(base_url: str, api_key: str, row: dict[str, Any], tool_result: str = "1234") -> float:
    """An agent: ask, answer the reply with a tool result, ask again; reward 1."""
    c = client(base_url)
    messages = list(row["messages"])
    first = c.chat.completions.create(model="smollm2", messages=messages, tools=TOOLS, max_tokens=96)
    reply = first.choices[0].message.model_dump(exclude_none=True)
    messages += [reply, {"role": "tool", "tool_call_id": "call_0", "content": tool_result}]
    c.chat.completions.create(model="smollm2", messages=messages, tools=TOOLS, max_tokens=96)
    return 1.0


def driver(served: tuple[str, Recorder], tokenizer: Any, agent: Any) -> AgentDriver:
    base_url, recorder = served
    return AgentDriver(agent, {}, recorder, ChatRenderer(tokenizer, TOOLS), base_url, TOKEN, seconds=300, workers=4)


def test_an_agents_calls_are_one_trajectory_token_for_token(served: Any, tokenizer: Any, smollm2: Path) -> None:
    from transformers import AutoModelForCausalLM

    agents = driver(served, tokenizer, two_calls)
    try:
        [[result]] = agents.run([{"index": 0}], [QUESTION], 1, GREEDY, version=0)
    finally:
        agents.close()
    traj, renderer = result.trajectory, ChatRenderer(tokenizer, TOOLS)
    assert result.reward == 1.0 and result.finish == "answer" and result.stats.turns == 2
    assert [s.model for s in traj.segments] == [True, False, True]
    first, env, second = traj.segments
    assert traj.prompt_ids == renderer.prompt_ids(QUESTION)
    tool = _for_template({"role": "tool", "tool_call_id": "call_0", "content": "1234"}, renderer)
    assert env.ids == renderer.continuation_ids([tool])  # the tool turn as the template writes it
    assert first.ids[-1] == second.ids[-1] == renderer.end_of_turn
    assert traj.expanded(None).mask == [1] * len(first.ids) + [0] * len(env.ids) + [1] * len(second.ids)
    ids = traj.prompt_ids + traj.completion_ids
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    start = len(traj.prompt_ids)
    theirs = logp[start - 1:-1].gather(1, torch.tensor(traj.completion_ids)[:, None]).squeeze(1)
    mask = torch.tensor(traj.expanded(None).mask, dtype=torch.bool)
    ours = torch.tensor(traj.expanded(None).logprobs)
    assert (theirs[mask] - ours[mask]).abs().max().item() < 2e-3
    assert torch.all(ours[~mask] == 0)


def test_a_rewritten_history_starts_a_new_chain(served: Any, tokenizer: Any) -> None:
    def rewrites(base_url: str, api_key: str, row: dict[str, Any]) -> None:
        c = client(base_url)
        c.chat.completions.create(model="smollm2", messages=row["messages"], max_tokens=32)
        edited = [*row["messages"], {"role": "assistant", "content": "Let me think."},
                  {"role": "user", "content": "Go on."}]
        c.chat.completions.create(model="smollm2", messages=edited, max_tokens=32)

    agents = driver(served, tokenizer, rewrites)
    try:
        [[result]] = agents.run([{}], [QUESTION], 1, GREEDY, version=0)
    finally:
        agents.close()
    assert result.reward is None and result.stats.turns == 1  # the last chain: the second call alone
    assert [s.model for s in result.trajectory.segments] == [True]
    assert result.trajectory.prompt_ids == ChatRenderer(tokenizer, []).prompt_ids(
        [*QUESTION, {"role": "assistant", "content": "Let me think."}, {"role": "user", "content": "Go on."}])


def test_calls_past_the_limits_are_refused_and_a_failed_agent_keeps_what_it_made(served: Any, tokenizer: Any) -> None:
    import openai

    seen: dict[str, Any] = {}

    def greedy(base_url: str, api_key: str, row: dict[str, Any]) -> None:
        c = client(base_url)
        messages = list(row["messages"])
        for _ in range(4):  # the recorder allows 3
            try:
                reply = c.chat.completions.create(model="smollm2", messages=messages, max_tokens=96)
            except openai.ConflictError as e:
                seen["refused"] = str(e)
                raise
            messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "More."}]

    agents = driver(served, tokenizer, greedy)
    try:
        [[result]] = agents.run([{}], [QUESTION], 1, GREEDY, version=0)
    finally:
        agents.close()
    assert "maxTurns" in seen["refused"] and result.finish == "error" and result.reward is None
    assert result.stats.turns == 3 and result.trajectory.model_turns == 3  # its 3 calls, one chain
    with pytest.raises(openai.ConflictError, match="not open"):
        client(f"{served[0]}/agents/0123abcd/v1").chat.completions.create(model="m", messages=QUESTION)


def test_the_plain_endpoint_serves_any_client(served: Any, tokenizer: Any) -> None:
    import openai

    c = client(f"{served[0]}/v1")
    assert [m.id for m in c.models.list().data] == ["smollm2"]
    out = c.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=8, temperature=0, logprobs=True)
    choice = out.choices[0]
    assert choice.finish_reason == "length" and out.usage is not None and out.usage.completion_tokens == 8
    assert choice.logprobs is not None and len(choice.logprobs.content or []) == 8
    assert all(t.logprob <= 0 for t in choice.logprobs.content or [])
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{served[0]}/v1", api_key="wrong", max_retries=0).models.list()


class Scripted:
    """Stands in for the engine loop: answers every turn with `text`'s tokens (the template stays real)."""

    def __init__(self, tokenizer: Any, text: str) -> None:
        self.tok, self.text = tokenizer, text

    def submit(self, turn: Turn, options: SamplingOptions) -> Future[tuple[Completion, int | None]]:
        ids = self.tok(self.text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        fut: Future[tuple[Completion, int | None]] = Future()
        fut.set_result((Completion(prompt_index=0, sample_index=0, prompt_token_ids=turn.prompt_ids, token_ids=ids,
                                   logprobs=[-0.5] * len(ids), text=self.text, finish_reason="stop"), 3))
        return fut


def test_tool_calls_come_back_in_openai_format(tokenizer: Any) -> None:
    from tandem.sidecars.rollout.openai_api import ChatRequest

    text = 'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "617 * 2"}}\n</tool_call>'
    recorder = Recorder(max_calls=2, max_turn_tokens=64, max_total_tokens=512)
    chat = Chat(Scripted(tokenizer, text), tokenizer, recorder, model="m")  # type: ignore[arg-type]
    recorder.open("t1", GREEDY, 60)
    out = chat.complete(ChatRequest(messages=QUESTION, tools=TOOLS), "t1")
    [choice] = out["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Let me compute."
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "calculator"
    assert json.loads(call["function"]["arguments"]) == {"expression": "617 * 2"}
    assert out["system_fingerprint"] == "version-3"
    # sent back as the agent got it (arguments as a JSON string), the reply is recognised: the call extends
    follow = [*QUESTION, choice["message"], {"role": "tool", "tool_call_id": call["id"], "content": "1234"}]
    chat.complete(ChatRequest(messages=follow, tools=TOOLS), "t1")
    record = recorder.close("t1")
    assert len(record.chains) == 1 and record.tool_calls == 2 and record.calls == 2
    assert [s.model for s in record.chains[0].segments] == [True, False, True]
