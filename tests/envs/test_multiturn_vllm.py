"""Multi-turn trajectories on a real vLLM (SmolLM2-135M-Instruct, fp32 on CPU) through the driver.

A scripted two-turn trajectory (a tool result after the first reply, done after the second) has exactly the
token ids the chat template gives for its messages between the model's turns, the model's ids as sampled
(each turn ending with the template's end of turn), the loss mask on the model's tokens only, and the
rollout's log-probs equal to transformers' log-probs of the same ids in one forward over the whole
trajectory. Trajectories do not wait for each other: one whose tool blocks until every other trajectory has
finished still completes (lock-step turns would deadlock it). Limits end trajectories as they say.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from tandem.sidecars.envs.environments import Message, Step, TurnStats
from tandem.sidecars.envs.multi_turn import TRUNCATED, Limits, MultiTurnDriver
from tandem.sidecars.envs.tools import Tool, calculator
from tandem.sidecars.rollout_engine.sampling import SamplingOptions

pytestmark = [pytest.mark.vllm]
GREEDY = SamplingOptions(temperature=0.0, max_tokens=160)
TOOL_MESSAGE = {"role": "tool", "name": "calculator", "content": "1234"}
QUESTION = [{"role": "user", "content": "What is 617 * 2? Use the calculator tool."}]


class Scripted:
    """Answers each reply with the next step of a script (the model's text is not read)."""

    def __init__(self, script: list[Step], gate: threading.Event | None = None) -> None:
        self.script, self.gate, self.stats, self.at = script, gate, TurnStats(), 0

    def tools(self) -> list[dict[str, Any]]:
        return [Tool.of(calculator).schema]

    def reset(self, row: Mapping[str, Any], messages: list[Message]) -> list[Message]:
        self.stats, self.at = TurnStats(), 0
        return list(messages)

    def step(self, reply: str) -> Step:
        if self.gate is not None and self.at == 0:
            assert self.gate.wait(timeout=600), "the other trajectories never finished: turns ran in lock-step"
        self.stats.turns += 1
        step = self.script[min(self.at, len(self.script) - 1)]
        self.at += 1
        return step


def two_turns(reward: float = 1.0, first: float | None = None) -> list[Step]:
    return [Step([dict(TOOL_MESSAGE)], done=False, reward=first), Step([], done=True, reward=reward)]


def test_a_scripted_two_turn_trajectory_is_exactly_its_tokens(engine: Any, tokenizer: Any, smollm2: Path) -> None:
    from transformers import AutoModelForCausalLM

    driver = MultiTurnDriver(engine, tokenizer, lambda: Scripted(two_turns(1.0, first=0.25)),
                             Limits(max_turn_tokens=160))
    try:
        [[result]] = driver.run([{}], [QUESTION], 1, GREEDY, version=7)
    finally:
        driver.close()
    traj, renderer = result.trajectory, driver.renderer([Tool.of(calculator).schema])
    assert result.finish == "answer" and result.stats.turns == 2
    assert result.turn_rewards == [0.25, 1.0] and result.reward == 1.25  # per-turn rewards add up
    assert [s.model for s in traj.segments] == [True, False, True]
    assert traj.prompt_ids == renderer.prompt_ids(QUESTION)
    first, env, second = traj.segments
    assert env.ids == renderer.continuation_ids([TOOL_MESSAGE])  # the template's own tokens for the tool turn
    assert first.ids[-1] == second.ids[-1] == renderer.end_of_turn
    assert traj.expanded(None).mask == [1] * len(first.ids) + [0] * len(env.ids) + [1] * len(second.ids)
    assert traj.versions == [7] * len(first.ids) + [None] * len(env.ids) + [7] * len(second.ids)
    assert traj.turn_starts == [0, len(first.ids) + len(env.ids)]
    # transformers' log-probs of the same ids, one forward over the whole trajectory
    ids = traj.prompt_ids + traj.completion_ids
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    start = len(traj.prompt_ids)
    targets = torch.tensor(traj.completion_ids)
    theirs = logp[start - 1:-1].gather(1, targets[:, None]).squeeze(1)
    mask = torch.tensor(traj.expanded(None).mask, dtype=torch.bool)
    ours = torch.tensor(traj.expanded(None).logprobs)
    assert (theirs[mask] - ours[mask]).abs().max().item() < 2e-3
    assert torch.all(ours[~mask] == 0)
    assert logp[start - 1:-1].argmax(-1)[mask].tolist() == targets[mask].tolist()  # greedy, every model token


def test_trajectories_do_not_wait_for_each_others_tools(engine: Any, tokenizer: Any) -> None:
    """One trajectory's tool blocks until the 5 others have ended (for any reason): lock-step turns would
    deadlock it (its gate then times out and fails the run)."""
    others_done = threading.Event()
    finished: list[int] = []
    lock = threading.Lock()
    gated = Scripted(two_turns(), gate=others_done)

    class Counting(MultiTurnDriver):
        def _advance(self, state: Any, turn: Any, completion: Any, version: int) -> list[Any]:
            following = super()._advance(state, turn, completion, version)
            if not following and state.env is not gated:
                with lock:
                    finished.append(1)
                    if len(finished) == 5:
                        others_done.set()
            return following

    made = iter([gated] + [Scripted(two_turns()) for _ in range(5)])
    driver = Counting(engine, tokenizer, lambda: next(made), Limits(max_turn_tokens=160), workers=4)
    try:  # greedy: every trajectory is the first test's, whose turns end well within the limit
        results = driver.run([{}, {}, {}], [QUESTION] * 3, 2, GREEDY, version=1)
    finally:
        driver.close()
    assert others_done.is_set() and gated.at >= 1  # the gated trajectory reached its tool and went on
    assert len([r for row in results for r in row]) == 6


def test_limits_end_trajectories(engine: Any, tokenizer: Any) -> None:
    never_done = [Step([dict(TOOL_MESSAGE)], done=False)]
    driver = MultiTurnDriver(engine, tokenizer, lambda: Scripted(never_done), Limits(max_turns=2, max_turn_tokens=160))
    try:
        [[capped]] = driver.run([{}], [QUESTION], 1, GREEDY, version=1)
        driver.limits = Limits(max_turn_tokens=4)
        [[cut]] = driver.run([{}], [QUESTION], 1, GREEDY, version=1)
        driver.limits = Limits(max_turn_tokens=160, max_total_tokens=40)
        [[broke]] = driver.run([{}], [QUESTION], 1, GREEDY, version=1)
    finally:
        driver.close()
    assert capped.finish == "max_turns" and capped.trajectory.model_turns == 2
    assert cut.finish == "length" and len(cut.trajectory.completion_ids) == 4
    assert broke.finish in ("budget", "length") and len(broke.trajectory.completion_ids) <= 40


def test_long_tool_output_is_cut_to_its_token_limit(tokenizer: Any) -> None:
    driver = MultiTurnDriver(None, tokenizer, lambda: Scripted([]), Limits(max_tool_output_tokens=8))
    long = {"role": "tool", "name": "calculator", "content": " ".join(str(i) for i in range(200))}
    cut = driver.capped(long)
    assert cut["content"].endswith(TRUNCATED)
    kept = cut["content"].removesuffix(TRUNCATED)
    assert len(tokenizer(kept, add_special_tokens=False)["input_ids"]) <= 8
    assert driver.capped({"role": "tool", "content": "7"}) == {"role": "tool", "content": "7"}
    driver.close()
