"""Partial rollouts (`rollout.partial`): completions cut at a per-iteration token budget, carried
over, and continued under newer weights.

Role: the driver's rollout phase when the job sets `rollout.partial` (Kimi k1.5's partial rollouts).
Each iteration draws `promptsPerIteration` new prompts (groupSize requests each) and continues
every completion carried from earlier iterations; a request generates at most `tokenBudget` tokens
(never beyond `rollout.maxTokens` in all). A completion cut at the budget keeps its tokens, the
log-prob that sampled each token, and one `Segment` (weight version, token count) per iteration it
took part in; it is continued from `prompt + tokens so far` as a token prompt (vLLM's prefix cache
serves the prefix while the version is unchanged). A group trains once all of its completions are
finished (GRPO's baseline needs the whole group); a carried group whose first segment is more than
`maxAge` versions old is dropped and its tokens counted as wasted. When no group finished in a
round, the iteration generates another round under the same weights, so every iteration trains.

The per-token behaviour log-probs (`Sample.rollout_logprobs`, from whichever version sampled each
token) feed the algorithm's importance weights (`algorithm.tisCap`/`tisMode`). Caller:
`tandem.sidecars.trainer.loop.phases.generate.rollout`. The carried groups live in the driver's memory; what a
restart does with them is `inflight()`'s (see `tandem.sidecars.trainer.loop.recovery.inflight`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tandem.sidecars.rollout_engine.sampling import Completion, RoutedExperts
from tandem.sidecars.trainer.loop.data.dataset import Prompt

# (prompt inputs, max_tokens per input) -> (one completion per input, the version that generated them)
Generate = Callable[[list[str | list[int]], list[int]], tuple[list[Completion], int]]


@dataclass
class Segment:
    version: int  # the weights that sampled these tokens
    tokens: int


@dataclass
class Pending:
    """One completion, possibly spread over several iterations."""

    prompt_ids: list[int] = field(default_factory=list)  # the prompt as vLLM tokenized it (first segment)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # behaviour log-prob of each token
    segments: list[Segment] = field(default_factory=list)
    text: str = ""  # vLLM's text, while the completion has a single segment
    finish_reason: str | None = None
    done: bool = False
    mask: list[int] | None = None  # multi-turn: 1 on the model's tokens, 0 on the environment's
    turns: dict[str, float] | None = None  # multi-turn: turns, tool_calls, tool_errors, tool_seconds, tool_results
    env_reward: float | None = None  # multi-turn: the environment's own reward (the `environment` reward)
    pictures: tuple[Any, ...] = ()  # multi-turn: the pictures the environment answered with (PIL), in order
    # routing replay: the last segment's routed experts, which cover the prompt and every earlier segment (each
    # continuation's prompt is the prompt plus the tokens so far, routed anew by the weights that continue it)
    routed_experts: RoutedExperts | None = None

    def versions(self) -> list[int]:
        """The version that sampled each token."""
        return [s.version for s in self.segments for _ in range(s.tokens)]


@dataclass
class Group:
    prompt: Prompt
    members: list[Pending]
    born: int  # the version of its first segment

    @property
    def done(self) -> bool:
        return all(m.done for m in self.members)

    @property
    def tokens(self) -> int:
        return sum(len(m.token_ids) for m in self.members)


@dataclass
class Round:
    """What one iteration's partial rollout gives the driver."""

    finished: list[Group]
    stats: dict[str, Any]


class PartialRollouts:
    def __init__(self, *, token_budget: int, max_tokens: int, max_age: int, group_size: int):
        if not 0 < token_budget < max_tokens:
            raise ValueError(f"token_budget {token_budget} must be in (0, max_tokens={max_tokens})")
        self.token_budget, self.max_tokens, self.max_age, self.group_size = (token_budget, max_tokens,
                                                                              max_age, group_size)
        self.carried: list[Group] = []

    def inflight(self) -> list[int]:
        """Dataset indexes of the prompts whose groups are carried (unfinished)."""
        return [g.prompt.index for g in self.carried]

    def step(self, generate: Generate, new_prompts: Sequence[Prompt], version: int, *,
             until_finished: bool = True, max_rounds: int = 1000) -> Round:
        """Drop the groups too old for `version`, add `new_prompts`, generate one budget's worth for
        every unfinished completion (with `until_finished`, again while no group finished), and return
        the finished groups."""
        kept = [g for g in self.carried if version - g.born <= self.max_age]
        dropped = [g for g in self.carried if version - g.born > self.max_age]
        carried_in = sum(1 for g in kept for m in g.members if not m.done)
        groups = kept + [Group(p, [Pending() for _ in range(self.group_size)], born=version) for p in new_prompts]
        finished: list[Group] = []
        rounds = 0
        while not finished and any(not g.done for g in groups):
            if rounds == max_rounds:
                raise RuntimeError(f"partial rollout: no group finished in {max_rounds} rounds")
            self._round(generate, groups, version)
            rounds += 1
            finished = [g for g in groups if g.done]
            if not until_finished:
                break
        self.carried = [g for g in groups if not g.done]
        return Round(finished, self._stats(finished, dropped, carried_in, rounds, version))

    def _round(self, generate: Generate, groups: list[Group], version: int) -> None:
        todo = [(g, m) for g in groups for m in g.members if not m.done]
        inputs: list[str | list[int]] = [
            (m.prompt_ids + m.token_ids) if m.segments else g.prompt.model_input for g, m in todo]
        limits = [min(self.token_budget, self.max_tokens - len(m.token_ids)) for _, m in todo]
        completions, got = generate(inputs, limits)
        if len(completions) != len(todo):
            raise RuntimeError(f"partial rollout: {len(completions)} completions for {len(todo)} requests")
        if got != version:
            raise RuntimeError(f"partial rollout: rollouts generated with version {got}, expected {version}")
        for (_, m), c, limit in zip(todo, completions, limits, strict=True):
            if not m.segments:
                m.prompt_ids = list(c.prompt_token_ids)
            ids = list(c.token_ids)
            lps = list(c.logprobs) if len(c.logprobs) == len(ids) else [float("nan")] * len(ids)
            m.token_ids += ids
            m.logprobs += lps
            m.segments.append(Segment(version, len(ids)))
            m.text = c.text if len(m.segments) == 1 else ""
            m.finish_reason = c.finish_reason
            m.routed_experts = c.routed_experts
            cut = c.finish_reason == "length" and len(ids) >= limit
            m.done = not cut or len(m.token_ids) >= self.max_tokens

    def _stats(self, finished: list[Group], dropped: list[Group], carried_in: int, rounds: int,
               version: int) -> dict[str, Any]:
        return {
            "partial_rounds": rounds,
            "carried_in": carried_in,  # unfinished completions continued this iteration
            "carried_out": sum(1 for g in self.carried for m in g.members if not m.done),
            "carried_groups": len(self.carried),
            "dropped_completions": sum(len(g.members) for g in dropped),
            "wasted_tokens": sum(g.tokens for g in dropped),
        }


def staleness_stats(groups: Sequence[Group], version: int) -> dict[str, Any]:
    """Of the completions about to train on weights `version`: how many versions old each one's
    oldest segment is (a histogram), and the share carried over from an earlier iteration."""
    trained = [m for g in groups for m in g.members]
    ages = Counter(version - min((s.version for s in m.segments), default=version) for m in trained)
    return {
        "staleness_hist": {str(k): ages[k] for k in sorted(ages)},
        "staleness_mean": sum(k * n for k, n in ages.items()) / max(len(trained), 1),
        "staleness_max": max(ages, default=0),
        "carried_share": sum(1 for m in trained if len(m.segments) > 1) / max(len(trained), 1),
    }


def whole_groups(prompts: Sequence[Prompt], groups: Sequence[Sequence[Completion]], version: int) -> list[Group]:
    """Completions generated in one piece (the synchronous and asynchronous loops) as finished groups."""
    out = []
    for prompt, group in zip(prompts, groups, strict=True):
        members = [Pending(list(c.prompt_token_ids), list(c.token_ids), list(c.logprobs),
                           [Segment(version, len(c.token_ids))], c.text, c.finish_reason, done=True,
                           routed_experts=c.routed_experts) for c in group]
        out.append(Group(prompt, members, born=version))
    return out
